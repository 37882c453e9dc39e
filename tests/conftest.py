"""Shared fixtures: the repo's conf/ directory composed with Hydra's compose API (as the apps see it)."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"


@pytest.fixture
def compose():
    """compose(config_name, overrides) -> DictConfig using the real conf/ tree."""
    from hydra import compose as _compose
    from hydra import initialize_config_dir

    from experiments.common import register_common

    register_common()

    def _c(config_name: str | None = None, overrides: list[str] | None = None):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return _compose(config_name=config_name, overrides=overrides or [])

    return _c
