"""Communication model of a Wi-Fi Direct cluster (paper §3.2.1, §4.2.1: "based on the size of transmission data and
wireless network conditions"): time = bytes / goodput(RSSI) + latency(RSSI).

Topology: a star around the main device (the Wi-Fi Direct group owner, device 0). A transfer between two non-main
devices is relayed by the group owner (two hops). All devices share one channel, so TP's broadcast and aggregation
airtimes add up across devices (time-division), while per-message latencies of the parallel messages overlap
(`RssiTable.shared_channel`; with independent links — the emulated cluster's one shaped veth per device — the
airtimes overlap too: max instead of Σ):

    MP boundary a → b:   hop(a) + hop(b),            hop(d) = bytes / goodput_d + latency_d, hop(main) = 0
    TP layer over set S: Σ_{d∈S, d≠main} 2·bytes / goodput_d + 2·max_{d∈S, d≠main} latency_d   (broadcast + aggregate)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.voltron.rssi import RssiTable


@dataclass
class LinkState:
    """Links of a cluster at one instant. Index 0 is the main device (no link)."""
    rssi_dbm: np.ndarray          # (D,) dBm (main: +inf)
    goodput: np.ndarray           # (D,) bytes/s (main: inf; disconnected: 0)
    latency: np.ndarray           # (D,) s one-way (main: 0; disconnected: inf)
    shared: bool = True           # one channel for all links (airtimes add up) | independent links (in parallel)

    @property
    def connected(self) -> np.ndarray:
        return self.goodput > 0                                              # (D,) bool

    @property
    def mcs_key(self) -> tuple:
        """Hashable summary (for plan caching): goodput and latency fully determine communication costs."""
        key = self.__dict__.get("_key")
        if key is None:
            key = tuple(np.round(self.goodput, 0).tolist()) + tuple(np.round(self.latency * 1e6, 0).tolist())
            self.__dict__["_key"] = key
        return key

    @classmethod
    def from_rssi(cls, table: RssiTable, rssi_links: np.ndarray, up: np.ndarray | None = None) -> "LinkState":
        """Build from RSSI of the non-main devices' links (D-1,); `up` can force a link down (device left)."""
        r = np.asarray(rssi_links, dtype=float)
        gp = table.goodput_bps(r)
        lat = table.latency_s(r)
        if up is not None:
            gp = np.where(up, gp, 0.0)
            lat = np.where(up, lat, np.inf)
        return cls(rssi_dbm=np.concatenate([[np.inf], r]), goodput=np.concatenate([[np.inf], gp]),
                   latency=np.concatenate([[0.0], np.where(gp > 0, lat, np.inf)]), shared=table.shared_channel)

    def scaled(self, k: np.ndarray) -> "LinkState":
        """The same links with every message on link d taking k[d] times as long (goodput / k, latency × k): the
        closed loop's per-link correction of this model (`feedback.py`); k[0] (the main device) is ignored."""
        k = np.asarray(k, dtype=float).copy()
        k[0] = 1.0
        if np.all(k == 1.0):
            return self
        return LinkState(rssi_dbm=self.rssi_dbm, goodput=self.goodput / k, latency=self.latency * k,
                         shared=self.shared)

    def message_s(self, nbytes: np.ndarray, members: np.ndarray) -> np.ndarray:
        """(D,) seconds of the TP messages each link carries (a broadcast and an aggregate message per member and
        layer: 2·bytes / goodput + 2·latency), for layers with activation `nbytes` (J,) over member masks (J, D)."""
        remote = members.copy()
        remote[:, 0] = False
        with np.errstate(divide="ignore", invalid="ignore"):
            per = np.where(remote, 2 * np.asarray(nbytes, dtype=float)[:, None] / self.goodput[None, :]
                           + 2 * self.latency[None, :], 0.0)
        return per.sum(axis=0)

    def hop(self, nbytes: np.ndarray | float) -> np.ndarray:
        """(…, D) one-hop time of `nbytes` between each device and the main device (0 for the main device)."""
        nb = np.asarray(nbytes, dtype=float)[..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = nb / self.goodput + self.latency
        t = np.where(self.connected, t, np.inf)
        t[..., 0] = 0.0
        return t

    def tp_comm(self, nbytes: np.ndarray, members: np.ndarray) -> np.ndarray:
        """TP broadcast + aggregate time for layers with activation `nbytes` (…,) over member masks (…, D)."""
        nb = np.asarray(nbytes, dtype=float)[..., None]
        remote = members.copy()
        remote[..., 0] = False
        with np.errstate(divide="ignore", invalid="ignore"):
            per = np.where(remote, 2 * nb / np.where(self.connected, self.goodput, 1.0), 0.0)
            air = per.sum(axis=-1) if self.shared else per.max(axis=-1)
        lat = np.where(remote, self.latency, 0.0).max(axis=-1)
        ok = ~(remote & ~self.connected).any(axis=-1)
        return np.where(ok, air + 2 * lat, np.inf)
