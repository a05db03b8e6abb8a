"""Build hook: compiles kernels/*.cu into one fatbin shipped in the package.

Everything else is declared in pyproject.toml. The kernel build lives in
kernels/build.py so it can also be run by hand.
"""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithKernels(build_py):
    def run(self):
        sys.path.insert(0, os.path.join(HERE, "kernels"))
        try:
            import build as kernel_build  # kernels/build.py
        finally:
            sys.path.pop(0)
        kernel_build.build(os.path.join(HERE, "reflex_ipc", "kernels"))
        super().run()


setup(cmdclass={"build_py": BuildWithKernels})
