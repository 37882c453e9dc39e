"""Phones over adb: measured layer profiles of an Android phone, the input of the Voltron planner's latency regression
(Voltron §4.2.1: a regression on "device type, layer type, precision, input token length and the number of tokens
accumulated in the KV cache", fitted on profiling runs; docs/cluster.md "Phones over adb").

Owns:
- `build_runner`: compiles the standalone profiling runner `native/runner/ef_profile.c` with the native kernels, for
  this host or statically for aarch64 (the Makefile targets `runner` / `runner-aarch64` run the same compiler line).
- The runner's input (`variant_lines`: one `key=value` line per layer variant) and output (`parse_records`: one JSON
  object per variant with seconds per call, min / median, window start / end and two checksums).
- Two backends with one push / run / pull protocol: `AdbPhone` (adbutils, files under /data/local/tmp) and
  `LocalAarch64` (the same static aarch64 binary under `qemu-aarch64`, files in a local directory: the test double
  of a phone, so the whole path runs in tests without one).
- `attached`: serials of the attached phones, or the one line that says why there are none.
- `profile_phone`: push the runner and the variant file, run, pull the output → `PhoneRun`: a
  `planner.voltron.latency.Profile` with the planner's features built exactly as `hil.cluster.profiler.
  profile_cluster` builds them (same `sample_variants`, same `feature_row`), the runs as `planner.timeline.Span`s
  for a trace, and the raw records.
- `compare_records`: the cross-build check — integer-path checksums equal, float-path checksums within FLOAT_RTOL.
- CLI: `python -m hil.adb` lists phones (or prints the one line); `python -m hil.adb profile …` profiles one.

No weights are pushed: the runner draws random weights of each variant's shard shape at its precision (a layer's time
depends on its shape and precision, not on the values). Only layer profiling runs on a phone; executing Voltron plans
on phones is not built. Every time here is measured — on the phone, or under qemu on this host, where it is the speed
of emulated instructions and says nothing about a phone.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from hil.cluster.profiler import KINDS, load_spec, sample_variants
from planner.timeline import Span
from planner.voltron.latency import Profile, feature_row
from planner.voltron.layers import FFN_DENSE, HEAD, LayerTable, layer_table

ROOT = Path(__file__).resolve().parents[1]
RUNNER_C = ROOT / "native" / "runner" / "ef_profile.c"
AARCH64_BINARY = ROOT / "build" / "ef_profile-aarch64"      # `make runner-aarch64`
REMOTE_DIR = "/data/local/tmp/edgellm"                       # world-writable and executable on Android
CROSS_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
CFLAGS = ["-O3", "-std=c11", "-fno-strict-aliasing", "-Wall"]
FLOAT_RTOL = 1e-4        # relative tolerance of the float-path checksum `out_abs` between builds / ISAs (measured
                         # differences host AVX-512 vs qemu NEON: <= 2e-7; docs/cluster.md "Phones over adb")
EMULATED = "use the emulated cluster: python -m experiments.calibrate cluster=office_emu (docs/cluster.md)"
RECORD_KEYS = ("id", "kind", "precision", "n_tokens", "kv_len", "n_held", "isa", "calls", "time_s", "min_s",
               "median_s", "window_s", "t0_s", "t1_s", "ck_int", "out_abs")


# ---- building the runner -------------------------------------------------------------------------------------------
def runner_sources() -> list[str]:
    return [*sorted(str(p) for p in (ROOT / "native" / "src").glob("*.c")), str(RUNNER_C)]


def build_runner(dest: str | os.PathLike, target: str = "host", cc: str | None = None, timeout_s: float = 300) -> Path:
    """Compile ef_profile to `dest`: target "host" (cc or $CC or gcc) or "aarch64" (static; cc or
    aarch64-linux-gnu-gcc, or an Android NDK clang). Raises RuntimeError with the compiler's last lines."""
    if target not in ("host", "aarch64"):
        raise ValueError(f"target: {target!r} is not host or aarch64")
    cc = cc or (os.environ.get("CC", "gcc") if target == "host" else CROSS_CC)
    if shutil.which(cc) is None:
        raise RuntimeError(f"cc: {cc} not found" + (" (Debian: apt-get install gcc-aarch64-linux-gnu, or "
                                                    "`make cross-tools`)" if target == "aarch64" else ""))
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cc, *CFLAGS, "-I", str(ROOT / "native" / "src"), *(["-static"] if target == "aarch64" else []),
           *runner_sources(), "-lm", "-o", str(dest)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"building {dest.name} failed: {r.stderr[-2000:]}")
    return dest


# ---- variant file and records --------------------------------------------------------------------------------------
def variant_lines(table: LayerTable, variants: list[tuple]) -> str:
    """The runner's input for `sample_variants` tuples (device, precision, phase, type, n_tokens, kv_len, n_held):
    one line per variant with the model shape (line i has id=i)."""
    sp = table.spec
    shape = (f"d_model={sp.d_model} n_heads={sp.n_heads} n_kv_heads={sp.n_kv_heads} head_dim={sp.head_dim} "
             f"ffn_dim={sp.d_ffn} ffn_shards={int(table.shards[FFN_DENSE])} vocab={sp.vocab} "
             f"rope_base={sp.rope_base!r} norm_eps={sp.norm_eps!r}")
    lines = [f"# {sp.name}: kind precision n_tokens kv_len n_held + shape (native/runner/ef_profile.c)"]
    for i, (_, p, _, t, n, kv, held) in enumerate(variants):
        lines.append(f"id={i} kind={KINDS[int(t)]} precision={int(p)} n_tokens={int(n)} kv_len={int(kv)} "
                     f"n_held={int(held)} {shape}")
    return "\n".join(lines) + "\n"


def parse_records(text: str, source: str = "runner output") -> list[dict]:
    """The runner's JSON lines → dicts with RECORD_KEYS; one-line ValueError naming the line otherwise."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}:{i}: not JSON ({e.msg})") from None
        missing = [k for k in RECORD_KEYS if k not in rec]
        if missing:
            raise ValueError(f"{source}:{i}: missing {', '.join(missing)}")
        out.append(rec)
    return out


def compare_records(a: list[dict], b: list[dict], rtol: float = FLOAT_RTOL) -> list[str]:
    """Problems between two runs of the same variant file on two builds (empty: they agree): integer checksums must
    be equal, float checksums within `rtol`."""
    if len(a) != len(b):
        return [f"{len(a)} records vs {len(b)}"]
    bad = []
    for x, y in zip(a, b):
        if x["ck_int"] != y["ck_int"]:
            bad.append(f"variant {x['id']}: ck_int {x['ck_int']} != {y['ck_int']}")
        if not np.isclose(x["out_abs"], y["out_abs"], rtol=rtol, atol=0.0):
            bad.append(f"variant {x['id']}: out_abs {x['out_abs']} vs {y['out_abs']} (rtol {rtol})")
    return bad


# ---- backends: one push / run / pull protocol ----------------------------------------------------------------------
class AdbPhone:
    """A phone over adb (adbutils, imported lazily: `pip install 'edgellm[phone]'`)."""

    def __init__(self, serial: str, workdir: str = REMOTE_DIR):
        adbutils = _adbutils()
        host, port = _server_address()
        self.device = adbutils.AdbClient(host=host, port=port).device(serial)
        self.name, self.workdir = f"phone:{serial}", workdir
        self.device.shell2(f"mkdir -p {shlex.quote(workdir)}")

    def push(self, local: Path, remote: str) -> None:
        self.device.sync.push(str(local), remote, mode=0o755)

    def run(self, args: list[str], timeout_s: float) -> tuple[int, str]:
        cmd = f"cd {shlex.quote(self.workdir)} && " + " ".join(shlex.quote(a) for a in args) + " 2>&1"
        r = self.device.shell2(cmd, timeout=timeout_s)
        return int(r.returncode), str(r.output)

    def pull(self, remote: str, local: Path) -> None:
        self.device.sync.pull(remote, str(local))


class LocalAarch64:
    """The test double of a phone: the same static aarch64 binary under qemu-aarch64, the phone's directory
    `workdir` mapped to `root / workdir` on this host."""

    def __init__(self, root: str | os.PathLike, qemu: str = QEMU, workdir: str = REMOTE_DIR):
        if shutil.which(qemu) is None:
            raise RuntimeError(f"qemu: {qemu} not found (Debian: apt-get install qemu-user, or `make cross-tools`)")
        self.root, self.qemu, self.workdir, self.name = Path(root), qemu, workdir, "qemu-aarch64"
        self._local(workdir).mkdir(parents=True, exist_ok=True)

    def _local(self, remote: str) -> Path:
        return self.root / remote.lstrip("/")

    def push(self, local: Path, remote: str) -> None:
        dst = self._local(remote)
        shutil.copyfile(local, dst)
        dst.chmod(0o755)

    def run(self, args: list[str], timeout_s: float) -> tuple[int, str]:
        exe = str(self._local(f"{self.workdir}/{args[0].removeprefix('./')}"))
        r = subprocess.run([self.qemu, exe, *args[1:]], cwd=self._local(self.workdir), capture_output=True,
                           text=True, timeout=timeout_s)
        return r.returncode, r.stdout + r.stderr

    def pull(self, remote: str, local: Path) -> None:
        shutil.copyfile(self._local(remote), local)


# ---- attached phones -----------------------------------------------------------------------------------------------
def _adbutils():
    try:
        import adbutils
    except ImportError:
        raise RuntimeError("adbutils is not installed: pip install 'edgellm[phone]'") from None
    return adbutils


def _server_address() -> tuple[str, int]:
    """The adb server's address (adb's own variables ANDROID_ADB_SERVER_ADDRESS / _PORT, default 127.0.0.1:5037)."""
    host = os.environ.get("ANDROID_ADB_SERVER_ADDRESS", "127.0.0.1")
    try:
        port = int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))
    except ValueError:
        raise ValueError("ANDROID_ADB_SERVER_PORT: not an integer") from None
    return host, port


def attached() -> tuple[list[str], str]:
    """(serials of phones in state `device`, "" ) or ([], the one line saying why there are none). Never starts an
    adb server (adbutils would): with none running that is the reason given."""
    try:
        adbutils = _adbutils()
    except RuntimeError as e:
        return [], f"no phone attached ({e}): connect a phone with USB debugging on, or {EMULATED}"
    host, port = _server_address()
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return [], (f"no phone attached (no adb server on {host}:{port}: run `adb start-server`): connect a phone "
                    f"with USB debugging on, or {EMULATED}")
    try:
        infos = adbutils.AdbClient(host=host, port=port).list()
    except Exception as e:                   # adbutils raises its own AdbError / AdbTimeout / socket errors
        return [], f"no phone attached (adb server on {host}:{port} failed: {e}): {EMULATED}"
    serials = [i.serial for i in infos if i.state == "device"]
    if serials:
        return serials, ""
    why = "adb devices is empty" if not infos else \
        "adb devices lists only " + ", ".join(f"{i.serial} ({i.state})" for i in infos)
    return [], f"no phone attached ({why}): connect a phone with USB debugging on, or {EMULATED}"


# ---- profiling -----------------------------------------------------------------------------------------------------
@dataclass
class PhoneRun:
    """One profiling run on one device. All times measured (s)."""
    device: str                      # backend name: phone:<serial> | qemu-aarch64
    profile: Profile                 # planner rows (device index 0), features as profile_cluster builds them
    spans: list[Span]                # one per variant: its timing window, s from the runner's start
    records: list[dict]              # the runner's raw records (RECORD_KEYS)
    wall_s: float                    # s: push + run + pull, on this host's clock
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"device": self.device, "measured": True, "wall_s": self.wall_s, "meta": self.meta,
                "records": self.records, "spans": [asdict(s) for s in self.spans],
                "profile": {k: np.asarray(v).tolist() for k, v in asdict(self.profile).items()}}


def profile_rows(table: LayerTable, variants: list[tuple], times: np.ndarray) -> Profile:
    """Profile of `sample_variants` tuples timed `times` (s): the rows `hil.cluster.profiler.profile_cluster`
    builds (fraction of a sublayer = shards held / shards; the LM head whole)."""
    rows = []
    for (d, p, ph, t, n, kv, held), s in zip(variants, times):
        frac = held / float(table.shards[t]) if t != HEAD else 1.0
        rows.append((d, p, ph, t, n, kv, feature_row(table, t, p, n, kv, frac), s))
    cols = list(zip(*rows))
    return Profile(*(np.array(c) for c in cols[:6]), x=np.stack(cols[6]), time_s=np.array(cols[7], dtype=float))


def profile_phone(device, variants: list[tuple], table: LayerTable, binary: str | os.PathLike | None = None,
                  window_s: float = 0.2, min_calls: int = 3, seed: int = 0, isa: str | None = None,
                  timeout_s: float = 1800.0) -> PhoneRun:
    """Push the aarch64 runner and the variant file to `device` (a serial, or a backend: AdbPhone / LocalAarch64),
    run the `sample_variants` tuples (device index 0: the phone is one device of the profile), pull the output.
    `time_s` of a row is seconds per call over a window of at least `window_s` and `min_calls` calls."""
    if not variants:
        raise ValueError("variants: empty")
    if any(int(v[0]) != 0 for v in variants):
        raise ValueError("variants: a phone is device 0 (sample_variants(1, …))")
    binary = Path(binary) if binary is not None else AARCH64_BINARY
    if not binary.is_file():
        raise FileNotFoundError(f"binary: {binary} not found; build it with `make runner-aarch64`")
    backend = AdbPhone(device) if isinstance(device, str) else device
    t_wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgellm-adb-") as tmp:
        vfile, ofile = Path(tmp) / "variants.txt", Path(tmp) / "out.jsonl"
        vfile.write_text(variant_lines(table, variants))
        wd = backend.workdir
        backend.push(binary, f"{wd}/ef_profile")
        backend.push(vfile, f"{wd}/variants.txt")
        args = ["./ef_profile", "--window", repr(float(window_s)), "--calls", str(int(min_calls)), "--seed",
                str(int(seed)), *(["--isa", isa] if isa else []), "variants.txt", "out.jsonl"]
        rc, log = backend.run(args, timeout_s)
        if rc != 0:
            raise RuntimeError(f"{backend.name}: ef_profile exited {rc}: {log.strip()[-500:]}")
        backend.pull(f"{wd}/out.jsonl", ofile)
        records = parse_records(ofile.read_text(), f"{backend.name}:out.jsonl")
    if [r["id"] for r in records] != list(range(len(variants))):
        raise ValueError(f"{backend.name}: out.jsonl holds {len(records)} records for {len(variants)} variants")
    prof = profile_rows(table, variants, np.array([r["time_s"] for r in records]))
    spans = [Span(task=r["id"], resource=backend.name, worker=0, start=r["t0_s"], end=r["t1_s"], unit="cpu")
             for r in records]
    return PhoneRun(backend.name, prof, spans, records, time.perf_counter() - t_wall,
                    {"window_s": window_s, "min_calls": min_calls, "seed": seed, "isa": records[0]["isa"]})


# ---- CLI -----------------------------------------------------------------------------------------------------------
def _profile_cli(a: argparse.Namespace) -> int:
    from quant.atomic import atomic_write_json

    spec = load_spec(a.model)
    table = layer_table(spec, a.ffn_shards)
    variants = sample_variants(1, table, a.points, a.seed, a.n_max, a.kv_max)
    if a.qemu:
        with tempfile.TemporaryDirectory(prefix="edgellm-qemu-phone-") as tmp:
            backend = LocalAarch64(tmp)
            run = profile_phone(backend, variants, table, a.binary, a.window, a.calls, a.seed)
    else:
        serials, why = attached()
        if not serials:
            print(why)
            return 1
        serial = a.serial or serials[0]
        if serial not in serials:
            raise ValueError(f"serial: {serial} is not attached (attached: {', '.join(serials)})")
        backend = AdbPhone(serial)
        run = profile_phone(backend, variants, table, a.binary, a.window, a.calls, a.seed)
    out = Path(a.out or ROOT / "outputs" / "hil" / "phone" / f"{backend.name.replace(':', '_')}_{spec.name}.json")
    doc = run.to_json()
    doc["meta"].update({"model": spec.name, "points": a.points, "n_max": a.n_max, "kv_max": a.kv_max,
                        "note": ("qemu-aarch64 on this host: emulated instructions, NOT phone timings"
                                 if a.qemu else "measured on the phone")})
    atomic_write_json(out, doc)
    t = run.profile.time_s
    print(f"{run.device}: {len(t)} variants (isa {run.meta['isa']}), measured s/call min {t.min():.3g} median "
          f"{np.median(t):.3g} max {t.max():.3g}; wall {run.wall_s:.1f} s -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.adb", description="Phones over adb (docs/cluster.md).")
    sub = ap.add_subparsers(dest="cmd")
    p = sub.add_parser("profile", help="measure a layer profile on a phone (or --qemu)")
    p.add_argument("--serial", default=None)
    p.add_argument("--qemu", action="store_true", help="run under qemu-aarch64 on this host (not phone timings)")
    p.add_argument("--model", default="smollm2_135m")
    p.add_argument("--ffn-shards", type=int, default=32)
    p.add_argument("--points", type=int, default=4, help="variants per (precision, phase)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-max", type=int, default=256)
    p.add_argument("--kv-max", type=int, default=1024)
    p.add_argument("--window", type=float, default=0.2, help="s of back-to-back calls per variant (at least)")
    p.add_argument("--calls", type=int, default=3, help="calls per variant (at least)")
    p.add_argument("--binary", default=None, help=f"aarch64 runner (default {AARCH64_BINARY.relative_to(ROOT)})")
    p.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "profile":
            if a.points < 1 or a.n_max < 8 or a.kv_max < 0 or a.window < 0 or a.calls < 1:
                raise ValueError("points >= 1, n-max >= 8, kv-max >= 0, window >= 0, calls >= 1")
            return _profile_cli(a)
        serials, why = attached()
        if not serials:
            print(why)
            return 1
        for s in serials:
            print(f"phone {s}")
        return 0
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
