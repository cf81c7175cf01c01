"""The `local` backend: N nodes x M processes on this machine, the embedded default.

Each node is a real agent process tree (`python -m agent.entrypoint` -> agent -> torchrun -> ranks)
with its own contract directory. The agents run in their own sessions and record their pid and
outcome in files, so they outlive a killed control plane and a restarted one can read how they
ended: the handle is only the attempt's directory. Replacing a hot spare that died while it waited
also takes the attempt's launch request (its agents' environment), which is never written to disk
(it holds the agent token): a restarted control plane hands it back, rebuilt (`adopt`).

This module holds the backend's verbs (launch, in-place launch, add_spares, adopt, poll, stop,
fence, chaos, logs); the helpers live apart: starting a node's tree (local_spawn.py), reading and
signalling it (local_procs.py), fencing it (local_fence.py), the attempt folder's layout
(local_layout.py) and the hot-spare pool's planning (local_spares.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from aerie_contracts import memckpt
from aerie_contracts import memckpt_lease as memory_lease
from aerie_contracts.container import read_json, write_json
from aerie_contracts.states import AttemptState
from orchestrator import placement
from orchestrator.backends import in_place, local_fence, local_spares, local_spawn, netns
from orchestrator.backends.base import (
    Backend,
    LaunchRequest,
    NodeStatus,
    PollResult,
    ended_without_outcome,
    node_outcome,
    read_log_chunk,
    summarize_nodes,
)
from orchestrator.backends.local_layout import all_nodes, master_addr, node_dir
from orchestrator.backends.local_procs import agent_gone, alive, read_pid, signal_node
from orchestrator.backends.local_spawn import check_container_paths, free_port
from orchestrator.backends.nodeenv import in_place_on
from recovery.modes import memory_tier_off

# A node whose agent has not written its pid this long after launch never started.
START_TIMEOUT_S = 60.0
# After a stop request, how long agents get to stop their ranks before SIGKILL.
STOP_GRACE_S = 20.0


class LocalBackend(Backend):
    name = "local"
    # After a failed worker group, an agent waits this long for an in-place successor, then exits.
    in_place_wait_s = 120.0
    # A failed attempt's hot spares are left waiting (the controller stops the rest): a relaunch
    # keeps them (`LaunchRequest.reuse_spares`).
    keeps_spares = True
    # A restarted control plane hands back the running attempts' requests (`adopt`).
    adopts = True

    def __init__(self, jobs_dir: Path, channel_cache: Path | None = None):
        self.jobs_dir = Path(jobs_dir)
        # Every local node is on this host: one cache of downloaded channel objects for all of
        # them, beside the jobs (AERIE_CHANNEL_CACHE, set for the control plane, wins).
        self.channel_cache = Path(channel_cache) if channel_cache else self.jobs_dir.parent / "cache" / "channels"
        # What launched each running attempt ((root, in-place attempt id) -> request, rendezvous
        # port): a spare that dies while it waits is replaced with it. In memory only (the request
        # holds the agent token): after a restart of the control plane the controller rebuilds each
        # running attempt's request and hands it back (`adopt`); until then its spares are not replaced.
        self._launched: dict[tuple[str, str | None], tuple[LaunchRequest, int]] = {}

    # --- launch -----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        spec = request.spec
        root = self.jobs_dir / request.job_id / f"attempt-{request.attempt_number}"
        # The first free slots of the job's node pool: excluded (blamed) nodes are left out.
        slots = placement.node_slots(spec.backend_options, spec.resources.instance_count, spec.resources.spare_nodes)
        in_place = in_place_on(spec)
        # Hot spares wait for the control plane's word between attempts, as in-place agents do:
        # without in-place restarts there is no way to hand one a rank slot.
        wanted = spec.resources.spare_nodes if in_place else 0
        net = spec.backend_options.get("netns")
        # A relaunch keeps the spares still waiting from the attempt before (their trees stay in
        # that attempt's folder: `node_roots`), and starts only the missing ones.
        reused = local_spares.reusable(request, wanted) if not net else {}
        try:
            hosts = placement.place(spec.resources.instance_count, slots, [*request.exclude_nodes, *reused])
        except placement.PlacementError:
            reused = {}  # the pool is too small to keep them apart: they end (GET .../next says so)
            hosts = placement.place(spec.resources.instance_count, slots, request.exclude_nodes)
        fresh = placement.spares(wanted - len(reused), slots, [*hosts, *reused], request.exclude_nodes)
        spares = [*reused, *fresh]
        # Namespaces are planned from the attempt id alone, so a re-adopted handle names them too.
        net = netns.plan(request.attempt_id, hosts) if net else None
        handle: dict[str, Any] = {"root": str(root), "hosts": hosts}
        if spares:
            handle["spares"] = spares
        if reused:
            handle["node_roots"] = {h: info["root"] for h, info in reused.items()}
        if net:
            handle["netns"] = net.to_dict()
        root.mkdir(parents=True, exist_ok=True)
        try:
            # The marker makes launch idempotent: a controller that died after spawning
            # must not spawn the nodes a second time when it re-adopts this attempt.
            fd = os.open(root / "launched", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            # Re-adopted: the handle as launched (its replication key and memory ring's endpoints
            # included), when it got that far.
            recorded = read_json(root / "handle.json")
            if isinstance(recorded, dict) and recorded.get("hosts") == hosts:
                handle = recorded
            local_spares.remember(self._launched, request, handle)  # its spares can be replaced
            return handle
        with os.fdopen(fd, "w") as marker:
            marker.write(json.dumps({"t": time.time(), "attempt_id": request.attempt_id}))

        master_port = free_port()
        # Kept for spares started later (`_replace_dead_spares`), by this control plane or a
        # restarted one (`adopt`); an in-place successor's handle has a port of its own.
        handle["master_port"] = master_port
        if spec.backend_options.get("container_paths"):
            check_container_paths()
        if net:
            netns.create(request.attempt_id, hosts)
        # In-memory checkpoints (issue #22): each agent serves its replication endpoint on a port of
        # its own; spares too (one may restore a lost node's ranks from a peer's replica).
        memory_on = memory_tier_off(spec.model_dump(), self.name) is None
        # Areas in this host's /dev/shm that failed or killed agents of other jobs left behind.
        memory_lease.sweep_nodes(memckpt.root_dir(), keep=request.job_id)
        peers = {h: f"127.0.0.1:{free_port()}" for h in [*hosts, *fresh]} if memory_on else {}
        if peers:
            peers.update({h: info["peer"] for h, info in reused.items() if info.get("peer")})  # where they serve
        if peers:
            handle["memory_peers"] = peers  # a spare started later joins the ring through it
            # The attempt's replication key: its agents prove every request with it (the handle
            # keeps it for the control plane alone; the API never shows a handle).
            handle[memckpt.HANDLE_KEY] = memckpt.new_key()
        for host in [*hosts, *fresh]:
            self._spawn(
                request,
                root,
                host,
                hosts,
                spare=host in spares,
                peers=peers,
                key=handle.get(memckpt.HANDLE_KEY),
                master_port=master_port,
                net=net,
            )
        write_json(root / "handle.json", handle)
        local_spares.remember(self._launched, request, handle)
        return handle

    def _spawn(self, request: LaunchRequest, root: Path, host: str, hosts: list[str], **node: Any) -> None:
        """One node's process tree (`local_spawn.spawn_node`, with this backend's settings); a
        method, so that tests can record the nodes instead of starting them."""
        channel_cache, wait_s = self.channel_cache, self.in_place_wait_s
        local_spawn.spawn_node(request, root, host, hosts, channel_cache=channel_cache, in_place_wait_s=wait_s, **node)

    def restart_in_place(self, request: LaunchRequest) -> dict[str, Any]:
        """A warm attempt: nothing to spawn. The failed attempt's agents are still up; each learns
        of this attempt from the control plane (GET .../next) and restarts its worker group. The
        handle is the old one's, told to read only this attempt's outcomes."""
        assert request.in_place_of is not None
        path = Path(request.in_place_of["root"]) / f"handle-{request.attempt_number}.json"
        existing = read_json(path)
        if isinstance(existing, dict) and existing.get("attempt_id") == request.attempt_id:
            self.adopt(request, existing)
            return existing  # idempotent: a re-adopted launch keeps its port
        # Every local node shares this host's ports: a free one, not the rule's next (in_place.py).
        handle = in_place.next_handle(request.in_place_of, request, master_port=free_port())
        if request.replace_nodes:
            handle["master_addr"] = master_addr(handle)  # a spare may hold rank 0's slot now
        # The pool refilled: as many new spares as took slots, after the handle is written.
        self._grow(request, handle, len(request.replace_nodes), int(handle["master_port"]), record=path)
        local_spares.remember(self._launched, request, handle)
        return handle

    def adopt(self, request: LaunchRequest, handle: dict[str, Any]) -> None:
        """Remember what launched `handle`'s attempt, for `_replace_dead_spares`
        (`local_spares.remember`): `launch` and `restart_in_place` do as they return, the
        controller calls this once for each running attempt a restarted control plane finds (the
        request rebuilt as its launch built it, with a new agent token: the spares it starts
        authenticate with that). Spawns nothing, so adopting twice is harmless."""
        local_spares.remember(self._launched, request, handle)

    def add_spares(self, request: LaunchRequest, handle: dict[str, Any], count: int) -> dict[str, Any]:
        """`count` more hot spares on the node pool's next free slots (`Backend.add_spares`), as
        a replenished pool's start. Each call's handle counts it (`spares_added`) and is written
        (`spares-added-<attempt>-<n>.json` in the attempt's folder) before the trees start: a call
        repeated with the same handle returns it and spawns nothing (a crash in between costs the
        spares, never a second set)."""
        if count < 0:
            raise ValueError(f"cannot add {count} hot spares: the count must be 0 or more")
        if count == 0:
            return handle
        if handle.get("netns") or not in_place_on(request.spec):
            # As at launch: a spare is handed its slot in place, and starts outside any namespace.
            raise ValueError(
                f"cannot add hot spares to {request.attempt_id}: they need in-place restarts "
                "(retry.max_restarts and retry.in_place_restarts) and no backend_options.netns"
            )
        root = Path(handle["root"])
        number = int(handle.get("spares_added") or 0) + 1
        record = root / f"spares-added-{handle.get('attempt_id') or request.attempt_id}-{number}.json"
        recorded = read_json(record)
        if isinstance(recorded, dict):
            return recorded  # this call was made before: its spares are started
        free = local_spares.free_slots(request, handle)
        if count > len(free):
            raise ValueError(
                f"cannot add {count} hot spare(s) to {request.attempt_id}: the node pool "
                f"(backend_options.node_slots) has {len(free)} free slot(s) left"
            )
        new = {**handle, "spares_added": number}
        local_spares.remember(self._launched, request, new)  # its spares can be replaced too
        self._grow(request, new, count, self._launched[(str(root), new.get("attempt_id"))][1], record=record)
        return new

    def _grow(
        self, request: LaunchRequest, handle: dict[str, Any], count: int, master_port: int, record: Path | None = None
    ) -> list[str]:
        """Up to `count` new hot spares of `handle`'s attempt (fewer when the pool runs out), added
        to the handle (`local_spares.replenish`), their trees started after the handle is written
        to `record` where given (a retry never spawns twice). The one way every spare after launch
        starts: replenished (`restart_in_place`), replacing a dead one (`poll`), added (`add_spares`)."""
        fresh = local_spares.replenish(request, handle, count)
        if record is not None:
            write_json(record, handle)
        for host in fresh:
            self._spawn(
                request,
                Path(handle["root"]),
                host,
                handle["hosts"],
                spare=True,
                peers=handle.get("memory_peers") or {},
                key=handle.get(memckpt.HANDLE_KEY),
                master_port=master_port,
            )
        return fresh

    # --- poll -------------------------------------------------------------------------------

    def poll(self, handle: dict[str, Any]) -> PollResult:
        root = Path(handle["root"])
        marker = read_json(root / "launched", {}) or {}
        launched_at = float(marker.get("t", 0.0)) if isinstance(marker, dict) else 0.0
        stop = read_json(root / "stop.json")
        attempt_id = handle.get("attempt_id")
        nodes = [
            self._node_status(node_dir(handle, host), host, launched_at, stop, attempt_id) for host in handle["hosts"]
        ]
        if stop and isinstance(stop, dict) and time.time() - stop["t"] > STOP_GRACE_S:
            for host in all_nodes(handle):
                signal_node(node_dir(handle, host), signal.SIGKILL)
        result = summarize_nodes(nodes)
        if not stop and not result.terminal and handle.get("spares"):
            result = self._replace_dead_spares(handle, result)
        if result.terminal:
            self._launched.pop((str(root), handle.get("attempt_id")), None)
        if stop and result.state == AttemptState.FAILED:
            # A node that died of our own stop request did not fail.
            result = PollResult(AttemptState.STOPPED, result.nodes)
        if result.terminal and handle.get("netns") and all(n.state != AttemptState.RUNNING for n in result.nodes):
            netns.destroy(handle["netns"])
        return result

    def _replace_dead_spares(self, handle: dict[str, Any], result: PollResult) -> PollResult:
        """A hot spare whose tree died while it waited (its agent's pid gone: killed, or it failed
        its own pre-flight) is replaced on the next free slot, as `local_spares.replenish` refills
        the pool after a swap; the changed handle goes back in the poll's result for the controller."""
        root = Path(handle["root"])
        dead = [h for h in handle["spares"] if agent_gone(node_dir(handle, h) / "agent" / "agent.pid")]
        launched = self._launched.get((str(root), handle.get("attempt_id")))
        if not dead or launched is None or handle.get("netns"):
            return result
        request, master_port = launched
        new = {**handle, "spares": [h for h in handle["spares"] if h not in dead]}
        fresh = self._grow(request, new, len(dead), master_port)
        replaced = {h: fresh[i] if i < len(fresh) else "" for i, h in enumerate(dead)}
        return dataclasses.replace(result, spares_replaced=replaced, handle=new)

    def _node_status(
        self, ml_root: Path, host: str, launched_at: float, stop: Any, attempt_id: str | None = None
    ) -> NodeStatus:
        agent_dir = ml_root / "agent"
        ended = node_outcome(ml_root, host, attempt_id)
        if ended is not None:
            return ended
        pid = read_pid(agent_dir / "agent.pid")
        if pid is not None and alive(pid, "agent"):
            return NodeStatus(host, AttemptState.RUNNING)
        if pid is None and time.time() - launched_at < START_TIMEOUT_S:
            return NodeStatus(host, AttemptState.STARTING)
        return ended_without_outcome(host, bool(stop), "agent process vanished without reporting an exit")

    # --- stop and logs ----------------------------------------------------------------------

    def chaos(self, handle: dict[str, Any], host: str, request: dict[str, Any]) -> None:
        """The request as a file in the node's agent directory, which the agent polls each tick; a
        node loss is done here: the node's whole tree SIGKILLed and its shared-memory area removed
        (a local node is a folder of this host: that is all there is of the machine to lose)."""
        from aerie_contracts import byo

        if host not in handle["hosts"]:
            raise ValueError(f"{host} is not a node of this attempt ({', '.join(handle['hosts'])})")
        if request.get("fault") == byo.FAULT_NODE_LOSS:
            local_fence.kill_node(node_dir(handle, host))
            shutil.rmtree(memckpt.root_dir() / memckpt.safe_name(host, "host"), ignore_errors=True)
            return
        directory = node_dir(handle, host) / "agent" / byo.CHAOS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / f"{request['id']}.json", request)

    def stop(self, handle: dict[str, Any]) -> None:
        root = Path(handle["root"])
        if not (root / "stop.json").exists():
            write_json(root / "stop.json", {"t": time.time()})
            # The controller stops polling an attempt that failed, so polls cannot escalate for it:
            # whatever is still there after the grace is killed from here.
            backstop = threading.Timer(STOP_GRACE_S, self._kill_all, [handle])
            backstop.daemon = True
            backstop.start()
        for host in all_nodes(handle):
            signal_node(node_dir(handle, host), signal.SIGTERM)
        if handle.get("netns"):
            # The controller stops polling a finished attempt: tear the network down once its
            # nodes have had their grace period.
            timer = threading.Timer(STOP_GRACE_S + 5, netns.destroy, [handle["netns"]])
            timer.daemon = True
            timer.start()

    def fence(self, handle: dict[str, Any], hosts: list[str]) -> None:
        """SIGKILL every process of the lost nodes now, wherever they sit and stopped or not
        (`local_fence`); the other nodes get the usual stop, unless hot spares wait beside them."""
        for host in hosts:
            if host in handle["hosts"]:
                local_fence.kill_node(node_dir(handle, host))
        if handle.get("spares"):
            # A hot spare may take the lost node's slot in place: the survivors stay up (the
            # controller stops them, spares included, if chaining cannot keep them).
            return
        self.stop(handle)

    def _kill_all(self, handle: dict[str, Any]) -> None:
        for host in all_nodes(handle):
            local_fence.kill_node(node_dir(handle, host))

    def logs(
        self, handle: dict[str, Any], offsets: dict[str, int] | None = None, max_bytes: int = 1 << 20
    ) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for host in handle["hosts"]:
            path = node_dir(handle, host) / "logs" / "node.log"
            out[host] = read_log_chunk(path, (offsets or {}).get(host, 0), max_bytes)
        return out
