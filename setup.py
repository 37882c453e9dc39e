"""Build hook: compiles the native C kernels (native/src/*.c) into one shared library, `native/_efkernels*.so`, and the
simulator's hot modules into extension modules with Cython.

`pip install -e .` / `pip install .` run this; nobody runs a compiler by hand. The library is loaded with ctypes by
`native/__init__.py` (no Python C API, no NumPy headers at build time). x86 SIMD variants use per-function
`__attribute__((target(...)))` and runtime dispatch, so the library is built for the baseline ISA (no -march=native)
and still runs on any x86-64 CPU; on aarch64 the NEON variants are compiled in.

Compiled modules: every `<module>.py` of `COMPILED_PACKAGES` with an augmenting `<module>.pxd` beside it (the C
declarations; the .py stays the one source and runs as is uncompiled). Their float arithmetic must stay bit-identical
to the interpreter's, so they are built without contracting a*b+c into fused multiply-adds (GCC's default in GNU mode
where the baseline ISA has FMA, e.g. aarch64) and without fast-math. The build records the SHA-256 of each module's
sources in its package's `_compiled.json`; `planner.use_compiled` runs the .py sources instead when they changed since
(docs/coldstart.md "Benchmarks"). Without Cython the build goes on without them.
"""
import glob
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from planner import MANIFEST, source_hashes  # noqa: E402  (the hashes the import hook checks, computed alike)

COMPILED_PACKAGES = ("sim", "planner/pipeline")
CYTHON_CFLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]
CYTHON_DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,     # the .py annotations document; only the .pxd declares C types
}


def _compiled_modules() -> dict[str, list[str]]:
    """package directory -> the modules compiled there (those with a .pxd)."""
    out = {}
    for pkg in COMPILED_PACKAGES:
        pxds = sorted(glob.glob(os.path.join(HERE, pkg, "*.pxd")))
        out[pkg] = [os.path.basename(p)[:-4] for p in pxds if os.path.exists(p[:-4] + ".py")]
    return out


def _cython_extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("WARNING: Cython is not installed: the simulator runs its Python sources (slower)", file=sys.stderr)
        return []
    exts = [Extension(f"{pkg.replace('/', '.')}.{m}", [f"{pkg}/{m}.py"], extra_compile_args=CYTHON_CFLAGS)
            for pkg, mods in _compiled_modules().items() for m in mods]
    return cythonize(exts, compiler_directives=CYTHON_DIRECTIVES, build_dir="build/cython", include_path=[HERE],
                     quiet=True)


class BuildExt(build_ext):
    """The kernels as a plain C shared library (no PyInit_ export: loaded with ctypes); the Cython modules as usual,
    with the hashes of their sources recorded beside them."""

    def get_export_symbols(self, ext):
        return [] if ext.name == "native._efkernels" else super().get_export_symbols(ext)

    def run(self):
        super().run()
        built = {ext.name for ext in self.extensions}
        for pkg, mods in _compiled_modules().items():
            dotted = pkg.replace("/", ".")
            doc = {m: source_hashes(Path(HERE, pkg), m) for m in mods if f"{dotted}.{m}" in built}
            if not doc:
                continue
            dests = {os.path.join(self.build_lib, pkg)}
            if self.inplace:
                dests.add(os.path.join(HERE, pkg))
            for d in dests:
                os.makedirs(d, exist_ok=True)
                tmp = os.path.join(d, MANIFEST + ".tmp")
                with open(tmp, "w") as f:
                    json.dump(doc, f, indent=1, sort_keys=True)
                os.replace(tmp, os.path.join(d, MANIFEST))


SOURCES = sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "native", "src", "*.c")))

setup(
    ext_modules=[
        Extension(
            "native._efkernels",
            sources=SOURCES,
            include_dirs=["native/src"],
            depends=sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, "native", "src", "*.h"))),
            extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing", "-Wall"],
        ),
        *_cython_extensions(),
    ],
    package_data={"sim": ["*.pxd"], "planner.pipeline": ["*.pxd"]},
    cmdclass={"build_ext": BuildExt},
)
