"""The small interface every backend implements (after SkyPilot's `Backend`).

A backend turns one attempt into running nodes and reports how they are doing. It keeps no state
of its own in memory: everything needed to find the attempt again lives in the JSON `handle` it
returns, which the controller stores, so a restarted control plane re-adopts running attempts.
(The one exception, the local backend's launch requests, which hold an agent token and so are
never stored, is handed back to a restarted control plane's backend rebuilt: `Backend.adopt`.)
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aerie_contracts import FailureKind
from aerie_contracts.backends import Capabilities, capabilities
from aerie_contracts.states import ATTEMPT_TERMINAL, AttemptState
from orchestrator.spec import JobSpec

# The attempt states a backend reports (Pending and Launching are the controller's own).
BackendState = Literal[
    AttemptState.STARTING, AttemptState.RUNNING, AttemptState.COMPLETED, AttemptState.FAILED, AttemptState.STOPPED
]


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    job_name: str
    attempt_id: str
    attempt_number: int
    spec: JobSpec
    api_url: str
    agent_token: str
    resume_from: str | None = None
    exclude_nodes: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    # An in-place attempt (aerie_contracts.restarts): the failed attempt's handle, whose nodes'
    # agents are still up and restart their worker groups for this one; None: launch anew.
    in_place_of: dict[str, Any] | None = None
    # With `in_place_of`: hot spares that take failed nodes' rank slots ({failed host: spare host}).
    replace_nodes: dict[str, str] = field(default_factory=dict)
    # A relaunch's hot spares still waiting from the attempt before ({host: {"root": its attempt's
    # directory, "peer": its memory-tier endpoint}}): kept as this attempt's where the backend can.
    reuse_spares: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeStatus:
    host: str
    state: BackendState
    exit_code: int | None = None
    reason: dict[str, Any] | None = None
    ended_at: float | None = None


@dataclass(frozen=True)
class PollResult:
    state: BackendState
    nodes: tuple[NodeStatus, ...] = ()
    reason: dict[str, Any] | None = None
    exit_code: int | None = None
    # The platform has not allocated the attempt's machines yet (a Slurm job pending in the queue,
    # SageMaker provisioning instances): nodes are not expected to report, and the controller's
    # `health.first_heartbeat_s` clock has not started. Keyword-only, so subclasses keep their order.
    queued: bool = field(default=False, kw_only=True)
    # Hot spares that died while they waited and what replaced each ({dead: new}, "" for none): the
    # backend started the new ones, and `handle` (the attempt's, changed) is for the controller to store.
    spares_replaced: dict[str, str] = field(default_factory=dict, kw_only=True)
    # The handle with what the backend learned of the attempt since launch (Slurm: which nodes of
    # the allocation are its hosts and which its hot spares, known once the job starts); the
    # controller stores it in place of the old one. None: unchanged.
    handle: dict[str, Any] | None = field(default=None, kw_only=True)

    @property
    def terminal(self) -> bool:
        return self.state in ATTEMPT_TERMINAL


class Backend(abc.ABC):
    """The verbs a backend exposes (launch, restart_in_place, add_spares, poll, stop, fence, chaos,
    logs) and what it can do (`capabilities`, declared once in `aerie_contracts.backends`). Which
    verb follows a failure is the recovery package's decision, never a backend's."""

    name: str

    @property
    def capabilities(self) -> Capabilities:
        """This backend's row of `aerie_contracts.backends.CAPABILITIES`: what the recovery package
        decides with, far from any backend object (in a Lambda function)."""
        return capabilities(self.name)

    def start(self, request: LaunchRequest) -> dict[str, Any]:
        """The controller's one call for a new attempt: in place on the failed attempt's nodes when
        the request says so (`in_place_of`) and the backend still can, else a launch."""
        if request.in_place_of is not None and self.capabilities.in_place:
            handle = self.restart_in_place(request)
            if handle is not None:
                return handle
        return self.launch(request)

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        """Start the attempt's nodes anew; idempotent for one attempt id. Returns the handle."""

    def restart_in_place(self, request: LaunchRequest) -> dict[str, Any] | None:
        """The attempt on the failed attempt's nodes (`request.in_place_of`), whose agents are still
        up and restart their worker groups for it, hot spares taking `replace_nodes`' slots; one
        rendezvous-port rule for all (`orchestrator.backends.in_place`). Idempotent for one attempt
        id. Returns the handle, or None when the nodes are gone meanwhile (then `start` launches)."""
        raise NotImplementedError(f"the {self.name} backend does not restart in place")

    def add_spares(self, request: LaunchRequest, handle: dict[str, Any], count: int) -> dict[str, Any]:
        """Start `count` more hot spares beside the running attempt `handle` (launched by `request`,
        whose token the spares speak with) and return the handle with them (`spares`, and their
        endpoints in `memory_peers`), for the controller to store in place of the old one. Only
        where `capabilities.add_spares` (which implies `hot_spares`). Idempotent per handle: a
        second call with the same handle (the first's result not stored) returns the first's
        result and starts nothing; a call with the returned handle adds `count` more. `count` 0:
        the handle unchanged. Raises ValueError for a negative count or one the backend cannot
        place (more than the free slots), NotImplementedError where the backend cannot add any."""
        if not self.capabilities.hot_spares:
            raise NotImplementedError(f"the {self.name} backend has no hot spares (resources.spare_nodes)")
        raise NotImplementedError(f"the {self.name} backend cannot add hot spares to a running attempt")

    @abc.abstractmethod
    def poll(self, handle: dict[str, Any]) -> PollResult:
        """Where the attempt stands now."""

    @abc.abstractmethod
    def stop(self, handle: dict[str, Any]) -> None:
        """Ask every node to stop (non-blocking; later polls escalate if needed)."""

    # Whether `adopt` wants the running attempts a restarted control plane finds (building each
    # one's request mints an agent token: not done for backends that would drop it).
    adopts = False

    def adopt(self, request: LaunchRequest, handle: dict[str, Any]) -> None:
        """A running attempt this backend instance did not launch (the control plane restarted, or
        another one led when it was launched), with its request rebuilt as its launch built it (a
        fresh agent token): for a backend that keeps what it launched in memory (`local`: what a
        spare that dies while it waits is replaced with). Called once per attempt, before its first
        poll, only where `adopts`; never spawns anything. Default: nothing (the handle suffices)."""
        return None

    def chaos(self, handle: dict[str, Any], host: str, request: dict[str, Any]) -> None:
        """Hand a fault request (`aerie chaos`) to `host`'s agent. Backends that cannot reach their
        nodes' agents raise NotImplementedError."""
        raise NotImplementedError(f"the {self.name} backend cannot deliver faults to its nodes")

    def outcomes_from_agents(self, handle: dict[str, Any]) -> bool:
        """Whether the attempt's node outcomes come from its agents' exit reports rather than from
        `poll` (which cannot see them: `with_reported_exits`). Default: poll sees them."""
        return False

    def fence(self, handle: dict[str, Any], hosts: list[str]) -> None:
        """Kill what is left of lost nodes now, without a grace period (a paused or partitioned node
        must not come back and act for its attempt). What a backend cannot reach is fenced by the
        store instead: a superseded attempt's checkpoints are never recorded. Default: stop."""
        self.stop(handle)

    @abc.abstractmethod
    def logs(
        self, handle: dict[str, Any], offsets: dict[str, int] | None = None, max_bytes: int = 1 << 20
    ) -> dict[str, dict[str, Any]]:
        """Per host: {"text": new output since offsets[host], "offset": next offset}."""


def read_log_chunk(path: Path, start: int, max_bytes: int) -> dict[str, Any]:
    """Up to `max_bytes` of a node's log from byte `start` (negative: the last |start| bytes), as
    {"text", "offset"} where `offset` is where the next read continues."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if start < 0:
                start = max(0, size + start)
            f.seek(start)
            data = f.read(max_bytes)
    except FileNotFoundError:
        data = b""
        start = max(start, 0)
    return {"text": data.decode("utf-8", "replace"), "offset": start + len(data)}


def node_outcome(ml_root: Path, host: str, attempt_id: str | None = None) -> NodeStatus | None:
    """How a node ended, from the `agent/exit.json` its agent wrote (None while it runs). With
    `attempt_id` (a node whose agent serves several attempts in place), only that attempt's."""
    try:
        outcome = json.loads((ml_root / "agent" / "exit.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(outcome, dict):
        return None
    if attempt_id is not None and outcome.get("attempt") != attempt_id:
        return None  # the outcome of the attempt before, whose agent has not switched yet
    return outcome_status(host, outcome)


def outcome_status(host: str, outcome: dict[str, Any]) -> NodeStatus:
    """A node's status from its agent's outcome ({"exit_code", "reason", "t"}: exit.json, or the
    agent's own `POST .../exit`)."""
    code = int(outcome.get("exit_code", 1))
    reason = outcome.get("reason")
    if reason and reason.get("kind") == FailureKind.USER_STOP:
        state: BackendState = AttemptState.STOPPED
    else:
        state = AttemptState.COMPLETED if code == 0 else AttemptState.FAILED
    return NodeStatus(host, state, code, reason if code else None, outcome.get("t"))


def with_reported_exits(result: PollResult, reported: dict[str, dict[str, Any]]) -> PollResult:
    """The attempt's state from its agents' own exit reports (`POST .../exit`), for a backend that
    cannot read its nodes' outcomes while its job runs on (`Backend.outcomes_from_agents`: a
    SageMaker training job whose agents wait in place after a worker group ended stays InProgress).
    A failure an agent reported is the attempt's failure (the first, as in `summarize_nodes`),
    whatever the backend saw end after it; otherwise the reports end the attempt once they all say so."""
    if not reported:
        return result
    nodes = tuple(outcome_status(n.host, reported[n.host]) if n.host in reported else n for n in result.nodes)
    failed = [n for n in nodes if n.host in reported and n.state == AttemptState.FAILED]
    merged = summarize_nodes(failed) if failed else summarize_nodes(list(nodes))
    if not failed and (result.terminal or not merged.terminal):
        return result
    return dataclasses.replace(
        result, state=merged.state, nodes=nodes, reason=merged.reason, exit_code=merged.exit_code
    )


def ended_without_outcome(host: str, stop: bool, message: str) -> NodeStatus:
    """A node whose agent is gone without writing its outcome: stopped if we asked it to stop,
    else lost (killed, or its machine went away); `message` says how the backend saw it end."""
    if stop:
        return NodeStatus(host, AttemptState.STOPPED)
    return NodeStatus(
        host, AttemptState.FAILED, None, {"kind": FailureKind.NODE_LOST, "host": host, "message": message}, time.time()
    )


def _first_key(reason: dict[str, Any] | None, ended_at: float | None) -> float:
    return (reason or {}).get("at") or ended_at or float("inf")


# Verdicts that do not end an attempt by themselves: a straggler in `report` mode (in `restart`
# mode its reason is already the attempt's), and a NaN replay's finding, recorded after the fact.
_NOT_A_CAUSE = frozenset({FailureKind.NODE_STRAGGLER, FailureKind.SDC_SUSPECT})


def first_reported_cause(
    result: PollResult, reported: dict[str, dict[str, Any]], verdicts: Sequence[dict[str, Any]] = ()
) -> PollResult:
    """A failed attempt's cause from its agents' own exit reports (`POST .../exit`) and verdicts
    (`POST .../verdicts`), when the backend knows only that a node's program failed
    (`exit.nonzero`): SageMaker's FailureReason quotes one instance, not necessarily the first to
    fail, and a peer's collateral failure (its collective broke because the real culprit was
    stopped) must not take the blame. A node's agent posts its verdict before it stops its ranks,
    so the verdict is there while that node's own exit may still be on its way: a backend that
    saw the collateral exit first would otherwise name it. The earliest of them all is the cause,
    the backend's own reason included when it says when it happened (same rule as `summarize_nodes`)."""
    if result.state != AttemptState.FAILED or (result.reason or {}).get("kind") not in (None, FailureKind.EXIT_NONZERO):
        return result
    failed = [
        (e["reason"], e["exit_code"], _first_key(e["reason"], e.get("t")))
        for e in reported.values()
        if e.get("exit_code") and (e.get("reason") or {}).get("kind") not in (None, FailureKind.USER_STOP)
    ]
    failed += [
        (_verdict_reason(v), 1, float(v["t"]))
        for v in verdicts
        if v.get("kind") not in _NOT_A_CAUSE and v.get("t") is not None
    ]
    if not failed:
        return result
    own = _first_key(result.reason, next((n.ended_at for n in result.nodes if n.reason == result.reason), None))
    first = min(failed, key=lambda c: c[2])
    if result.reason and own <= first[2]:
        return result
    return PollResult(AttemptState.FAILED, result.nodes, first[0], first[1])


def _verdict_reason(v: dict[str, Any]) -> dict[str, Any]:
    """A verdict as the failure reason its agent writes when it stops for it (agent/outcome.py)."""
    return {"kind": v["kind"], "message": v.get("message", ""), "host": v.get("host"), "at": float(v["t"])}


def summarize_nodes(nodes: list[NodeStatus]) -> PollResult:
    """The attempt's state from its nodes': the first node to fail decides the reason."""
    failed = [n for n in nodes if n.state == AttemptState.FAILED]
    if failed:
        # The cause is what went wrong first: a rank's own exit or a verdict ("at"), which precedes
        # the node's exit by however long its launcher took to notice.
        first = min(failed, key=lambda n: _first_key(n.reason, n.ended_at))
        return PollResult(AttemptState.FAILED, tuple(nodes), first.reason, first.exit_code)
    if nodes and all(n.state == AttemptState.STOPPED for n in nodes):
        return PollResult(AttemptState.STOPPED, tuple(nodes))
    if nodes and all(n.state == AttemptState.COMPLETED for n in nodes):
        return PollResult(AttemptState.COMPLETED, tuple(nodes), exit_code=0)
    ended = (AttemptState.COMPLETED, AttemptState.STOPPED)
    if any(n.state in ended for n in nodes) and all(n.state in ended for n in nodes):
        return PollResult(AttemptState.STOPPED, tuple(nodes))
    if any(n.state == AttemptState.RUNNING for n in nodes):
        return PollResult(AttemptState.RUNNING, tuple(nodes))
    return PollResult(AttemptState.STARTING, tuple(nodes))
