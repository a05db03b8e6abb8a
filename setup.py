"""Build hook: compiles kernels/*.cu into one fatbin and kernels/cpu/*.c into one shared
library (libreflex_cpu.so), both shipped in the package.

Everything else is declared in pyproject.toml. The kernel builds live in
kernels/build.py and kernels/cpu/build.py so they can also be run by hand.
"""
import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, *path):
    # by path: a plain `import build` would find PyPA's `build`
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, *path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildWithKernels(build_py):
    def run(self):
        out = os.path.join(HERE, "reflex_ipc", "kernels")
        _load("reflex_kernel_build", "kernels", "build.py").build(out)
        _load("reflex_cpu_kernel_build", "kernels", "cpu", "build.py").build(out)
        super().run()


class PlatformDistribution(Distribution):
    """The wheel holds a compiled library (libreflex_cpu.so): tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithKernels}, distclass=PlatformDistribution)
