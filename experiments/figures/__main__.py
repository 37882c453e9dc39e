"""Entry point: `python -m experiments.figures figure=<name>|all` (see experiments/figures/app.py)."""
import sys

from experiments.common import precheck
from experiments.figures.app import main, validate

if __name__ == "__main__":
    precheck("figures", sys.argv[1:], validate)
    main()
