"""The node's monitor: samples every probe once per tick, keeps bounded windows, runs detectors.

``Monitor`` is what the supervisor drives (``tick`` every ``sample_s``, ``summary`` into each
heartbeat). ``Observations`` is the probe-free half: it folds one tick's samples into ring
buffers and cuts :class:`agent.detect.Window`s, so recorded traces replay through exactly the
code that runs live (:func:`replay`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from statistics import median

from aerie_contracts import FailureKind
from aerie_contracts.health import (
    SUMMARY_COMPUTE_P50,
    SUMMARY_RANK_STEPS,
    SUMMARY_RANKS,
    SUMMARY_SECTIONS,
    SUMMARY_SLOWEST_RANK,
    HealthSettings,
)
from aerie_contracts.states import ProcessState
from agent.detect import Verdict, Window, detect_all, percentile, step_times
from agent.probes.gpu import CpuAcceleratorProbe, NvmlProbe, RankProcesses, make_accelerator_probe
from agent.probes.nic import NicProbe, interfaces_from_resourceconfig
from agent.probes.progress import ProgressProbe
from agent.ring import Ring
from agent.sections import learned_summary

ACCEL_SPAN_S = 90.0  # accelerator history handed to detectors (hang looks back 30 s, evidence 60 s)
STEPS_PER_RANK = 200  # steps handed to detectors (p95 step time, spike baseline)


def settings_of(health: HealthSettings | Mapping | None, **defaults: object) -> HealthSettings:
    """The typed settings: as given, or parsed from JSON's mapping (keys it lacks from `defaults`)."""
    if isinstance(health, HealthSettings):
        return health
    return HealthSettings.from_dict({**defaults, **(health or {})})


class Observations:
    """Ring buffers of one node's samples; ``add`` one tick, ``window`` for the detectors."""

    def __init__(self, progress: ProgressProbe, cfg: HealthSettings, learned: dict[str, list[float]] | None = None):
        self.cfg = cfg
        self.learned = dict(learned or {})  # section durations of the job's previous attempts
        maxlen = max(16, int(cfg.window_s / max(cfg.sample_s, 0.05)) + 1)
        self.maxlen = maxlen
        self.progress = progress
        self.accel: dict[str, Ring] = {}
        self.nics: dict[str, Ring] = {}
        self.nic_state: dict[str, str] = {}
        self.retrans = Ring(maxlen)
        self.processes: list[dict] = []

    def add(self, sample: dict, ingest_records: bool = False) -> None:
        """Fold one tick (the shape :meth:`Monitor.sample` returns and traces store)."""
        now = sample["now"]
        for idx, util in sample.get("accel", {}).items():
            if util is not None:
                self.accel.setdefault(str(idx), Ring(self.maxlen)).append(now, float(util))
        for name, rate in sample.get("nics", {}).items():
            self.nics.setdefault(name, Ring(self.maxlen)).append(now, rate["rx_bps"] + rate["tx_bps"])
        self.nic_state.update(sample.get("nic_state", {}))
        if sample.get("retrans") is not None:
            self.retrans.append(now, sample["retrans"])
        self.processes = sample.get("processes", [])
        if ingest_records:  # replay: live records were already folded in by the progress probe
            for rec in sample.get("records", []):
                self.progress.ingest(rec)

    def window(self, now: float, started_at: float) -> Window:
        accel_t0 = now - ACCEL_SPAN_S
        nic_t0 = now - self.cfg.nic_baseline_s - 10.0
        return Window(
            now=now,
            started_at=started_at,
            accel={k: [list(s) for s in r.since(accel_t0)] for k, r in self.accel.items()},
            nics={k: [list(s) for s in r.since(nic_t0)] for k, r in self.nics.items()},
            nic_state=dict(self.nic_state),
            retrans=[list(s) for s in self.retrans.since(nic_t0)],
            steps={str(r): list(s)[-STEPS_PER_RANK:] for r, s in self.progress.steps.items()},
            open={str(r): dict(o) for r, o in self.progress.open.items() if o},
            pauses=[list(p) for p in self.progress.pauses],
            processes=list(self.processes),
            uploads={str(r): t for r, t in self.progress.uploads.items()},
            sections={k: list(v) for k, v in self.progress.durations.items()},
            learned=self.learned,
            first_step_t=self.progress.first_step_t,
            nan_records={str(r): dict(v) for r, v in self.progress.first_nan.items()},
        )


class Monitor:
    """Probes + detectors for one node. ``tick`` returns only verdict kinds not reported before."""

    def __init__(
        self,
        *,
        node_dir: Path,
        metrics_dir: Path,
        health: HealthSettings | Mapping,
        interfaces: list[str] | None = None,
        host: str = "",
        sample_s: float = 1.0,
        started_at: float | None = None,
        accelerator: str = "auto",
        sys_root: Path | str = "/sys",
        proc_root: Path | str = "/proc",
        learned: dict[str, list[float]] | None = None,
    ):
        # The agent hands its settings typed (AgentConfig.health, parsed once); `sample_s` and
        # `accelerator` are only defaults for a mapping (a recorded trace's header, a test).
        self.cfg = settings_of(health, sample_s=sample_s, accelerator=accelerator)
        self.host = host
        self.node_dir = Path(node_dir)
        self.started_at = time.time() if started_at is None else started_at
        self.processes = RankProcesses(self.node_dir / "ranks")
        maxlen = max(16, int(self.cfg.window_s / max(self.cfg.sample_s, 0.05)) + 1)
        if self.cfg.accelerator == "cpu":
            self.accel = CpuAcceleratorProbe(self.processes, maxlen)
        elif self.cfg.accelerator == "nvml":
            self.accel = NvmlProbe(maxlen, watch=self.cfg.gpus)
        else:
            self.accel = make_accelerator_probe(self.processes, maxlen, watch=self.cfg.gpus)
        if interfaces is None:  # AERIE_ML_ROOT/agent is the node dir; resourceconfig sits beside it
            interfaces = interfaces_from_resourceconfig(
                self.node_dir.parent / "input" / "config" / "resourceconfig.json"
            )
        self.nic = NicProbe(interfaces, sys_root=sys_root, proc_root=proc_root, maxlen=maxlen)
        self.obs = Observations(
            ProgressProbe(Path(metrics_dir), maxlen=max(maxlen, STEPS_PER_RANK)), self.cfg, learned=learned
        )
        self.last_sample: dict | None = None
        self.last_window: Window | None = None
        self._accel_latest: list[dict] = []
        self._nic_latest: dict[str, dict] = {}
        self.reported: dict[str, Verdict] = {}
        # A node whose ranks print no progress (a third-party trainer logs on one rank only) cannot
        # tell "no step yet" from "never will": it leaves the no-step hang to the node that prints.
        self.blind_until_first_step = False

    # ------------------------------------------------------------------ sampling

    def sample(self, now: float) -> dict:
        """Sample every probe once; the result is also what traces record."""
        procs = self.processes.sample(now)
        self._accel_latest = self.accel.sample(now, procs)
        self._nic_latest = self.nic.sample(now)
        retrans = self.nic.retrans.last()
        return {
            "now": now,
            "accel": {str(s["index"]): s["util"] for s in self._accel_latest},
            "nics": self._nic_latest,
            "nic_state": dict(self.nic.state),
            "retrans": retrans[1] if retrans and retrans[0] == now else None,
            "records": self.obs.progress.sample(),
            "processes": procs,
        }

    def tick(self, now: float | None = None) -> list[Verdict]:
        now = time.time() if now is None else now
        self.last_sample = self.sample(now)
        self.obs.add(self.last_sample)
        return self.judge(now)

    def judge(self, now: float) -> list[Verdict]:
        self.last_window = self.obs.window(now, self.started_at)
        new = []
        blind = self.blind_until_first_step and not any(self.last_window.steps.values())
        done = self._ranks_finished()
        for v in detect_all(self.last_window, self.cfg):
            if (blind or done) and v.kind == FailureKind.SILENT_HANG:
                continue
            if v.kind not in self.reported:
                self.reported[v.kind] = v
                new.append(v)
        return new

    def _ranks_finished(self) -> bool:
        """Every rank of this node exited 0 (`ranks/rank-R.exit.json`): the node waits for its peers
        to finish (torchrun's teardown, a trainer's final save on another node), it is not hung."""
        procs = self.obs.processes
        if not procs or any(p.get("state") != ProcessState.GONE for p in procs):
            return False
        for p in procs:
            try:
                ended = json.loads((self.node_dir / "ranks" / f"rank-{p.get('rank')}.exit.json").read_text())
            except (OSError, ValueError):
                return False
            if not isinstance(ended, dict) or ended.get("exit_code") != 0:
                return False
        return True

    # ------------------------------------------------------------------ heartbeat

    def summary(self) -> dict:
        prog = self.obs.progress
        times = step_times(self.last_window) if self.last_window else []
        ranks = prog.rank_timing()
        # The node's slowest rank: ranks wait for each other, so the one that computes longest
        # (waits least) is what its peers wait for; the control plane compares nodes by it.
        slowest = max(ranks, key=lambda r: ranks[r][SUMMARY_COMPUTE_P50], default=None)
        return {
            "host": self.host,
            "accelerator_kind": self.accel.kind,
            "accelerators": self._accel_latest,
            "nics": [{"name": n, "rx_bps": r["rx_bps"], "tx_bps": r["tx_bps"]} for n, r in self._nic_latest.items()],
            "last_step": prog.last_step(),
            "last_step_t": prog.last_step_t(),
            "last_loss": prog.last_loss(),
            "step_time_p50": median(times) if times else None,
            "step_time_p95": percentile(times, 95),
            "processes": [{k: p[k] for k in ("rank", "pid", "state", "cpu")} for p in self.obs.processes],
            "in_checkpoint": prog.in_pause("checkpoint"),
            "in_eval": prog.in_pause("eval"),
            "in_upload": bool(prog.uploads),
            SUMMARY_RANKS: ranks,
            SUMMARY_RANK_STEPS: prog.rank_steps(),
            SUMMARY_COMPUTE_P50: ranks[slowest][SUMMARY_COMPUTE_P50] if slowest is not None else None,
            SUMMARY_SLOWEST_RANK: slowest,
            # The job's section history as this node knows it: the next attempt starts from it.
            SUMMARY_SECTIONS: learned_summary(self.last_window) if self.last_window else dict(self.obs.learned),
        }


# ---------------------------------------------------------------------- traces


def load_trace(path: Path) -> tuple[dict, list[dict]]:
    """A trace is JSONL: a header ``{"trace", "expect", "health", "started_at"}``, then one
    ``Monitor.sample`` per tick."""
    lines = Path(path).read_text().splitlines()
    return json.loads(lines[0]), [json.loads(ln) for ln in lines[1:] if ln.strip()]


def replay(
    samples: Iterable[dict],
    health: HealthSettings | Mapping,
    started_at: float,
    learned: dict[str, list[float]] | None = None,
) -> list[tuple[float, Verdict]]:
    """Feed recorded ticks through the live code path; every verdict with the time it fired.
    `learned`: section durations of earlier attempts (what `AERIE_SECTIONS` hands the agent)."""
    cfg = settings_of(health)
    obs = Observations(ProgressProbe(Path("/nonexistent")), cfg, learned=learned)
    out, seen = [], set()
    for sample in samples:
        obs.add(sample, ingest_records=True)
        for v in detect_all(obs.window(sample["now"], started_at), cfg):
            if v.kind not in seen:
                seen.add(v.kind)
                out.append((sample["now"], v))
    return out
