"""hil/adb.py and native/runner/ef_profile.c: the host build runs variants and its integer-path checksum equals a
NumPy reproduction built on shard_ops' quantizer; the static aarch64 build under qemu-aarch64 gives the same integer
checksums (float checksums within FLOAT_RTOL); `profile_phone` over the qemu backend returns Profile rows with the
planner's features and Spans; without a phone, one line says so (no adb server / fake server with no device)."""
from __future__ import annotations

import shutil
import socket
import socketserver
import subprocess
import threading

import numpy as np
import pytest

from hil import adb
from hil.cluster.profiler import sample_variants
from hil.cluster.shard_ops import FP16, QLinear
from planner.voltron.latency import LatencyModel, feature_row
from planner.voltron.layers import HEAD, layer_table
from quant.arch import ModelSpec

TOY = "d_model=64 n_heads=4 n_kv_heads=2 head_dim=16 ffn_dim=128 ffn_shards=4 vocab=200 rope_base=10000.0"
SMOL = "d_model=576 n_heads=9 n_kv_heads=3 head_dim=64 ffn_dim=1536 ffn_shards=32 vocab=49152 rope_base=100000.0"
FAST = ["--window", "0", "--calls", "2"]           # correctness runs: no timing window


def toy_variants() -> str:
    lines = []
    for p in (0, 1, 2):
        lines += [f"kind=attn precision={p} n_tokens=5 kv_len=7 n_held=2 {TOY}",
                  f"kind=attn precision={p} n_tokens=1 kv_len=0 n_held=1 {TOY}",
                  f"kind=ffn precision={p} n_tokens=3 kv_len=0 n_held=3 {TOY}",
                  f"kind=head precision={p} n_tokens=1 kv_len=0 n_held=1 {TOY}"]
    return "# toy\n\n" + "\n".join(lines) + "\n"


def smol_variants() -> str:
    return "\n".join([f"kind=attn precision=1 n_tokens=9 kv_len=40 n_held=3 {SMOL}",
                      f"kind=attn precision=0 n_tokens=1 kv_len=100 n_held=1 {SMOL}",
                      f"kind=ffn precision=2 n_tokens=4 kv_len=0 n_held=7 {SMOL}",
                      f"kind=head precision=1 n_tokens=1 kv_len=0 n_held=1 {SMOL}"]) + "\n"


@pytest.fixture(scope="module")
def host_runner(tmp_path_factory):
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("the runner tests need a C compiler (gcc)")
    return adb.build_runner(tmp_path_factory.mktemp("runner") / "ef_profile", "host",
                            cc=None if shutil.which("gcc") else "cc")


@pytest.fixture(scope="module")
def a64_runner(tmp_path_factory):
    missing = [t for t in (adb.CROSS_CC, adb.QEMU) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"aarch64 runner tests need {' and '.join(missing)} (Debian: apt-get install gcc-aarch64-linux-gnu "
                    f"qemu-user; `make cross-tools` does it)")
    return adb.build_runner(tmp_path_factory.mktemp("runner64") / "ef_profile", "aarch64")


def run(cmd: list, tmp_path, text: str, extra=FAST) -> list[dict]:
    (tmp_path / "v.txt").write_text(text)
    out = tmp_path / "out.jsonl"
    r = subprocess.run([*cmd, *extra, str(tmp_path / "v.txt"), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return adb.parse_records(out.read_text())


# ---- NumPy reproduction of the runner's integer-path checksum ------------------------------------------------------
M64 = (1 << 64) - 1
CK_MUL, CK_INIT = 1099511628211, 1469598103934665603


def mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, tag: int) -> int:
    return int(mix64(np.array([(seed ^ (tag * 0xD1B54A32D192ED03)) & M64], dtype=np.uint64))[0])


def draw(key: int, n: int) -> np.ndarray:
    i = np.arange(1, n + 1, dtype=np.uint64)
    return mix64(np.full(n, key, dtype=np.uint64) + i * np.uint64(0x9E3779B97F4A7C15))


def fold(c: int, v: np.ndarray) -> int:
    w = np.arange(v.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    s = int((v.ravel().astype(np.int64).view(np.uint64) * w).sum(dtype=np.uint64))
    return (c * CK_MUL + s) & M64


def expected_ck(kind: str, prec: int, T: int, n_held: int, d: int, nh: int, nkv: int, hd: int, ffn: int, shards: int,
                vocab: int, seed: int = 0) -> str:
    """ck_int of one variant: weights drawn as the runner draws them, quantized by shard_ops.QLinear.quantize."""
    c = CK_INIT
    probe_key = stream_key(seed, 300)

    def linear(N: int, K: int, tag: int, M: int) -> None:
        nonlocal c
        u = draw(stream_key(seed, tag), N * K)
        w = (((u >> np.uint64(40)).astype(np.int64) - 8388608).astype(np.float32) * np.float32(0.0625 / 8388608))
        q = QLinear.quantize(w.reshape(N, K), prec)
        if prec == FP16:
            c = fold(c, q.w.view(np.uint16))
            return
        c = fold(c, q.w)
        c = fold(c, q.scale.view(np.uint32))
        x8 = ((draw(probe_key, M * K) >> np.uint64(32)) % np.uint64(255)).astype(np.int64) - 127
        c = fold(c, x8.reshape(M, K) @ q.w.astype(np.int64).T)

    if kind == "head":
        linear(vocab, d, 1, 1)
    else:
        gq, ch = nh // nkv * hd, ffn // shards
        rows, kb = (gq + 2 * hd, gq) if kind == "attn" else (2 * ch, ch)
        linear(n_held * rows, d, 1, T)
        for i in range(n_held):
            linear(d, kb, 16 + i, T)
    return f"{c:016x}"


# ---- host build ----------------------------------------------------------------------------------------------------
def test_host_runner_times_variants_and_matches_numpy_checksum(host_runner, tmp_path):
    recs = run([str(host_runner)], tmp_path, toy_variants(), ["--window", "0.002", "--calls", "3"])
    assert len(recs) == 12 and [r["id"] for r in recs] == list(range(12))
    for r in recs:
        assert r["calls"] >= 3 and 0 < r["min_s"] <= r["median_s"] and r["time_s"] > 0
        assert r["window_s"] >= 0.002 and r["t0_s"] < r["t1_s"]
        assert np.isfinite(r["out_abs"]) and r["out_abs"] > 0
    assert all(a["t1_s"] <= b["t0_s"] for a, b in zip(recs, recs[1:]))        # windows in order, disjoint
    for r in recs:
        assert r["ck_int"] == expected_ck(r["kind"], r["precision"], r["n_tokens"], r["n_held"], 64, 4, 2, 16, 128, 4,
                                          200), r
    # another seed gives other weights
    other = run([str(host_runner)], tmp_path, toy_variants(), [*FAST, "--seed", "5"])
    assert all(a["ck_int"] != b["ck_int"] for a, b in zip(recs, other))


def test_host_runner_isas_agree(host_runner, tmp_path):
    best = run([str(host_runner)], tmp_path, toy_variants())
    ref = run([str(host_runner)], tmp_path, toy_variants(), [*FAST, "--isa", "ref"])
    assert {r["isa"] for r in ref} == {"ref"}
    assert adb.compare_records(best, ref) == []
    bad = [dict(r) for r in ref]
    bad[3]["ck_int"] = "0" * 16
    bad[5]["out_abs"] *= 1 + 10 * adb.FLOAT_RTOL
    assert len(adb.compare_records(best, bad)) == 2


@pytest.mark.parametrize("line, msg", [
    (f"kind=attn precision=1 n_tokens=4 kv_len=0 {TOY}", "n_held is required"),
    (f"kind=mlp precision=1 n_tokens=4 kv_len=0 n_held=1 {TOY}", "kind: 'mlp'"),
    (f"kind=attn precision=3 n_tokens=4 kv_len=0 n_held=1 {TOY}", "precision: 3"),
    (f"kind=attn precision=1 n_tokens=4 kv_len=0 n_held=3 {TOY}", "n_held: 3 outside 1..2"),
    (f"kind=ffn precision=1 n_tokens=4 kv_len=0 n_held=1 bogus=2 {TOY}", "unknown key 'bogus'"),
])
def test_runner_rejects_bad_lines(host_runner, tmp_path, line, msg):
    (tmp_path / "v.txt").write_text(f"# c\n{line}\n")
    r = subprocess.run([str(host_runner), str(tmp_path / "v.txt"), str(tmp_path / "o.jsonl")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and ":2: " in r.stderr and msg in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "o.jsonl").exists()


# ---- aarch64 build under qemu --------------------------------------------------------------------------------------
@pytest.mark.slow      # SmolLM2-shaped variants under qemu; the NEON kernels are checked in tests/native (fast)
def test_aarch64_build_matches_host(host_runner, a64_runner, tmp_path):
    text = toy_variants() + smol_variants()
    host = run([str(host_runner)], tmp_path, text)
    arm = run([adb.QEMU, str(a64_runner)], tmp_path, text)
    assert {r["isa"] for r in arm} <= {"neon", "neondot"}
    assert adb.compare_records(host, arm) == []
    arm_neon = run([adb.QEMU, str(a64_runner)], tmp_path, toy_variants(), [*FAST, "--isa", "neon"])
    assert adb.compare_records(host[:12], arm_neon) == []


def tiny_spec() -> ModelSpec:
    return ModelSpec(name="tiny", n_layers=2, d_model=64, d_ffn=96, n_heads=4, n_kv_heads=2, head_dim=16, vocab=300,
                     tied_embeddings=True)


def test_profile_phone_over_qemu_backend(a64_runner, tmp_path):
    table = layer_table(tiny_spec(), ffn_shards=4)
    variants = sample_variants(1, table, points=4, seed=3, n_max=24, kv_max=40)
    backend = adb.LocalAarch64(tmp_path / "phone")
    pr = adb.profile_phone(backend, variants, table, binary=a64_runner, window_s=0.0, min_calls=1, seed=0)
    # the protocol's files are where a phone would hold them
    assert sorted(p.name for p in (tmp_path / "phone" / adb.REMOTE_DIR.lstrip("/")).iterdir()) == \
        ["ef_profile", "out.jsonl", "variants.txt"]
    P = pr.profile
    assert len(P.time_s) == len(variants) == 24 and (P.time_s > 0).all() and (P.device == 0).all()
    for i, (d, p, ph, t, n, kv, held) in enumerate(variants):
        assert (P.prec[i], P.phase[i], P.ltype[i], P.n_tokens[i], P.kv_len[i]) == (p, ph, t, n, kv)
        frac = 1.0 if t == HEAD else held / table.shards[t]
        np.testing.assert_array_equal(P.x[i], feature_row(table, t, p, n, kv, frac))
        r = pr.records[i]
        assert (r["precision"], r["n_tokens"], r["kv_len"], r["n_held"]) == (p, n, kv, held)
        assert r["kind"] == {HEAD: "head"}.get(t, "attn" if t < 3 else "ffn")
    assert {HEAD} < set(P.ltype.tolist()) and set(P.phase.tolist()) == {0, 1}
    assert [s.task for s in pr.spans] == list(range(24)) and all(s.resource == "qemu-aarch64" for s in pr.spans)
    assert all(s.start < s.end for s in pr.spans) and pr.to_json()["measured"] is True
    model = LatencyModel.fit(P, ["qemu"])                  # the planner's regression fits on the rows as they are
    assert np.isfinite(model.predict(P)).all() and model.beta.shape == (1, 3, 2, 4)


def test_profile_phone_errors(tmp_path):
    table = layer_table(tiny_spec(), ffn_shards=4)
    v = sample_variants(1, table, 1, 0, 16, 16)
    with pytest.raises(FileNotFoundError, match="make runner-aarch64"):
        adb.profile_phone(object(), v, table, binary=tmp_path / "missing")
    with pytest.raises(ValueError, match="device 0"):
        adb.profile_phone(object(), sample_variants(2, table, 1, 0, 16, 16), table, binary=tmp_path / "missing")
    with pytest.raises(ValueError, match="out.jsonl:1: missing"):
        adb.parse_records('{"id": 0}\n', "out.jsonl")


# ---- no phone ------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeAdbServer(socketserver.ThreadingTCPServer):
    """Answers `host:devices` of the adb host protocol with a fixed listing."""
    daemon_threads = allow_reuse_address = True

    def __init__(self, listing: str):
        self.listing = listing

        class H(socketserver.BaseRequestHandler):
            def handle(h):
                n = int(h.request.recv(4), 16)
                cmd = h.request.recv(n).decode()
                payload = self.listing.encode() if cmd.startswith("host:devices") else b""
                h.request.sendall(b"OKAY" + f"{len(payload):04x}".encode() + payload)

        super().__init__(("127.0.0.1", 0), H)


@pytest.fixture
def fake_adb(monkeypatch):
    pytest.importorskip("adbutils")
    servers = []

    def start(listing: str) -> None:
        srv = FakeAdbServer(listing)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(srv.server_address[1]))

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_no_server_one_line(monkeypatch, capsys):
    pytest.importorskip("adbutils", reason="the no-server message needs adbutils (extra: [phone], also in [test])")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(free_port()))
    serials, why = adb.attached()
    assert serials == [] and why.startswith("no phone attached (") and "adb start-server" in why and "\n" not in why
    assert adb.main([]) == 1
    out = capsys.readouterr().out
    assert out == why + "\n"


def test_empty_and_attached_listing(fake_adb, capsys):
    fake_adb("")
    serials, why = adb.attached()
    assert serials == [] and why.startswith("no phone attached (adb devices is empty): connect a phone with USB "
                                            "debugging on, or use the emulated cluster")
    fake_adb("R58N123\tunauthorized\n")
    assert adb.attached()[1].startswith("no phone attached (adb devices lists only R58N123 (unauthorized))")
    fake_adb("R58N123\tdevice\nemulator-5554\tdevice\n")
    assert adb.attached() == (["R58N123", "emulator-5554"], "")
    assert adb.main([]) == 0
    assert capsys.readouterr().out == "phone R58N123\nphone emulator-5554\n"


def test_no_adbutils_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "adbutils", None)
    serials, why = adb.attached()
    assert serials == [] and "adbutils is not installed" in why and "edgellm[phone]" in why
