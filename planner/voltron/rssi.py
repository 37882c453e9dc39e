"""RSSI → goodput / latency of a Wi-Fi Direct link (Voltron §3.2.3, Fig. 8; docs/design.md §5).

Table source: IEEE Std 802.11-2016, Table 21-25 "Receiver minimum input sensitivity" (VHT PHY, 802.11ac). The 20 MHz
values are −82, −79, −77, −74, −70, −66, −65, −64, −59 dBm for MCS 0–8; each doubling of the channel width raises them
by 3 dB, so a 40 MHz channel (the usual Wi-Fi Direct P2P group on 5 GHz) needs −79 … −54 dBm for MCS 0–9. PHY rates are
the VHT 40 MHz, 2 spatial streams, 800 ns guard interval rates of the same standard (Table 21-38..):
27, 54, 81, 108, 162, 216, 243, 270, 324, 360 Mb/s. A link at RSSI r uses the highest MCS whose sensitivity is ≤ r
(rate adaptation, e.g. Minstrel); below MCS 0 the link is disconnected.

Goodput = PHY rate × `mac_efficiency` (application-level UDP/TCP throughput over 802.11ac with A-MPDU aggregation is
~60–70 % of the PHY rate; 0.6 by default). One-way message latency = `base_latency_ms` (channel access + stack +
Wi-Fi Direct forwarding; Wi-Fi ping RTTs of 1.5–2 ms → ~0.8 ms one-way) + `retry_latency_ms` × (number of MCS steps
below the top MCS) / 9, modelling retransmissions and longer frames at weak signal (assumption, documented). The
disconnect threshold is `disconnect_dbm` (default: just below the MCS 0 sensitivity).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# IEEE 802.11-2016 Table 21-25, 20 MHz minimum sensitivity (dBm) for VHT MCS 0..9 (MCS 9 is 40 MHz-only: −57+3 rule).
SENSITIVITY_20MHZ_DBM = (-82, -79, -77, -74, -70, -66, -65, -64, -59, -57)
# VHT, 40 MHz, 2 spatial streams, long GI (800 ns): PHY rate in Mb/s for MCS 0..9.
VHT40_2SS_MBPS = (27.0, 54.0, 81.0, 108.0, 162.0, 216.0, 243.0, 270.0, 324.0, 360.0)


@dataclass
class RssiTable:
    """conf key `rssi`: the MCS table and the MAC/latency model (all sourced above)."""
    channel_mhz: int = 40                          # 20 | 40 | 80: sensitivity +3 dB per doubling (IEEE 802.11-2016)
    phy_rates_mbps: list[float] = field(default_factory=lambda: list(VHT40_2SS_MBPS))  # per MCS, Mb/s
    mac_efficiency: float = 0.6                    # goodput / PHY rate (A-MPDU aggregated UDP), assumption
    base_latency_ms: float = 0.8                   # ms one-way message latency at the top MCS
    retry_latency_ms: float = 2.0                  # ms extra one-way latency at MCS 0 (linear in MCS steps)
    disconnect_dbm: float = -80.0                  # dBm: below this the link is down
    reconnect_db: float = 5.0                      # dB above disconnect_dbm before a lost link is re-established
                                                   # (hysteresis: re-association + Wi-Fi Direct group re-join)
    shared_channel: bool = True                    # one channel for every link (a Wi-Fi Direct group: the airtimes
                                                   # of TP's broadcast / aggregate add up); false = independent links
                                                   # (the emulated cluster: one shaped veth per device)

    def __post_init__(self) -> None:
        for key in ("mac_efficiency", "base_latency_ms", "retry_latency_ms", "disconnect_dbm", "reconnect_db"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"rssi.{key} must be a finite number (got {v!r})")
        if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and np.isfinite(r)
                   for r in self.phy_rates_mbps):
            raise ValueError(f"rssi.phy_rates_mbps must be finite numbers (got {list(self.phy_rates_mbps)})")
        if not -120 <= self.disconnect_dbm <= 0:
            raise ValueError(f"rssi.disconnect_dbm must be in [-120, 0] (got {self.disconnect_dbm})")
        if self.channel_mhz not in (20, 40, 80):
            raise ValueError(f"rssi.channel_mhz must be 20, 40 or 80 (got {self.channel_mhz})")
        if len(self.phy_rates_mbps) != len(SENSITIVITY_20MHZ_DBM) or min(self.phy_rates_mbps) <= 0:
            raise ValueError(f"rssi.phy_rates_mbps must list {len(SENSITIVITY_20MHZ_DBM)} positive rates")
        if not 0 < self.mac_efficiency <= 1:
            raise ValueError(f"rssi.mac_efficiency must be in (0, 1] (got {self.mac_efficiency})")
        if self.reconnect_db < 0:
            raise ValueError(f"rssi.reconnect_db must be >= 0 (got {self.reconnect_db})")
        if not isinstance(self.shared_channel, bool):
            raise ValueError(f"rssi.shared_channel must be true or false (got {self.shared_channel!r})")
        if self.base_latency_ms < 0 or self.retry_latency_ms < 0:
            raise ValueError("rssi.base_latency_ms and rssi.retry_latency_ms must be >= 0")

    @property
    def sensitivity_dbm(self) -> np.ndarray:
        """(M,) dBm threshold of each MCS for the configured channel width."""
        bump = {20: 0, 40: 3, 80: 6}[self.channel_mhz]
        return np.array(SENSITIVITY_20MHZ_DBM, dtype=float) + bump

    def mcs(self, rssi_dbm: np.ndarray | float) -> np.ndarray:
        """Highest MCS whose sensitivity is met; −1 when disconnected."""
        r = np.asarray(rssi_dbm, dtype=float)
        m = np.searchsorted(self.sensitivity_dbm, r, side="right") - 1          # sensitivity ascending
        return np.where(r < self.disconnect_dbm, -1, m)

    def goodput_bps(self, rssi_dbm: np.ndarray | float) -> np.ndarray:
        """Application goodput in bytes/s (0 when disconnected)."""
        m = self.mcs(rssi_dbm)
        rates = np.asarray(self.phy_rates_mbps) * 1e6 / 8 * self.mac_efficiency
        return np.where(m >= 0, rates[np.maximum(m, 0)], 0.0)

    def latency_s(self, rssi_dbm: np.ndarray | float) -> np.ndarray:
        """One-way message latency in s (inf when disconnected)."""
        m = self.mcs(rssi_dbm)
        top = len(self.phy_rates_mbps) - 1
        lat = (self.base_latency_ms + self.retry_latency_ms * (top - np.maximum(m, 0)) / top) * 1e-3
        return np.where(m >= 0, lat, np.inf)

    def rows(self) -> list[dict]:
        """The table as rows (for docs): MCS, dBm threshold, PHY Mb/s, goodput Mb/s, latency ms."""
        out = []
        for m, (s, r) in enumerate(zip(self.sensitivity_dbm, self.phy_rates_mbps)):
            out.append({"mcs": m, "min_dbm": float(s), "phy_mbps": r, "goodput_mbps": r * self.mac_efficiency,
                        "latency_ms": float(self.latency_s(s) * 1e3)})
        return out
