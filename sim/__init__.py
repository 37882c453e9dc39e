"""The cold-start simulator. Its hot modules (those with a .pxd) run compiled where setup.py built them and they match
their sources (`planner.use_compiled`; docs/coldstart.md "Benchmarks")."""
import os

from planner import use_compiled

COMPILED = use_compiled(__name__, os.path.dirname(os.path.abspath(__file__)))
