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

Beside it: the batch script, `launch.json` and the options they come from (`slurm_script`), Slurm's
command line and the parsing of its answers (`slurm_cli`), and the files the nodes write that
`poll` reads (`slurm_nodes`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from aerie_contracts import env as aerie_env
from aerie_contracts import memckpt
from aerie_contracts.container import read_json, write_json
from aerie_contracts.states import AttemptState
from orchestrator.backends import base, in_place, slurm_cli, slurm_nodes
from orchestrator.backends.base import Backend, LaunchRequest, NodeStatus, PollResult
from orchestrator.backends.nodeenv import (
    inherited_env,
    memory_attempt_env,
)
from orchestrator.backends.slurm_cli import SlurmError
from orchestrator.backends.slurm_script import SlurmOptions, launch_document, render_script, spare_nodes
from orchestrator.placement import PlacementError
from recovery.modes import memory_tier_off

log = logging.getLogger(__name__)

# A job Slurm has forgotten and `sacct` does not list: after this long, call it lost.
FORGOTTEN_AFTER_S = 60.0
# Each in-place attempt's rendezvous moves this far (modulo the span) from the allocation's port: a
# prime far from 1, so that jobs with nearby ids (nearby derived ports) do not meet on one.
IN_PLACE_PORT_STRIDE = 7919


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
            out = slurm_cli.run(["sinfo", "-h", "-o", "%P %a %D %t"])
        except (SlurmError, OSError) as exc:
            return False, str(exc).strip().splitlines()[-1]  # the fatal line says it best
        return True, "; ".join(line.strip() for line in out.splitlines() if line.strip()) or "no partitions"

    # --- launch -----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
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
        existing = slurm_cli.find_job_by_name(request.attempt_id)
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
                out = slurm_cli.run(["sbatch", "--parsable", "--export=ALL", str(script)], cwd=root, env=env)
            except SlurmError as exc:
                if request.exclude_nodes and slurm_cli.UNPLACEABLE in str(exc):
                    raise PlacementError(
                        f"Slurm cannot place {spec.resources.instance_count} node(s) with "
                        f"{', '.join(request.exclude_nodes)} excluded after blame: {exc}"
                    ) from None
                raise
            existing = int(out.strip().split(";")[0])
        handle["slurm_job_id"] = existing
        write_json(root / "handle.json", handle)
        return handle

    def restart_in_place(self, request: LaunchRequest) -> dict[str, Any]:
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
        hosts = list(previous.get("hosts") or []) or slurm_nodes.recorded_hosts(root)
        if not hosts or not previous.get("slurm_job_id"):
            raise SlurmError(f"no running allocation to restart {request.attempt_id} in place (handle {previous})")
        port = in_place_port(root, int(previous["slurm_job_id"]), in_place.restarts_of(previous))
        handle = in_place.next_handle(previous, request, master_port=port, hosts=hosts)
        used = in_place.spares_taken(previous, request)
        if request.replace_nodes:
            # A spare may hold rank 0's slot now: the agents' rendezvous moves to its address.
            handle["master_addr"] = slurm_cli.node_address(handle["hosts"][0])
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
        existing = slurm_cli.find_job_by_name(name)
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
                text = render_script(
                    request, options, job_name=name, nodes=count, exclude=[slurm_cli.hostlist(exclude)]
                )
            except ValueError as exc:  # too many nodes to exclude on one #SBATCH line
                log.warning("%s: no replenished hot spare (%s)", request.attempt_id, exc)
                return None
            script.write_text(text)
            env = {**inherited_env(), aerie_env.SLURM_LAUNCH: str(launch_path), aerie_env.SLURM_PYTHON: self.python}
            try:
                out = slurm_cli.run(["sbatch", "--parsable", "--export=ALL", str(script)], cwd=folder, env=env)
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
        job = slurm_cli.slurm_job_state(int(handle["slurm_job_id"]))
        stop = read_json(root / "stop.json")
        # The handle's hosts once known (an in-place attempt's, a spare in a failed node's slot).
        hosts = list(handle.get("hosts") or []) or slurm_nodes.recorded_hosts(root)
        learned = slurm_nodes.learned(handle, root)
        learned = slurm_nodes.learned_spares(learned or handle) or learned
        slurm_state = job["state"] if job else None
        if slurm_state is None:
            # Neither scontrol nor sacct knows it (yet): give a fresh submission time to show up.
            age = time.time() - (root / "handle.json").stat().st_mtime if (root / "handle.json").exists() else 0
            slurm_state = "PENDING" if age < FORGOTTEN_AFTER_S else "LOST"
        if slurm_state in slurm_cli.PENDING:
            queued = tuple(NodeStatus(h, AttemptState.STARTING) for h in hosts)
            return PollResult(AttemptState.STARTING, queued, queued=True, handle=learned)

        ended = slurm_state not in slurm_cli.RUNNING
        # An allocation serves several attempts in place: only this attempt's outcomes count.
        attempt_id = handle.get("attempt_id")
        nodes = [slurm_nodes.node_status(root / h, h, ended, bool(stop), slurm_state, attempt_id) for h in hosts]
        if ended and not nodes:
            # The job ended before any node started (bad partition, node failure at boot, ...).
            if stop or slurm_state == "CANCELLED":
                return PollResult(AttemptState.STOPPED)
            reason = slurm_nodes.slurm_reason(slurm_state, job, root)
            return PollResult(AttemptState.FAILED, reason=reason, exit_code=(job or {}).get("exit_code") or 1)
        result = base.summarize_nodes(nodes)
        if stop and result.state == AttemptState.FAILED:
            result = PollResult(AttemptState.STOPPED, result.nodes)  # nodes that died of our own stop request
        if ended and not result.terminal:
            result = PollResult(AttemptState.FAILED, result.nodes, slurm_nodes.slurm_reason(slurm_state, job, root), 1)
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
            for job_id in [handle["slurm_job_id"], *slurm_nodes.spare_job_ids(handle)]:
                try:
                    slurm_cli.run(["scancel", str(job_id)])
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
        for spare_job in slurm_nodes.spare_job_ids(handle):
            try:
                slurm_cli.run(["scancel", str(spare_job)])
            except SlurmError:
                pass  # already gone
        job_id = handle.get("slurm_job_id")
        if not job_id:
            return
        for step in slurm_cli.job_steps(int(job_id)) or [f"{job_id}.0"]:
            try:
                slurm_cli.run(["scancel", "--signal=KILL", step])
            except SlurmError:
                pass  # already gone

    def logs(
        self, handle: dict[str, Any], offsets: dict[str, int] | None = None, max_bytes: int = 1 << 20
    ) -> dict[str, dict[str, Any]]:
        """Every node's `logs/node.log`, plus Slurm's own output of the batch step under `slurm`."""
        root = Path(handle["root"])
        files = {
            h: root / h / "logs" / "node.log" for h in slurm_nodes.recorded_hosts(root) or handle.get("hosts") or []
        }
        batch = root / f"slurm-{handle['slurm_job_id']}.out"
        if batch.exists() and batch.stat().st_size:
            files["slurm"] = batch
        return {
            host: base.read_log_chunk(path, (offsets or {}).get(host, 0), max_bytes) for host, path in files.items()
        }


# --- rendering ------------------------------------------------------------------------------------


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
