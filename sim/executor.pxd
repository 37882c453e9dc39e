# Compiled declarations of sim/executor.py (Cython's augmenting .pxd; setup.py builds it, docs/coldstart.md
# "Benchmarks"). The .py stays the one source and runs as is uncompiled.
