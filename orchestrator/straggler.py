"""Straggler detection: a node that slows the whole job, judged against its peers.

Only the control plane sees every node, so this runs in the controller, on the heartbeats it
already stores. Ranks run in lockstep: a slow node makes every node's *step* equally slow, and
step times cannot tell who is to blame. What differs is each rank's own compute time per step
(`compute_s`, the step minus the time blocked in collectives; trainer/step_clock.py): the slow rank
waits least. Every heartbeat carries, per node, the median compute time of its slowest rank over
its last steps (`compute_p50`, with the per-rank detail), its step-time p50 and its NIC rates.

Rule, per signal, every controller pass:

* `compute`: a node whose compute time is an outlier above its peers: robust z-score
  `(x - median(peers)) / max(1.4826 MAD(peers), straggler_rel x median(peers)) > straggler_z`,
  and at least `straggler_min_s` above the median (two nodes have no MAD: the floor makes it
  "more than 1 + z x rel times its peer").
* `nic` (3 nodes or more, so that the median is a fleet and not one peer): a node whose NIC rate
  is below `straggler_nic_ratio` x its peers' median, while the peers move real traffic.

Persistence: a node must stay an outlier on the same signal for `straggler_persist_s` of fresh
heartbeats; any pass where it is not resets its clock. One verdict per node and attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

from aerie_contracts.failures import FailureKind
from aerie_contracts.health import (
    SUMMARY_COMPUTE_P50,
    SUMMARY_RANKS,
    SUMMARY_SLOWEST_RANK,
    HealthSettings,
)

MIN_NIC_BPS = 256 * 1024  # peers below this are too quiet to compare NIC rates
STALE_HEARTBEATS = 3  # a summary older than this many heartbeat intervals is not compared


@dataclass(frozen=True)
class Finding:
    host: str
    signal: str
    message: str
    evidence: dict[str, Any]

    @property
    def kind(self) -> str:
        return FailureKind.NODE_STRAGGLER.value


def outliers(values: dict[str, float], cfg: HealthSettings) -> dict[str, dict[str, float]]:
    """Hosts whose value is far above their peers' (higher is worse), with the numbers."""
    out = {}
    for host, x in values.items():
        peers = [v for h, v in values.items() if h != host]
        if not peers:
            continue
        m = median(peers)
        mad = median([abs(p - m) for p in peers])
        scale = max(1.4826 * mad, cfg.straggler_rel * m, 1e-9)
        z = (x - m) / scale
        if z > cfg.straggler_z and x - m >= cfg.straggler_min_s:
            out[host] = {"value": x, "peers_median": m, "z": round(z, 2), "ratio": round(x / m, 3) if m else None}
    return out


def nic_outliers(values: dict[str, float], cfg: HealthSettings) -> dict[str, dict[str, float]]:
    """With 3 nodes or more: hosts whose NIC rate is far below their peers' median."""
    if len(values) < 3:
        return {}
    out = {}
    for host, x in values.items():
        m = median([v for h, v in values.items() if h != host])
        if m >= MIN_NIC_BPS and x < cfg.straggler_nic_ratio * m:
            out[host] = {"value": x, "peers_median": m, "ratio": round(x / m, 3)}
    return out


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def signals(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per signal, per host, the value compared (hosts that do not report it are left out)."""
    compute, nic, step = {}, {}, {}
    for host, s in summaries.items():
        if (c := _num(s.get(SUMMARY_COMPUTE_P50))) is not None:
            compute[host] = c
        rates = [(_num(n.get("rx_bps")) or 0.0) + (_num(n.get("tx_bps")) or 0.0) for n in s.get("nics") or []]
        if rates:
            nic[host] = sum(rates)
        if (p := _num(s.get("step_time_p50"))) is not None:
            step[host] = p
    return {"compute": compute, "nic": nic, "step": step}


@dataclass
class StragglerTracker:
    """The controller's memory between passes: since when each (attempt, host, signal) has been an
    outlier, and which nodes already got their verdict."""

    since: dict[tuple[str, str, str], float] = field(default_factory=dict)
    reported: set[tuple[str, str]] = field(default_factory=set)

    def observe(
        self, attempt_id: str, summaries: dict[str, dict[str, Any]], cfg: HealthSettings, now: float
    ) -> list[Finding]:
        """Feed the newest summary of every node; the stragglers that just passed persistence."""
        fresh = {
            h: s
            for h, s in summaries.items()
            if isinstance(s, dict) and now - (_num(s.get("t")) or 0.0) <= STALE_HEARTBEATS * cfg.heartbeat_s
        }
        values = signals(fresh)
        flagged = {"compute": outliers(values["compute"], cfg), "nic": nic_outliers(values["nic"], cfg)}
        findings = []
        for signal, hosts in flagged.items():
            for host in list(summaries):
                key = (attempt_id, host, signal)
                if host not in hosts:
                    self.since.pop(key, None)
                    continue
                t0 = self.since.setdefault(key, now)
                if now - t0 < cfg.straggler_persist_s or (attempt_id, host) in self.reported:
                    continue
                self.reported.add((attempt_id, host))
                findings.append(_finding(host, signal, hosts[host], now - t0, fresh, values))
        return findings

    def forget(self, attempt_id: str) -> None:
        self.since = {k: v for k, v in self.since.items() if k[0] != attempt_id}
        self.reported = {k for k in self.reported if k[0] != attempt_id}


def _finding(
    host: str,
    signal: str,
    numbers: dict[str, float],
    held_s: float,
    summaries: dict[str, dict[str, Any]],
    values: dict[str, dict[str, float]],
) -> Finding:
    s = summaries[host]
    steps = values["step"]
    fleet_step = median(steps.values()) if steps else None
    if signal == "compute":
        what = (
            f"computes {numbers['value']:.3f}s a step (rank {s.get(SUMMARY_SLOWEST_RANK)}) against its peers' "
            f"median {numbers['peers_median']:.3f}s (x{numbers['ratio']})"
        )
    else:
        what = f"moves {numbers['value']:.0f} B/s on its NICs, its peers' median {numbers['peers_median']:.0f} B/s"
    return Finding(
        host,
        signal,
        f"{host} is a straggler: it {what} for {held_s:.0f}s",
        {
            "host": host,
            "signal": signal,
            **{k: v for k, v in numbers.items()},
            "held_s": round(held_s, 1),
            "slowest_rank": s.get(SUMMARY_SLOWEST_RANK),
            "ranks": s.get(SUMMARY_RANKS) or {},
            "node_step_p50": steps.get(host),
            "fleet_step_p50": fleet_step,
            "fleet": {sig: dict(vals) for sig, vals in values.items()},
        },
    )
