"""Entry point: `python -m experiments.figures figure=<name>|all` (see experiments/figures/app.py)."""
from experiments.figures.app import main

if __name__ == "__main__":
    main()
