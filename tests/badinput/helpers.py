"""Run an app's pre-check in-process: exit 2 and exactly one stderr line `error: <key>: ...`."""
from __future__ import annotations

import importlib

import pytest

from experiments.common import precheck


def reject(capsys, app: str, argv: list[str], key: str) -> str:
    mod = importlib.import_module(f"experiments.{app}")
    with pytest.raises(SystemExit) as ei:
        precheck(app, argv, mod.validate, getattr(mod, "GROUPS", None))
    err = capsys.readouterr().err
    assert ei.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: {key}: "), (argv, err)
    return err


def accept(capsys, app: str, argv: list[str]) -> str:
    mod = importlib.import_module(f"experiments.{app}")
    assert precheck(app, argv, mod.validate, getattr(mod, "GROUPS", None)) >= 1
    return capsys.readouterr().err
