"""Bad input — paths from config values: names are validated identifiers, every write stays under the run dir
or the documented cache dir, and only the known model packages can be looked up (nothing is imported)."""
from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from experiments.common import ConfigError, safe_path
from quant.arch import check_name, smollm2_spec
from quant.gguf_model import gguf_path
from tests.badinput.helpers import accept, reject


@pytest.mark.parametrize("value", ["../escape", "/tmp/abs", "a/b", "..", ".hidden", "", "x" * 97, "a b", "x/../../y"])
def test_names_that_become_paths_are_identifiers(value):
    with pytest.raises(ValueError, match="model.name"):
        check_name(value, "model.name")


def test_good_names_pass():
    for v in ("smollm2_135m", "qwen1_5_moe_a2_7b", "a.b-c", "X9"):
        assert check_name(v, "k") == v


def test_quantize_model_name_cannot_escape_the_run_dir(capsys):
    reject(capsys, "quantize", ["pack=true", "model.name=../escape"], "model.name")
    reject(capsys, "quantize", ["model.name=/tmp/anywhere"], "model.name")
    reject(capsys, "quantize", ["model.gguf_file=../../../etc/passwd"], "model.gguf_file")


def test_sweep_job_dirs_stay_in_the_sweep_dir(capsys):
    reject(capsys, "coldstart", ["-m", "framework.name=ok,x/../../y"], "framework.name")
    reject(capsys, "coldstart", ["model.name=../../m"], "model.name")


def test_only_known_model_packages_and_nothing_imported(capsys):
    sys.modules.pop("this", None)
    reject(capsys, "quantize", ["model.gguf_package=this.x"], "model.gguf_package")
    reject(capsys, "quantize", ["model.gguf_package=os"], "model.gguf_package")
    assert "this" not in sys.modules                                   # `import this` never ran
    with pytest.raises(ValueError, match="not a model package"):
        gguf_path(replace(smollm2_spec(), gguf_package="json"))


def test_safe_path_keeps_writes_under_the_root(tmp_path):
    assert safe_path(tmp_path, "a", "b.json") == (tmp_path / "a" / "b.json").resolve()
    for parts in (("..", "x"), ("/etc/passwd",), ("a", "..", "..", "x")):
        with pytest.raises(ConfigError, match="outside"):
            safe_path(tmp_path, *parts, key="out")
    (tmp_path / "link").symlink_to("/tmp")
    with pytest.raises(ConfigError, match="outside"):
        safe_path(tmp_path, "link", "x", key="out")


def test_twin_cache_file_stays_in_the_cache_dir():
    from planner import formats
    from quant.arch import model_spec

    spec = model_spec("llama3_8b")
    p = formats._cache_key(spec, 5.0, 0)
    assert p is not None and p.parent == formats.CACHE_DIR and spec.name in p.name
    bad = replace(spec)
    object.__setattr__(bad, "name", "../../../escape")                 # bypassing the schema check
    assert formats._cache_key(bad, 5.0, 0) is None                     # not cached rather than written elsewhere


def test_valid_inputs_still_pass(capsys):
    accept(capsys, "coldstart", ["framework=mnn", "prompt_tokens=64"])
