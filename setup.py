"""Build hook: compiles kernels/*.cu into one fatbin shipped in the package.

Everything else is declared in pyproject.toml. The kernel build lives in
kernels/build.py so it can also be run by hand.
"""
import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithKernels(build_py):
    def run(self):
        # load kernels/build.py by path: a plain `import build` would find PyPA's `build`
        spec = importlib.util.spec_from_file_location(
            "reflex_kernel_build", os.path.join(HERE, "kernels", "build.py"))
        kernel_build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernel_build)
        kernel_build.build(os.path.join(HERE, "reflex_ipc", "kernels"))
        super().run()


setup(cmdclass={"build_py": BuildWithKernels})
