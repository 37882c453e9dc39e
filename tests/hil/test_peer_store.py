"""llama.cpp's and MNN's measured costs in the host profile store (hil/host.py, hil.calibrate_peer.write_peer_fields):
a store of the older layout (the fields inside device.json's "profile", the raw records beside) loads into
PeerCosts with the same values and no "recalibrate" error; the next calibration step moves them into peers.json,
which the manifest then covers."""
from __future__ import annotations

import dataclasses
import json

import pytest

from hil import calibrate_mnn as cm
from hil import calibrate_peer as cp
from hil import host
from planner.peer_costs import NO_PEER_COSTS, PEER_FIELDS, PeerCosts
from tests.hil.golden_host import golden_host

# as hil.calibrate_peer / hil.calibrate_mnn wrote them into a store before the peer costs had their own model
LEGACY = dict(llamacpp_fixed_s=0.07177323638982648, llamacpp_repack_gbps=95.85114608030712,
              llamacpp_gemm_gops_per_ghz={"Q8_0@576": 39.98445500754937, "Q4_0@576": 71.13969000903535,
                                          "Q4_K_M@2048": 65.67930908167963},
              mnn_fixed_s=0.0018221118911045458, mnn_load_gbps={"b8": 0.5606979156361424, "b4": 0.23149708379300374},
              mnn_gemm_gops_per_ghz={"b8@576": 34.47543845267556, "b4@2048": 52.91868630597895})


def _legacy_store(tmp_path, peer_fields=LEGACY):
    """A full store of this machine in the older layout (written as hil.host.store and the steps wrote it)."""
    ref = golden_host(tmp_path)
    ident = host.host_identity()
    head = dict(version=host.STORE_VERSION, identity_hash=ident.id_hash(), quick=False)
    device = dict(head, host_memory={"mode": "hold"}, huge_pages=True,
                  profile={**dataclasses.asdict(ref.device), **peer_fields},
                  sources={"flash_peak_gbps": "measured: x", **{k: f"measured: {k}" for k in peer_fields}},
                  spread={"flash_peak_gbps": 0.01}, llamacpp_calibration=[{"model": "m", "ftype": "Q8_0"}],
                  mnn_calibration=[{"model": "m", "bits": 8}])
    root = tmp_path / "hosts"
    d = host.store_dir(root, ident)
    host.write_store(d, {"identity.json": ident.to_json(), "device.json": device,
                         "runtime.json": dict(head, runtime=dataclasses.asdict(ref.runtime), sources={}),
                         "cost_table.json": json.loads(ref.cost_table.read_text()), "measurements.json": {}})
    return root, ident, d, ref


def test_an_old_layout_store_loads_into_peer_costs_with_the_same_values(tmp_path):
    root, ident, d, ref = _legacy_store(tmp_path)
    got, where, why = host.load_stored(root, ident, quick=False)
    assert got is not None, why
    assert where == d and got.peers == PeerCosts(**LEGACY)
    for k, v in LEGACY.items():                                     # bit for bit
        assert getattr(got.peers, k) == v
    assert got.device == ref.device and got.runtime == ref.runtime   # the device profile without them
    assert host.load_peers(d) == got.peers and cp.has_fields(d) and cm.has_fields(d)
    assert host.check_manifest(d.resolve()) == "" and not (d / host.PEERS_FILE).exists()


def test_a_store_without_peer_costs_has_none(tmp_path):
    root, ident, d, ref = _legacy_store(tmp_path, peer_fields={})
    got, _, why = host.load_stored(root, ident, quick=False)
    assert got is not None, why
    assert got.peers == NO_PEER_COSTS and not cp.has_fields(d) and not cm.has_fields(d)


def test_a_bad_old_layout_value_is_an_error_naming_the_file(tmp_path):
    _root, _ident, d, _ref = _legacy_store(tmp_path, peer_fields={**LEGACY, "mnn_gemm_gops_per_ghz": {"b8@576": -1}})
    with pytest.raises(ValueError, match=r"device\.json: not valid host peer costs \(peers\.mnn_gemm_gops_per_ghz"):
        host.load_peers(d)


def test_a_calibration_step_moves_the_old_layout_into_peers_json(tmp_path):
    root, ident, d, ref = _legacy_store(tmp_path)
    mnn = {"mnn_fixed_s": 0.002, "mnn_load_gbps": {"b8": 0.6}, "mnn_gemm_gops_per_ghz": {"b8@576": 30.0}}
    cp.write_peer_fields(d, mnn, {"mnn_fixed_s": "measured: again"}, "mnn_calibration", [{"model": "m2"}])
    dev_doc = json.loads((d / "device.json").read_text())
    doc = json.loads((d / host.PEERS_FILE).read_text())
    assert not set(PEER_FIELDS) & (set(dev_doc["profile"]) | set(dev_doc["sources"]) | set(dev_doc["spread"]))
    assert "llamacpp_calibration" not in dev_doc and "mnn_calibration" not in dev_doc
    assert doc["llamacpp_calibration"] == [{"model": "m", "ftype": "Q8_0"}]            # the old records moved along
    assert doc["mnn_calibration"] == [{"model": "m2"}]                                  # the new ones replaced them
    assert doc["sources"]["llamacpp_fixed_s"] == "measured: llamacpp_fixed_s"
    assert doc["sources"]["mnn_fixed_s"] == "measured: again" and doc["identity_hash"] == ident.id_hash()
    got, _, why = host.load_stored(root, ident, quick=False)
    assert got is not None, why
    assert got.peers == PeerCosts(**{**LEGACY, **mnn}) and got.device == ref.device      # llama.cpp's kept as they were
    assert host.check_manifest(d.resolve()) == ""
    manifest = json.loads((d / host.MANIFEST).read_text())["files"]
    assert set(manifest) == set(host.STORE_FILES) | {host.PEERS_FILE}


def test_the_manifest_covers_peers_json(tmp_path):
    _root, _ident, d, _ref = _legacy_store(tmp_path)
    cp.write_peer_fields(d, {"llamacpp_fixed_s": 0.06}, {}, "llamacpp_calibration", [])
    v = d.resolve()
    (v / host.PEERS_FILE).write_text((v / host.PEERS_FILE).read_text().replace("0.06", "0.07"))
    assert "peers.json is not the one its manifest records" in host.check_manifest(v)
    (v / host.PEERS_FILE).unlink()                                     # listed in the manifest, then lost
    assert "peers.json is not the one its manifest records" in host.check_manifest(v)
