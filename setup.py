"""Build hook: compiles the native C kernels (native/src/*.c) into one shared library, `native/_efkernels*.so`.

`pip install -e .` / `pip install .` run this; nobody runs a compiler by hand. The library is loaded with ctypes by
`native/__init__.py` (no Python C API, no NumPy headers at build time). x86 SIMD variants use per-function
`__attribute__((target(...)))` and runtime dispatch, so the library is built for the baseline ISA (no -march=native)
and still runs on any x86-64 CPU; on aarch64 the NEON variants are compiled in.
"""
import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildCLib(build_ext):
    """Build the extension as a plain C shared library (no PyInit_ export needed: it is loaded with ctypes)."""

    def get_export_symbols(self, ext):
        return []


HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "native", "src", "*.c")))

setup(
    ext_modules=[
        Extension(
            "native._efkernels",
            sources=SOURCES,
            include_dirs=["native/src"],
            depends=sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "native", "src", "*.h"))),
            extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing", "-Wall"],
        )
    ],
    cmdclass={"build_ext": BuildCLib},
)
