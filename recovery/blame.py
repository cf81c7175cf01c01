"""Which node, if any, a failed attempt is the fault of, from the evidence its nodes reported.

Chaining leaves blamed nodes out of later attempts, so a wrong blame costs a healthy node and a
missing one costs another failure on a bad node. The policy table (`aerie_contracts.failures`)
says whether a failure kind blames a node at all (a NaN, a loss spike or an exit code blames
none); this module says which node:

* **A hang** (`silent.hang`) is seen by every node, because the healthy ones wait in the
  collective for the one that stopped, and the first to notice is as often a healthy peer as not.
  Where the ranks' in-process probe answered at stop time, their stacks and collective counters
  name the rank the others wait for (`waited_for`, recovery/hang_root.py), before any rule below.
  Measured here (2 nodes x 2 ranks, gloo, rank 3 spinning): every rank's last step was the same,
  logged within 3 ms of each other, the healthy node's *earlier*; what told the nodes apart was
  rank 3 busy while every other rank sat idle. So the blamed node is the one the evidence
  singles out, tried in this order (`BlameRule`):
  1. `stopped_rank`: a rank of the node was stopped (SIGSTOP), a zombie or gone when the hang was seen;
  2. `stalest`: the node's ranks stopped first: an earlier last step, or the same step clearly
     earlier (by more than a second and two p95 step times; lockstep training logs a step on
     every rank within milliseconds, so only a real lag counts). Needs every node's progress;
  3. `not_waiting`: a device doing what no waiting rank does, while some other device shows what
     waiting looks like on this kind of accelerator: ranks blocked in a gloo collective idle
     their CPU, ranks blocked in an NCCL collective spin their GPU at full use, so a busy CPU
     rank or an idle GPU is the one the others wait for.
  A rule that picks every node picks none. Without one (every GPU spinning in NCCL at the same
  step, say) no node is blamed: a retry on the same nodes beats excluding a healthy one.
* **A NIC stall**: both ends of a cut link see their throughput collapse; the node whose own link
  is down is blamed, else the node that saw it if only one did.
* **Node-local causes** (`silent.gpu_idle`, `node.lost`, `checkpoint.stalled`, ...): the node
  the verdict or the failure names.
* An attempt of one node: that node, for any kind that blames a node.

A node's facts come from its own verdict of the failure's kind (the evidence window it was taken
on: per-rank step times, busy and idle devices, stopped ranks), else from its last heartbeat if
that was sent during the stall and before any node was stopped (later ones see ranks Aerie itself
stopped). Standard library only: it runs in AWS Lambda with `chain_restart`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from aerie_contracts.failures import Blame, BlameRule, FailureKind, NodeBlame, policy
from aerie_contracts.health import HealthSettings
from aerie_contracts.states import STOPPED_PROCESS_STATES
from recovery import hang_root

# What a rank blocked in a collective does to its device, per accelerator probe (agent/probes/gpu.py).
WAITING_STATE = {"cpu": "idle", "nvml": "busy"}
MIN_LAG_S = 1.0  # the same last step logged this much earlier (and 2 p95 step times) is a real lag


@dataclass
class NodeFacts:
    """What one node told the control plane about the stall (None: it did not say)."""

    host: str
    source: str | None = None  # "verdict" | "heartbeat" | None (nothing usable)
    last_step: int | None = None  # its slowest rank's last step (None: none logged yet)
    last_step_t: float | None = None
    has_progress: bool = False
    stopped: list[Any] = field(default_factory=list)  # ranks stopped, zombie or gone
    busy: list[str] = field(default_factory=list)  # device indices
    idle: list[str] = field(default_factory=list)
    accelerator: str | None = None  # "cpu" | "nvml"
    step_time_p95: float | None = None

    def brief(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("host", "has_progress") and v not in (None, [])}


def blame_attempt(job: dict[str, Any], failed: dict[str, Any]) -> tuple[list[NodeBlame], str]:
    """The nodes to blame for the failed attempt `failed` of `job` (both as `GET /v1/jobs/{id}`
    returns them), and one line saying why, also when no node is blamed."""
    reason = failed.get("reason") or {}
    kind = reason.get("kind") or FailureKind.EXIT_NONZERO.value
    rule = policy(kind)
    if rule is None or rule.blame is Blame.NONE:
        return [], f"{kind} blames no node"
    verdicts = [v for v in job.get("verdicts") or [] if v.get("attempt_id") == failed.get("id")]
    of_kind = [v for v in verdicts if v.get("kind") == kind]
    hosts = sorted(
        {n["host"] for n in failed.get("nodes") or []}
        | {v["host"] for v in verdicts}
        | ({reason["host"]} if reason.get("host") else set())
    )
    if len(hosts) == 1:
        why = f"{kind}: {hosts[0]} was the attempt's only node"
        return [_blame(hosts[0], kind, BlameRule.ONLY_NODE, why, {})], why
    if kind == FailureKind.SILENT_HANG:
        return _hang(job, failed, hosts, of_kind, verdicts)
    if kind == FailureKind.SILENT_NIC_STALL:
        down = sorted({v["host"] for v in of_kind if _link_down(v.get("evidence") or {})})
        if down and len(down) < len(hosts):
            return _all(down, kind, BlameRule.LINK_DOWN, "its own NIC link was down", {})
        saw = sorted({v["host"] for v in of_kind} | ({reason["host"]} if reason.get("host") else set()))
        if len(saw) == 1:
            return _all(saw, kind, BlameRule.REPORTED, "the only node that saw its NIC stall", {})
        return [], f"{kind}: {', '.join(saw)} all saw the stall and no link was down: no node singled out"
    named = sorted({v["host"] for v in of_kind} | ({reason["host"]} if reason.get("host") else set()))
    if named and len(named) < len(hosts):
        return _all(named, kind, BlameRule.REPORTED, "the node the failure names", {})
    if not named:
        return [], f"{kind}: no node named"
    return [], f"{kind}: every node ({', '.join(named)}) was named: no node singled out"


# --------------------------------------------------------------------------- hang


def _hang(
    job: dict[str, Any],
    failed: dict[str, Any],
    hosts: list[str],
    of_kind: list[dict[str, Any]],
    verdicts: list[dict[str, Any]],
) -> tuple[list[NodeBlame], str]:
    spec = job.get("spec") or {}
    cfg = HealthSettings.from_dict(spec.get("health") or {})
    summaries = {n["host"]: n for n in failed.get("nodes") or []}
    first_action = min([float(v["t"]) for v in verdicts if v.get("t") is not None], default=None)
    facts = {h: NodeFacts(h) for h in hosts}
    for v in sorted(of_kind, key=lambda v: v.get("t") or 0.0):
        f = facts[v["host"]]
        if f.source is None:
            _from_verdict(f, v.get("evidence") or {})
    stall_start = max((f.last_step_t for f in facts.values() if f.last_step_t is not None), default=None)
    for host, f in facts.items():
        node = summaries.get(host) or {}
        summary = node.get("summary") or {}
        f.accelerator = summary.get("accelerator_kind") or (cfg.accelerator if cfg.accelerator != "auto" else None)
        if f.source is None and summary:
            _from_heartbeat(f, summary, node.get("last_heartbeat_at"), stall_start, first_action, cfg)
    evidence: dict[str, Any] = {"nodes": {h: f.brief() for h, f in facts.items()}}
    root = hang_root.find_root_cause(hang_root.views_from_verdicts(of_kind))
    if root is not None and len(root.hosts) < len(hosts):
        evidence["root_cause"] = root.message
        return [_blame(h, FailureKind.SILENT_HANG, BlameRule.WAITED_FOR, root.message, evidence) for h in root.hosts], (
            f"silent.hang: {root.message}"
        )
    known = [f for f in facts.values() if f.source]
    if not known:
        return [], "silent.hang: no node reported evidence of the stall"

    stopped = [f for f in known if f.stopped]
    if stopped and len(stopped) < len(hosts):
        why = "rank(s) {} stopped or gone"
        return [
            _blame(f.host, FailureKind.SILENT_HANG, BlameRule.STOPPED_RANK, why.format(f.stopped), evidence)
            for f in stopped
        ], f"silent.hang: {', '.join(f.host for f in stopped)} had stopped ranks"

    progress = [f for f in known if f.has_progress]
    if len(progress) == len(hosts):
        picked, why = _stalest(progress)
        if picked:
            return [_blame(f.host, FailureKind.SILENT_HANG, BlameRule.STALEST, why, evidence) for f in picked], (
                f"silent.hang: {', '.join(f.host for f in picked)} {why}"
            )

    # (node, what its waiting ranks' devices look like) for the nodes whose accelerator kind is known
    typed = [(f, WAITING_STATE[f.accelerator]) for f in known if f.accelerator in WAITING_STATE]
    waiting_seen = any(getattr(f, waiting) for f, waiting in typed)
    culprits = [(f, waiting) for f, waiting in typed if getattr(f, _opposite(waiting))]
    if culprits and waiting_seen and len(culprits) < len(hosts):
        out = []
        for f, waiting in culprits:
            state = _opposite(waiting)
            why = f"{f.accelerator} device(s) {getattr(f, state)} {state} while waiting ranks' devices are {waiting}"
            out.append(_blame(f.host, FailureKind.SILENT_HANG, BlameRule.NOT_WAITING, why, evidence))
        return out, f"silent.hang: {', '.join(f.host for f, _ in culprits)} not waiting like the others"
    return [], (
        "silent.hang: no node singled out (no stopped rank, no node behind the others, no device out of "
        "step with the waiting ones)"
    )


def _stalest(progress: list[NodeFacts]) -> tuple[list[NodeFacts], str]:
    step = {f.host: -1 if f.last_step is None else int(f.last_step) for f in progress}
    low = min(step.values())
    behind = [f for f in progress if step[f.host] == low]
    if len(behind) < len(progress):
        ahead = max(step.values())
        return behind, f"stopped at step {low if low >= 0 else 'none'} while others reached {ahead}"
    timed = [(f, f.last_step_t) for f in progress if f.last_step_t is not None]
    if len(timed) < len(progress):
        return [], ""
    p95 = max((f.step_time_p95 or 0.0 for f in progress), default=0.0)
    margin = max(MIN_LAG_S, 2.0 * p95)
    first = min(t for _, t in timed)
    early = [f for f, t in timed if t - first <= margin]
    if len(early) < len(timed):
        lag = min(t for f, t in timed if f not in early) - first
        return early, f"logged step {low} {lag:.1f}s before the others (margin {margin:.1f}s)"
    return [], ""


def _from_verdict(f: NodeFacts, ev: dict[str, Any]) -> None:
    f.source = "verdict"
    steps = (ev.get("window") or {}).get("steps") or {}
    last = [(s[-1][1], s[-1][0]) for s in steps.values() if isinstance(s, list) and s and len(s[-1]) >= 2]
    if last:
        low = min(step for step, _t in last)
        f.last_step, f.last_step_t = low, min(t for step, t in last if step == low)
    else:
        f.last_step = ev.get("last_step")
    f.has_progress = True
    f.stopped = sorted({p.get("rank") for p in ev.get("stopped") or [] if isinstance(p, dict)}, key=str)
    f.busy = [str(i) for i in ev.get("busy") or []]
    f.idle = [str(i) for i in ev.get("idle") or []]
    f.step_time_p95 = _num(ev.get("step_time_p95"))


def _from_heartbeat(
    f: NodeFacts,
    summary: dict[str, Any],
    received_at: float | None,
    stall_start: float | None,
    first_action: float | None,
    cfg: HealthSettings,
) -> None:
    """Use the node's last heartbeat only if it was sampled during the stall and before any node
    was stopped (Aerie's own stop SIGCONTs stopped ranks and kills the rest)."""
    sent = _num(summary.get("t")) or received_at
    own = _num(summary.get("last_step_t"))
    known = [x for x in (stall_start, own) if x is not None]
    if sent is None or not known or sent < max(known) + cfg.sample_s:
        return  # not known to be taken during the stall: it may show the node before it
    if first_action is not None and sent >= first_action:
        return
    f.source = "heartbeat"
    f.last_step, f.last_step_t = summary.get("last_step"), own
    f.has_progress = True
    procs = [p for p in summary.get("processes") or [] if isinstance(p, dict)]
    f.stopped = sorted({p.get("rank") for p in procs if p.get("state") in STOPPED_PROCESS_STATES}, key=str)
    busy_at = max(cfg.gpu_idle_util, 0.5 * cfg.busy_util)
    for a in summary.get("accelerators") or []:
        util = _num(a.get("util")) if isinstance(a, dict) else None
        if util is None:
            continue
        if util >= busy_at:
            f.busy.append(str(a.get("index")))
        elif util < cfg.gpu_idle_util:
            f.idle.append(str(a.get("index")))
    f.step_time_p95 = _num(summary.get("step_time_p95"))


# --------------------------------------------------------------------------- helpers


def _link_down(evidence: dict[str, Any]) -> bool:
    return evidence.get("link") not in (None, "up", "unknown")


def _opposite(state: str) -> str:
    return "busy" if state == "idle" else "idle"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _blame(host: str, kind: str, rule: BlameRule, why: str, evidence: dict[str, Any]) -> NodeBlame:
    return {"host": host, "kind": str(kind), "rule": rule.value, "why": why, "evidence": evidence}


def _all(
    hosts: list[str], kind: str, rule: BlameRule, why: str, evidence: dict[str, Any]
) -> tuple[list[NodeBlame], str]:
    return [_blame(h, kind, rule, why, evidence) for h in hosts], f"{kind}: {', '.join(hosts)}: {why}"
