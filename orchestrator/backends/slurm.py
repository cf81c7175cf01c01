"""The `slurm` backend: one `sbatch` per launched attempt, whose `srun` starts one agent per node.

Launch renders a batch script and a `launch.json` beside it under the attempt's directory (which
must be on a filesystem the nodes share: the same machine on the emulated cluster). The script
holds only `#SBATCH` lines whose values are checked against a strict pattern and a fixed `srun`
line; every user value (entrypoint, hyperparameters, env, token) travels in `launch.json`, read
on each node by `agent.slurm`, which builds the node's contract and execs the agent.

State comes from Slurm (`scontrol show job`, then `sacct` for jobs slurmctld has forgotten)
combined with the nodes' own `agent/exit.json`,
which say why a node ended (a verdict, a rank's exit code, a stop). Stop is `scancel`: Slurm sends
SIGTERM to every process of the job, then SIGKILL after `KillWait`. The handle is plain JSON, so a
restarted control plane re-adopts running jobs.

An in-place attempt (issue #22) submits no allocation of its own (at most spares', below): the
failed attempt's agents are still up in its allocation and restart their worker groups for it.
Its handle is the allocation's, with the attempt's id (only that attempt's node outcomes count,
not the Slurm job's end) and a rendezvous port of its own; every stop still ends the whole
allocation, and a relaunch is a new `sbatch`.

Hot spares (`resources.spare_nodes: K`, issue #23) are K more nodes of the same allocation
(`--nodes=N+K`): the nodes sort the job's hosts and take the first N as the attempt's, the last K
as spares (`agent.slurm`), which wait without ranks for the control plane's word. The nodes are
known only once the job starts, so `poll` returns the handle with them (`PollResult.handle`). A
blamed or lost node's slot goes to a spare in an in-place attempt of the same job. A fixed
allocation cannot grow, so the pool is replenished beside it: the in-place attempt that hands U
spares a slot submits a *spare allocation*, a second `sbatch` of U nodes (`--exclude=` every node
the job has used, the blamed ones among them) whose agents, started from the same launch.json path
and `agent.slurm`, are all spares of that attempt. Its nodes join the handle's `spares` (and the
memory ring's peers) once they record themselves, so a later in-place attempt hands one a slot as
it hands a main-allocation spare one. The handle lists the spare allocations
(`spare_allocations`); every stop and fence cancels them with the main one, and a relaunch (a new
`sbatch`) asks for K again.

The in-memory checkpoint tier (issue #22) runs here too: the attempt's replication key travels in
`launch.json` (and the handle), and each node derives every node's replication endpoint from the
job id, as the rendezvous port is derived (`agent.slurm.memory_peers`); the nodes record them in
`hosts.json`, and `poll` adds them to the handle for the in-place hand-over.

Over 400 lines on purpose: one Backend implementation (launch, poll, stop, fence) and the
validation of every value that reaches a batch script, which must stay next to the script it guards.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aerie_contracts import FailureKind, memckpt
from aerie_contracts import env as aerie_env
from aerie_contracts.states import AttemptState
from agent.contract import read_json, write_json
from orchestrator.backends import base, in_place
from orchestrator.backends.base import Backend, LaunchRequest, NodeStatus, PollResult
from orchestrator.backends.nodeenv import (
    attempt_env,
    channels,
    in_place_env,
    in_place_on,
    inherited_env,
    memory_attempt_env,
)
from orchestrator.backends.placement import PlacementError
from recovery.modes import memory_tier_off

log = logging.getLogger(__name__)

# A value that may appear on an #SBATCH line: no spaces, quotes, newlines or shell syntax.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:\[\]=/@+%-]{1,256}$")
SLURM_TIMEOUT_S = 30.0
# Slurm states, grouped by what they mean for the attempt.
PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
}
# What sbatch answers when no set of nodes could ever hold the job (e.g. too many excluded).
UNPLACEABLE = "Requested node configuration is not available"
# A job Slurm has forgotten and `sacct` does not list: after this long, call it lost.
FORGOTTEN_AFTER_S = 60.0
# Each in-place attempt's rendezvous moves this far (modulo the span) from the allocation's port: a
# prime far from 1, so that jobs with nearby ids (nearby derived ports) do not meet on one.
IN_PLACE_PORT_STRIDE = 7919


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries its stderr."""


# Minutes the default `--time` adds to max_runtime_s (see `SlurmOptions.resolve`).
SLURM_TIME_BACKSTOP_MIN = 30


@dataclass(frozen=True)
class SlurmOptions:
    """What the batch script asks Slurm for, from `backend_options.slurm` over control-plane defaults."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    network_interface: str | None = None
    master_port: int | None = None

    @classmethod
    def resolve(cls, spec: Any, defaults: SlurmOptions) -> SlurmOptions:
        raw = dict((spec.backend_options or {}).get("slurm") or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown backend_options.slurm keys {sorted(unknown)}; known: {sorted(known)}")
        merged = {k: raw.get(k, getattr(defaults, k)) for k in known}
        if merged["time"] is None:
            # A backstop only, well above the limit: the control plane enforces max_runtime_s (and
            # max_wait_s) itself with an orderly stop (orchestrator/stopping.py: SIGTERM, the save
            # in flight commits, the job ends Stopped with MaxRuntimeExceeded). Slurm's TIMEOUT at
            # max_runtime_s would race that stop and end the attempt as a failure; this one acts
            # only if the control plane is down that long.
            merged["time"] = str(math.ceil(spec.stopping.max_runtime_s / 60) + SLURM_TIME_BACKSTOP_MIN)  # minutes
        return cls(**merged)


class SlurmBackend(Backend):
    name = "slurm"
    # After a failed worker group, an agent waits this long for an in-place successor, then exits
    # (and the allocation ends with it: `srun --kill-on-bad-exit`).
    in_place_wait_s = 120.0

    def __init__(self, jobs_dir: Path, defaults: SlurmOptions | None = None, python: str | None = None):
        self.jobs_dir = Path(jobs_dir)
        self.defaults = defaults or SlurmOptions()
        # The interpreter the nodes run: this one, on a filesystem they share.
        self.python = python or sys.executable

    @classmethod
    def from_env(cls, jobs_dir: Path) -> SlurmBackend:
        """Cluster-wide defaults from AERIE_SLURM_PARTITION / _ACCOUNT / _PYTHON."""
        env = os.environ
        return cls(
            jobs_dir,
            SlurmOptions(
                partition=env.get(aerie_env.SLURM_PARTITION) or None, account=env.get(aerie_env.SLURM_ACCOUNT) or None
            ),
            python=env.get(aerie_env.SLURM_PYTHON) or None,
        )

    @staticmethod
    def available() -> bool:
        return shutil.which("sbatch") is not None

    def check(self) -> tuple[bool, str]:
        """Reachable when `sinfo` answers; the detail names the partitions' node states."""
        try:
            out = _run(["sinfo", "-h", "-o", "%P %a %D %t"])
        except (SlurmError, OSError) as exc:
            return False, str(exc).strip().splitlines()[-1]  # the fatal line says it best
        return True, "; ".join(line.strip() for line in out.splitlines() if line.strip()) or "no partitions"

    # --- launch -----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        if request.in_place_of is not None:
            return self._in_place(request)
        spec = request.spec
        root = self.jobs_dir / request.job_id / f"attempt-{request.attempt_number}"
        handle: dict[str, Any] = {
            "root": str(root),
            "hosts": [],
            "slurm_job_id": None,
            "job_name": request.attempt_id,
            "nodes": spec.resources.instance_count,
        }
        if spare_nodes(spec):
            handle["spare_nodes"] = spare_nodes(spec)
        if memory_tier_off(spec.model_dump(), self.name) is None:
            handle[memckpt.HANDLE_KEY] = memckpt.new_key()  # the attempt's replication key
        root.mkdir(parents=True, exist_ok=True)
        recorded = read_json(root / "handle.json")
        if isinstance(recorded, dict) and recorded.get("slurm_job_id"):
            return recorded
        # Idempotent: a controller that died between sbatch and recording the id finds the job by name.
        existing = _find_job_by_name(request.attempt_id)
        if existing is None:
            options = SlurmOptions.resolve(spec, self.defaults)
            workdir = Path(spec.backend_options.get("workdir") or os.getcwd())
            launch_path = root / "launch.json"
            document = launch_document(request, root, workdir, options, self.in_place_wait_s)
            if handle.get(memckpt.HANDLE_KEY):
                document["env"]["attempt"].update(memory_attempt_env(spec, handle[memckpt.HANDLE_KEY]))
                document["memory_root"] = str(memckpt.root_dir())  # each node's folder beneath
            write_json(launch_path, document)
            os.chmod(launch_path, 0o600)  # it holds the agent token
            script = root / "job.sbatch"
            script.write_text(render_script(request, options))
            # Slurm copies the submitting environment into the job: never the control plane's own
            # AERIE_* (database URL, tokens); the nodes get theirs from launch.json.
            env = {**inherited_env(), aerie_env.SLURM_LAUNCH: str(launch_path), aerie_env.SLURM_PYTHON: self.python}
            try:
                out = _run(["sbatch", "--parsable", "--export=ALL", str(script)], cwd=root, env=env)
            except SlurmError as exc:
                if request.exclude_nodes and UNPLACEABLE in str(exc):
                    raise PlacementError(
                        f"Slurm cannot place {spec.resources.instance_count} node(s) with "
                        f"{', '.join(request.exclude_nodes)} excluded after blame: {exc}"
                    ) from None
                raise
            existing = int(out.strip().split(";")[0])
        handle["slurm_job_id"] = existing
        write_json(root / "handle.json", handle)
        return handle

    def _in_place(self, request: LaunchRequest) -> dict[str, Any]:
        """A warm attempt in the failed attempt's allocation: no `sbatch` but the replenished
        spares' (`_spare_allocation`), where spares took slots. Its agents learn of it
        from the control plane (GET .../next, which hands it only to the handle's hosts) and restart
        their worker groups on a new rendezvous port. The handle is the allocation's, told to read
        only this attempt's outcomes, beside the allocation's own (idempotent per attempt)."""
        previous = request.in_place_of
        assert previous is not None
        root = Path(previous["root"])
        path = root / f"handle-{request.attempt_number}.json"
        existing = read_json(path)
        if isinstance(existing, dict) and existing.get("attempt_id") == request.attempt_id:
            return existing
        hosts = list(previous.get("hosts") or []) or _hosts(root)
        if not hosts or not previous.get("slurm_job_id"):
            raise SlurmError(f"no running allocation to restart {request.attempt_id} in place (handle {previous})")
        port = in_place_port(root, int(previous["slurm_job_id"]), in_place.restarts_of(previous))
        handle = in_place.next_handle(previous, request, master_port=port, hosts=hosts)
        used = in_place.spares_taken(previous, request)
        if request.replace_nodes:
            # A spare may hold rank 0's slot now: the agents' rendezvous moves to its address.
            handle["master_addr"] = node_address(handle["hosts"][0])
        if used:
            # The allocation cannot grow: the pool is refilled by an allocation of its own.
            allocation = self._spare_allocation(request, root, handle, len(used))
            if allocation is not None:
                handle["spare_allocations"] = [*(previous.get("spare_allocations") or []), allocation]
        write_json(path, handle)
        return handle

    def _spare_allocation(
        self, request: LaunchRequest, root: Path, handle: dict[str, Any], count: int
    ) -> dict[str, Any] | None:
        """Submit `count` replenished hot spares of `handle`'s in-place attempt: an `sbatch` of
        their own whose agents (`agent.slurm` with `nodes: 0`: all spares) wait for a slot with this
        attempt's token, in node directories beside the main allocation's (the handle's root, so a
        later attempt's poll finds a spare that took a slot where it finds every node). None when
        Slurm cannot place them: a spare is a bonus, never a reason to fail the attempt.
        Idempotent: a job of this name already submitted (a controller that died between sbatch
        and recording the handle) is the one."""
        spec = request.spec
        name = f"{request.attempt_id}-spares"
        folder = root / f"spares-{request.attempt_number}"
        folder.mkdir(parents=True, exist_ok=True)
        # Every node this allocation family ever ran on is left out, not only the blamed ones: a
        # node directory under the root belongs to one agent (its pid, outcome and logs).
        ran = {p.parent.name for p in root.glob("*/agent")}
        exclude = sorted(
            {*handle["hosts"], *handle.get("spares", []), *request.replace_nodes, *request.exclude_nodes, *ran}
        )
        earlier = handle.get("spare_allocations") or []
        # The memory ring's ports continue after the main allocation's nodes and earlier spares'.
        index = (
            int(handle.get("nodes") or 0) + int(handle.get("spare_nodes") or 0) + sum(int(a["nodes"]) for a in earlier)
        )
        # The attempt it serves: its agents speak with that attempt's token (GET .../next finds
        # them by it when only a later attempt's poll learned their hosts).
        allocation: dict[str, Any] = {
            "job_name": name,
            "attempt_id": request.attempt_id,
            "nodes": count,
            "root": str(folder),
            "exclude": exclude,
        }
        existing = _find_job_by_name(name)
        if existing is None:
            options = SlurmOptions.resolve(spec, self.defaults)
            workdir = Path(spec.backend_options.get("workdir") or os.getcwd())
            document = launch_document(request, root, workdir, options, self.in_place_wait_s)
            # Spares of this attempt only: no ranks until an in-place attempt hands one a slot.
            document.update({"nodes": 0, "hosts_file": str(folder / "hosts.json")})
            if handle.get(memckpt.HANDLE_KEY):
                document["env"]["attempt"].update(memory_attempt_env(spec, handle[memckpt.HANDLE_KEY]))
                document["memory_root"] = str(memckpt.root_dir())
                document["memory_job_id"] = int(handle["slurm_job_id"])
                document["memory_index"] = index
            launch_path = folder / "launch.json"
            write_json(launch_path, document)
            os.chmod(launch_path, 0o600)  # it holds the agent token
            script = folder / "job.sbatch"
            try:
                text = render_script(request, options, job_name=name, nodes=count, exclude=[_hostlist(exclude)])
            except ValueError as exc:  # too many nodes to exclude on one #SBATCH line
                log.warning("%s: no replenished hot spare (%s)", request.attempt_id, exc)
                return None
            script.write_text(text)
            env = {**inherited_env(), aerie_env.SLURM_LAUNCH: str(launch_path), aerie_env.SLURM_PYTHON: self.python}
            try:
                out = _run(["sbatch", "--parsable", "--export=ALL", str(script)], cwd=folder, env=env)
            except SlurmError as exc:
                log.warning("%s: no replenished hot spare (%s)", request.attempt_id, exc)
                return None
            existing = int(out.strip().split(";")[0])
        allocation["slurm_job_id"] = existing
        if handle.get(memckpt.HANDLE_KEY):
            allocation["memory_index"] = index
        return allocation

    # --- poll -------------------------------------------------------------------------------

    def poll(self, handle: dict[str, Any]) -> PollResult:
        root = Path(handle["root"])
        job = slurm_job_state(int(handle["slurm_job_id"]))
        stop = read_json(root / "stop.json")
        # The handle's hosts once known (an in-place attempt's, a spare in a failed node's slot).
        hosts = list(handle.get("hosts") or []) or _hosts(root)
        learned = _learned(handle, root)
        learned = _learned_spares(learned or handle) or learned
        slurm_state = job["state"] if job else None
        if slurm_state is None:
            # Neither scontrol nor sacct knows it (yet): give a fresh submission time to show up.
            age = time.time() - (root / "handle.json").stat().st_mtime if (root / "handle.json").exists() else 0
            slurm_state = "PENDING" if age < FORGOTTEN_AFTER_S else "LOST"
        if slurm_state in PENDING:
            queued = tuple(NodeStatus(h, AttemptState.STARTING) for h in hosts)
            return PollResult(AttemptState.STARTING, queued, queued=True, handle=learned)

        ended = slurm_state not in RUNNING
        # An allocation serves several attempts in place: only this attempt's outcomes count.
        attempt_id = handle.get("attempt_id")
        nodes = [_node_status(root / h, h, ended, bool(stop), slurm_state, attempt_id) for h in hosts]
        if ended and not nodes:
            # The job ended before any node started (bad partition, node failure at boot, ...).
            if stop or slurm_state == "CANCELLED":
                return PollResult(AttemptState.STOPPED)
            reason = _slurm_reason(slurm_state, job, root)
            return PollResult(AttemptState.FAILED, reason=reason, exit_code=(job or {}).get("exit_code") or 1)
        result = base.summarize_nodes(nodes)
        if stop and result.state == AttemptState.FAILED:
            result = PollResult(AttemptState.STOPPED, result.nodes)  # nodes that died of our own stop request
        if ended and not result.terminal:
            result = PollResult(AttemptState.FAILED, result.nodes, _slurm_reason(slurm_state, job, root), 1)
        return dataclasses.replace(result, handle=learned) if learned else result

    # --- stop and logs ----------------------------------------------------------------------

    def stop(self, handle: dict[str, Any]) -> None:
        root = Path(handle["root"])
        first = not (root / "stop.json").exists()
        if first:
            write_json(root / "stop.json", {"t": time.time()})
        stop = read_json(root / "stop.json") or {}
        # scancel once, and again if Slurm still runs it much later (a lost cancel, a slurmctld restart).
        if first or time.time() - float(stop.get("t", 0)) > 45:
            for job_id in [handle["slurm_job_id"], *_spare_job_ids(handle)]:
                try:
                    _run(["scancel", str(job_id)])
                except SlurmError:
                    pass  # already gone
            if not first:
                write_json(root / "stop.json", {**stop, "t": time.time()})

    def fence(self, handle: dict[str, Any], hosts: list[str]) -> None:
        """SIGKILL the attempt's job steps (the `srun` that runs the agents), wherever slurmd can
        still reach; the batch script then ends and the job with it. Per step, not per job: Slurm
        takes `scancel --signal=KILL <job>` for a cancel, which sends SIGCONT and SIGTERM first, and a
        paused rank would resume into its graceful save. The stop marker written here keeps the
        controller's `stop` that follows from cancelling (so signalling) the job for 45 s. A node
        slurmd cannot reach is fenced by the store (its attempt's commits are refused)."""
        write_json(Path(handle["root"]) / "stop.json", {"t": time.time(), "fenced": True, "hosts": list(hosts)})
        # The replenished spares run no ranks (nothing to pause or save): a plain cancel, now,
        # since the stop marker keeps the controller's `stop` from cancelling them for 45 s.
        for spare_job in _spare_job_ids(handle):
            try:
                _run(["scancel", str(spare_job)])
            except SlurmError:
                pass  # already gone
        job_id = handle.get("slurm_job_id")
        if not job_id:
            return
        for step in _job_steps(int(job_id)) or [f"{job_id}.0"]:
            try:
                _run(["scancel", "--signal=KILL", step])
            except SlurmError:
                pass  # already gone

    def logs(
        self, handle: dict[str, Any], offsets: dict[str, int] | None = None, max_bytes: int = 1 << 20
    ) -> dict[str, dict[str, Any]]:
        """Every node's `logs/node.log`, plus Slurm's own output of the batch step under `slurm`."""
        root = Path(handle["root"])
        files = {h: root / h / "logs" / "node.log" for h in _hosts(root) or handle.get("hosts") or []}
        batch = root / f"slurm-{handle['slurm_job_id']}.out"
        if batch.exists() and batch.stat().st_size:
            files["slurm"] = batch
        return {
            host: base.read_log_chunk(path, (offsets or {}).get(host, 0), max_bytes) for host, path in files.items()
        }


# --- rendering ------------------------------------------------------------------------------------


def render_script(
    request: LaunchRequest,
    options: SlurmOptions,
    *,
    job_name: str | None = None,
    nodes: int | None = None,
    exclude: list[str] | None = None,
) -> str:
    """The batch script: checked #SBATCH values and a fixed srun line; nothing else from the user.
    The attempt's allocation by default; a spare allocation names its own job, node count and
    excluded nodes."""
    spec = request.spec
    count = int(spec.resources.instance_count) + spare_nodes(spec) if nodes is None else int(nodes)
    lines = [
        "#!/bin/bash",
        f"# Aerie attempt {_safe(request.attempt_id, 'attempt id')} of job {_safe(request.job_id, 'job id')}.",
        "# Rendered by orchestrator/backends/slurm.py. Every user value is in launch.json beside",
        "# this script ($AERIE_SLURM_LAUNCH); agent.slurm reads it on each node.",
        f"#SBATCH --job-name={_safe(job_name or request.attempt_id, 'job name')}",
        f"#SBATCH --nodes={count}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=slurm-%j.out",
        "#SBATCH --open-mode=append",
    ]
    # The optional text values, each checked, on a line only where set: (option, value, its name).
    texts = [
        ("exclude", ",".join(request.exclude_nodes if exclude is None else exclude), "exclude_nodes"),
        ("partition", options.partition, "partition"),
        ("account", options.account, "account"),
        ("time", str(options.time or ""), "time"),
    ]
    lines += [f"#SBATCH --{option}={_safe(value, what)}" for option, value, what in texts if value]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{int(options.gpus_per_node)}")
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={int(options.cpus_per_task)}")
    # One task per node; if one node's agent fails, Slurm ends the others (the attempt has failed).
    # Not with hot spares: a failed or replaced node's agent exits while the others and a spare go
    # on in place (the control plane ends the allocation: `stop`).
    kill = 0 if spare_nodes(spec) or nodes is not None else 1
    lines += [
        "set -eu",
        f"exec srun --kill-on-bad-exit={kill} --ntasks-per-node=1"
        ' "$AERIE_SLURM_PYTHON" -m agent.slurm "$AERIE_SLURM_LAUNCH"',
        "",
    ]
    return "\n".join(lines)


def launch_document(
    request: LaunchRequest, root: Path, workdir: Path, options: SlurmOptions, in_place_wait_s: float = 0.0
) -> dict[str, Any]:
    """launch.json: what `agent.slurm` needs to build each node's contract and environment (with
    `in_place_wait_s`, agents that wait that long for an in-place successor after a failed group)."""
    spec = request.spec
    attempt = attempt_env(request, workdir)
    if in_place_wait_s > 0:
        attempt.update(in_place_env(spec, in_place_wait_s))
    return {
        "root": str(root),
        "workdir": str(workdir),
        "hyperparameters": dict(spec.hyperparameters),
        "channels": channels(spec),
        "network_interface": options.network_interface,
        "master_port": options.master_port,
        # The first `nodes` of the job's sorted hosts run the attempt; the others are hot spares.
        "nodes": int(spec.resources.instance_count),
        "env": {"user": dict(spec.env), "extra": dict(request.extra_env), "attempt": attempt},
    }


def in_place_port(root: Path, slurm_job_id: int, restarts: int) -> int:
    """The rendezvous port of the allocation's `restarts`-th in-place attempt: the allocation's own
    (`backend_options.slurm.master_port`, else derived from the job id as the nodes derive it:
    agent.identity.master_port) moved by a stride within Slurm's port range. A port of its own, so
    a new worker group never joins a store the last group's torchrun still serves."""
    launch = read_json(root / "launch.json") or {}
    base = (launch.get("master_port") if isinstance(launch, dict) else None) or (
        aerie_env.SLURM_PORT_BASE + slurm_job_id % aerie_env.SLURM_PORT_SPAN
    )
    low, span = aerie_env.SLURM_PORT_BASE, aerie_env.SLURM_PORT_SPAN
    return in_place.rendezvous_port(base, restarts, low, span, IN_PLACE_PORT_STRIDE)


def _safe(value: str, what: str) -> str:
    if not SAFE_VALUE.match(value):
        raise ValueError(f"{what} {value!r} cannot go on an #SBATCH line (allowed: {SAFE_VALUE.pattern})")
    return value


# --- talking to Slurm ------------------------------------------------------------------------------


def _run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed (infra/local/slurm/up.sh installs Slurm)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} did not answer in {SLURM_TIMEOUT_S:.0f} s") from None
    if r.returncode != 0:
        raise SlurmError(f"{' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout).strip()[:500]}")
    return r.stdout


def node_address(node: str) -> str:
    """The address Slurm itself uses for `node` (its NodeAddr, as the agents derive it:
    agent.slurm.node_address); the name when Slurm does not say (a resolvable name serves too)."""
    try:
        out = _run(["scontrol", "show", "node", "-o", node])
    except SlurmError:
        return node
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node


def slurm_job_state(job_id: int) -> dict[str, Any] | None:
    """{"state", "reason", "exit_code", "nodes"} of a job, or None if Slurm knows nothing of it.

    `scontrol show job` while slurmctld remembers the job (MinJobAge after it ends), then `sacct`
    (accounting, or the jobcomp file with -c). Not `squeue --json`: in Slurm 22.05 it ignores
    `--jobs` and dumps every job in the cluster, too much for a poll every second. Raises
    SlurmError when slurmctld does not answer, so the poll fails and is retried instead of
    declaring a running job lost.
    """
    try:
        out = _run(["scontrol", "show", "job", "-o", str(job_id)])
    except SlurmError as exc:
        if "Invalid job id" not in str(exc):
            raise
        return _from_sacct(job_id)
    line = out.strip().splitlines()[0] if out.strip() else ""
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return {
        "state": _state_word(fields.get("JobState")),
        "reason": fields.get("Reason"),
        "exit_code": _exit_code(fields.get("ExitCode")),
        "nodes": fields.get("NodeList", ""),
    }


def _state_word(value: Any) -> str:
    if isinstance(value, list):  # JSON output of Slurm >= 23.02: a list of flags, the base state first
        value = value[0] if value else ""
    return str(value or "").split()[0].upper() if value else ""


def _exit_code(value: Any) -> int | None:
    if isinstance(value, dict):  # JSON output of Slurm >= 23.02: {"status", "return_code": {"number"}}
        rc = value.get("return_code")
        return int(rc.get("number", 0)) if isinstance(rc, dict) else int(rc or 0)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return int(value.split(":")[0])  # "2:0" = exit code 2, signal 0
    return int(value)


def _from_sacct(job_id: int) -> dict[str, Any] | None:
    """Finished jobs slurmctld has forgotten: the accounting database, or the jobcomp file (-c)."""
    for extra in ([], ["-c"]):
        try:
            out = _run(["sacct", *extra, "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State,ExitCode,NodeList"])
        except SlurmError:
            continue
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 4 and parts[0] == str(job_id):
                return {
                    "state": _state_word(parts[1]),
                    "reason": None,
                    "exit_code": _exit_code(parts[2]),
                    "nodes": parts[3],
                }
    return None


def _job_steps(job_id: int) -> list[str]:
    """The job's running steps, `<job>.<n>` (none known: an empty list)."""
    try:
        out = _run(["squeue", "-h", "--steps", f"--job={job_id}", "-o", "%i"])
    except SlurmError:
        return []
    return [s for s in out.split() if re.fullmatch(rf"{job_id}\.\d+", s)]


def _hostlist(names: list[str]) -> str:
    """`names` for an #SBATCH value: joined with commas, or where that is too long for one
    (a spare allocation excludes every node a large job used), Slurm's own compressed form
    (`scontrol show hostlist`: node[1-64]); the joined names when scontrol does not answer."""
    joined = ",".join(names)
    if len(joined) <= 256:
        return joined
    try:
        return _run(["scontrol", "show", "hostlist", joined]).strip() or joined
    except SlurmError:
        return joined


def _find_job_by_name(name: str) -> int | None:
    try:
        out = _run(["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i"])
    except SlurmError:
        return None
    ids = [int(x) for x in out.split() if x.strip().isdigit()]
    return max(ids) if ids else None


# --- reading the nodes' files ----------------------------------------------------------------------


def _learned(handle: dict[str, Any], root: Path) -> dict[str, Any] | None:
    """The launched handle with its allocation's hosts and hot spares as the nodes recorded them
    (hosts.json), once they have and the handle does not say yet; None otherwise."""
    if handle.get("hosts") or handle.get("in_place"):
        return None
    data = read_json(root / "hosts.json")
    if not isinstance(data, dict) or not data.get("hosts"):
        return None
    learned = {**handle, "hosts": list(data["hosts"])}
    for key in ("spares", "memory_peers"):
        if data.get(key):
            learned[key] = data[key]
    return learned


def _learned_spares(handle: dict[str, Any]) -> dict[str, Any] | None:
    """The handle with its spare allocations' nodes among its hot spares (and their endpoints in
    the memory ring's peers), for each allocation whose nodes recorded themselves (its
    hosts.json) and the handle does not know yet; None when nothing is new."""
    allocations = handle.get("spare_allocations") or []
    if not any("hosts" not in a for a in allocations):
        return None
    learned = {**handle, "spare_allocations": [dict(a) for a in allocations]}
    changed = False
    for allocation in learned["spare_allocations"]:
        if "hosts" in allocation:
            continue
        data = read_json(Path(allocation["root"]) / "hosts.json")
        if not isinstance(data, dict) or not data.get("spares"):
            continue
        fresh = [h for h in data["spares"] if h not in learned.get("hosts", []) and h not in learned.get("spares", [])]
        allocation["hosts"] = list(data["spares"])
        learned["spares"] = [*(learned.get("spares") or []), *fresh]
        if data.get("memory_peers") and learned.get("memory_peers"):
            # Only where the tier is on (the main allocation's ring is known): the ring grows.
            learned["memory_peers"] = {**data["memory_peers"], **learned["memory_peers"]}
        changed = True
    return learned if changed else None


def _spare_job_ids(handle: dict[str, Any]) -> list[int]:
    return [int(a["slurm_job_id"]) for a in handle.get("spare_allocations") or [] if a.get("slurm_job_id")]


def spare_nodes(spec: Any) -> int:
    """How many hot spares the allocation holds: `resources.spare_nodes` where the agents wait
    between attempts (in-place restarts possible), else none (as on the local backend)."""
    return int(spec.resources.spare_nodes) if in_place_on(spec) else 0


def _hosts(root: Path) -> list[str]:
    data = read_json(root / "hosts.json")
    if isinstance(data, dict):
        return list(data.get("hosts") or [])
    # Before the first node wrote hosts.json, the node directories tell which nodes started.
    return sorted(p.parent.parent.name for p in root.glob("*/agent/agent.pid"))


def _node_status(
    ml_root: Path, host: str, job_ended: bool, stop: bool, slurm_state: str, attempt_id: str | None = None
) -> NodeStatus:
    ended = base.node_outcome(ml_root, host, attempt_id)
    if ended is not None:
        return ended
    if not job_ended:
        running = (ml_root / "agent" / "agent.pid").exists()
        return NodeStatus(host, AttemptState.RUNNING if running else AttemptState.STARTING)
    # Slurm ended the job and this node's agent never wrote its outcome: killed or lost with its node.
    message = f"agent ended without reporting an exit (Slurm job state {slurm_state})"
    return base.ended_without_outcome(host, stop or slurm_state == "CANCELLED", message)


def _slurm_reason(state: str, job: dict[str, Any] | None, root: Path) -> dict[str, Any]:
    detail = (job or {}).get("reason")
    kind = {
        "NODE_FAIL": FailureKind.NODE_LOST,
        "BOOT_FAIL": FailureKind.NODE_LOST,
        "LOST": FailureKind.NODE_LOST,
        "TIMEOUT": "timeout",
        "DEADLINE": "timeout",
        "OUT_OF_MEMORY": FailureKind.EXIT_OOM,
        "PREEMPTED": FailureKind.NODE_PREEMPTED,
    }.get(state, FailureKind.LAUNCH_FAILED)
    message = f"Slurm job ended {state}" + (f" ({detail})" if detail and detail != "None" else "")
    tail = _tail(root / f"slurm-{_job_id_of(root)}.out")
    if tail:
        message += f": {tail}"
    return {"kind": kind, "message": message[:1000], "slurm_state": state}


def _job_id_of(root: Path) -> Any:
    handle = read_json(root / "handle.json") or {}
    return handle.get("slurm_job_id") if isinstance(handle, dict) else None


def _tail(path: Path, n: int = 400) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
