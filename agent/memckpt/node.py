"""The in-memory checkpoint tier on one node, as its agent runs it (issue #22).

The backend turns it on with four variables (orchestrator/backends/nodeenv.memory_env): the
interval the ranks snapshot at, the node's shared-memory area, the ring's endpoints and the
attempt's replication key. The agent then, for as long as it lives (across in-place worker groups):

- serves its endpoint (`ReplicaServer`): its ring predecessor's replicas land here, and a replaced
  node fetches them back; only requests proven with the current attempt's key are served (an
  in-place switch brings the next attempt's key: `begin_from_env`);
- during each worker group, replicates its ranks' newest common snapshot to its ring successor, in
  a thread of its own (training never waits on it), and reports each memory checkpoint whose two
  copies are complete (`/checkpoints`, tier `memory`): the control plane records it good once the
  nodes' reports cover every rank;
- owns the pruning of its area: older snapshots go only below the job's newest good memory step
  (the heartbeat's answer says it), never that one, within a bound (aerie_contracts.memckpt.MAX_HELD);
- claims its job's area with a lease (aerie_contracts/memckpt_lease.py), and at its start sweeps
  the areas of other jobs under its root that nobody will use again (owner gone, lease stale);
- removes its area when the job has ended on this node.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from typing import Any

from aerie_contracts import env as E
from aerie_contracts import memckpt
from aerie_contracts import memckpt_lease as lease
from aerie_contracts.checkpoints import CheckpointTier, step_of_uri, tier_of_uri
from agent.memckpt.replicate import ReplicaServer, parse_key, peer_of
from agent.memckpt.restore import S3, resolve
from agent.memckpt.ring import Replicator, report_body
from agent.memckpt.store import SnapshotStore

log = logging.getLogger("aerie.agent.memckpt")

TICK_S = 0.25  # how often the replication thread looks for a newer snapshot
FETCH_WAIT_S = 30.0  # how long a replica's holder may take to start serving (a relaunch)


def parse_peers(value: str) -> dict[str, tuple[str, int]]:
    """`host=addr:port,...` -> {host: (addr, port)}; raises ValueError on anything else."""
    peers: dict[str, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        host, sep, address = item.partition("=")
        addr, colon, port = address.rpartition(":")
        if not sep or not colon or not host or not addr or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{E.MEMORY_CHECKPOINT_PEERS}: {item!r} is not host=addr:port")
        peers[host] = (addr, int(port))
    return peers


def start_tier(environ: Mapping[str, str], *, host: str, hosts: list[str]) -> NodeMemoryTier | None:
    """The node's tier, serving, when the backend turned it on; a tier that cannot start costs the
    job its fast restarts, never the job."""
    try:
        tier = NodeMemoryTier.from_env(environ, host=host, hosts=hosts)
        return tier.start() if tier is not None else None
    except (OSError, ValueError) as exc:
        log.error("in-memory checkpoints off on %s: %s", host, exc)
        return None


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class NodeMemoryTier:
    """One agent's part of the memory tier: its endpoint, and one replication thread per group."""

    def __init__(
        self, *, job: str, host: str, hosts: list[str], peers: dict[str, tuple[str, int]], root: str, key: bytes
    ):
        missing = [h for h in hosts if h not in peers]
        if missing:
            raise ValueError(f"{E.MEMORY_CHECKPOINT_PEERS} names no endpoint for {', '.join(missing)}")
        self.job, self.host, self.hosts, self.peers, self.root = job, host, hosts, peers, root
        self.key = key
        self.store = SnapshotStore(job, root)
        self.peer_node = peer_of(hosts, host)
        self.server: ReplicaServer | None = None
        self.lease: lease.Lease | None = None
        self._thread: threading.Thread | None = None
        self._stop, self._flush = threading.Event(), threading.Event()

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, host: str, hosts: list[str]) -> NodeMemoryTier | None:
        """The tier when the backend turned it on (every variable set, interval not 0); without a
        replication key it does not start (ValueError): an endpoint must never serve unproven peers."""
        every = environ.get(E.MEMORY_CHECKPOINT_EVERY, "")
        peers, root, job = (
            environ.get(E.MEMORY_CHECKPOINT_PEERS),
            environ.get(E.MEMORY_CHECKPOINT_DIR),
            environ.get(E.JOB),
        )
        if every in ("", "0") or not peers or not root or not job:
            return None
        key = environ.get(E.MEMORY_CHECKPOINT_KEY, "")
        if not key:
            raise ValueError(f"{E.MEMORY_CHECKPOINT_KEY} is not set: no replication without the attempt's key")
        return cls(job=job, host=host, hosts=list(hosts), peers=parse_peers(peers), root=root, key=parse_key(key))

    def retarget(self, hosts: list[str], peers: Mapping[str, str] | None = None) -> None:
        """The attempt's nodes changed (a hot spare took a lost node's slot): the ring follows, with
        the endpoints of nodes the backend started since (`{host: addr:port}`)."""
        for host, address in (peers or {}).items():
            addr, _, port = str(address).rpartition(":")
            if host not in self.peers and addr and port.isdigit():
                self.peers[host] = (addr, int(port))
        self.hosts, self.peer_node = list(hosts), peer_of(hosts, self.host)
        if self.peer_node is not None and self.peer_node not in self.peers:
            # Never take the agent down over it: this node's snapshots keep one copy, never good.
            log.warning("memory checkpoints: no endpoint for %s, %s replicates to no one", self.peer_node, self.host)
            self.peer_node = None
        log.info("memory checkpoints: %s now replicates to %s", self.host, self.peer_node)

    def start(self) -> NodeMemoryTier:
        lease.sweep(self.root, keep=self.job)  # what failed or killed agents of other jobs left
        self.lease = lease.Lease(memckpt.area_dir(self.root, self.job), job=self.job, host=self.host).start()
        addr, port = self.peers[self.host]
        self.server = ReplicaServer(self.root, addr, port, key=self.key).start()
        log.info(
            "memory checkpoints: %s serves replicas on %s:%d, replicates to %s", self.host, addr, port, self.peer_node
        )
        return self

    # --- one worker group -----------------------------------------------------------------

    def set_key(self, key: bytes) -> None:
        """The attempt this node now serves: its key for what this node sends, and the only one its
        endpoint accepts (a peer still on the last attempt is refused until it switches too)."""
        self.key = key
        if self.server is not None:
            self.server.set_key(key)

    def begin_from_env(self, reporter: Any, environ: Mapping[str, str], *, node_rank: int, procs: int) -> None:
        """`begin_group` for the group the agent starts next, as its environment describes it
        (with, after an in-place switch, the new attempt's key)."""
        key = environ.get(E.MEMORY_CHECKPOINT_KEY, "")
        if key:
            self.set_key(parse_key(key))
        number = environ.get(E.ATTEMPT_NUMBER, "")
        resume = environ.get(E.RESUME_FROM, "")
        first = node_rank * procs
        self.begin_group(
            reporter,
            attempt=int(number) if number.isdigit() else 0,
            ranks=list(range(first, first + procs)),
            world_size=len(self.hosts) * procs,
            resumed_step=step_of_uri(resume),
            resume_uri=resume,
            writers=_json_object(environ.get(E.MEMORY_RESUME_NODES, "")),
        )

    def begin_group(
        self,
        reporter: Any,
        *,
        attempt: int,
        ranks: list[int],
        world_size: int,
        resumed_step: int | None,
        resume_uri: str = "",
        writers: Mapping[str, Any] | None = None,
    ) -> None:
        """Replicate this group's snapshots until `end_group`. A snapshot at or before the resume
        point is the last group's, already replicated and reported: not again."""
        self.end_group()
        self.store.drop_after(resumed_step)
        if resume_uri and tier_of_uri(resume_uri) == CheckpointTier.MEMORY and resumed_step is not None:
            self.stage(ranks, resumed_step, writers)
        replicator = Replicator(
            self.store,
            node=self.host,
            ranks=ranks,
            peer=self.peers[self.peer_node] if self.peer_node else None,
            peer_node=self.peer_node,
            key=self.key,
        )
        replicator.replicated = resumed_step
        self._stop, self._flush = threading.Event(), threading.Event()

        def loop(stop: threading.Event = self._stop, flush: threading.Event = self._flush) -> None:
            while True:
                stopping = stop.wait(TICK_S)
                if stopping and not flush.is_set():
                    return
                try:
                    self.learn_good(replicator, getattr(reporter, "memory_good_step", None))
                    done = replicator.tick()
                except Exception:  # never take the agent down over a replica
                    log.exception("memory checkpoint replication failed")
                    done = None
                # After a stop, only a flush reports (this tick's step or the one an earlier tick
                # was busy with when the stop came): never another attempt's records otherwise.
                if done is not None and (flush.is_set() or not stop.is_set()):
                    body = report_body(
                        done,
                        job=self.job,
                        attempt=attempt,
                        node=self.host,
                        world_size=world_size,
                        peer_node=self.peer_node,
                    )
                    reporter.checkpoint(body)
                    log.info(
                        "memory checkpoint of step %d: %s's ranks %s held by %s too",
                        done.step,
                        self.host,
                        done.ranks,
                        self.peer_node,
                    )
                if stopping:  # the flush's one last tick is done
                    return

        self._thread = threading.Thread(target=loop, name="memckpt-replicate", daemon=True)
        self._thread.start()

    def learn_good(self, replicator: Replicator, step: int | None) -> None:
        """The job's newest good memory step (the heartbeat's answer): what pruning must keep, on
        this node's own snapshots and on the replicas its endpoint receives."""
        replicator.good = step
        if self.server is not None:
            self.server.good_step = step

    def stage(self, ranks: list[int], step: int, writers: Mapping[str, Any] | None = None) -> dict[int, str]:
        """Before the ranks start from a memory checkpoint: each local rank's snapshot of `step`
        verified in place, or fetched from the node that holds its replica, or from the node that
        wrote it. `writers` (the checkpoint's record, {node: {ranks, replica_node}}) says which
        node wrote each rank and which holds its replica: a replacement node's ranks were written
        elsewhere. Without it, this node wrote them and its ring successor holds them (an in-place
        restart). A rank with no copy left is left to the trainer, whose ranks then all take the
        durable fallback together (trainer/resume.py). Returns {rank: tier used}."""
        used = {}
        for rank in ranks:
            writer, holder = self._writer_of(rank, writers)
            address = self.peers.get(holder) if holder else None
            if holder == self.host:
                address = self.peers[self.host]  # this node holds it: its own server hands it over
            # The writer, if another node of the job, still has its own copy (a relaunch without the
            # first node moves the survivors' ranks: the replica's holder may be the node left out).
            writer_at = self.peers.get(writer) if writer != self.host else None
            deadline = time.time() + FETCH_WAIT_S
            while True:
                source = resolve(
                    self.store,
                    rank=rank,
                    step=step,
                    written_by=writer,
                    holder=address,
                    s3_uri=None,
                    key=self.key,
                    writer=writer_at,
                )
                # The holder's agent may not serve yet (a relaunch starts every agent at once), or
                # still serve the last attempt (an in-place switch: it refuses this one's key).
                refused = any("refused" in why.lower() for why in source.skipped)
                if source.tier != S3 or not refused or time.time() > deadline:
                    break
                time.sleep(0.5)
            used[rank] = source.tier
            log.info("memory checkpoint step %d, rank %d: restoring from the %s copy", step, rank, source.tier)
        return used

    def _writer_of(self, rank: int, writers: Mapping[str, Any] | None) -> tuple[str, str | None]:
        for node, info in (writers or {}).items():
            if rank in (info or {}).get("ranks", []):
                return str(node), (info or {}).get("replica_node")
        return self.host, self.peer_node

    def end_group(self, *, flush: bool = False) -> None:
        """Stop replicating (before the agent speaks for another attempt). With `flush` (the group
        failed), first replicate and report the newest snapshot every local rank finished: the
        ranks run ahead of the replication thread, and the peer may have reported that very step
        already, so this one report can make it good before the control plane picks the resume
        point (seen on Slurm: the peer had reported step 8, this node only 4, when a rank exited
        at 11; no memory checkpoint was good, none was used)."""
        if flush:
            self._flush.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # --- the agent's end ------------------------------------------------------------------

    def close(self, *, job_over: bool) -> None:
        """Stop serving; with the job over on this node, free its shared memory. (After a failure
        the area stays: a relaunched attempt on this host may restore from it.)"""
        self.end_group()
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.lease is not None:
            self.lease.stop()  # kept (an owner that is gone): a later sweep may take the area
            self.lease = None
        if job_over:
            shutil.rmtree(memckpt.area_dir(self.root, self.job), ignore_errors=True)
            try:
                os.rmdir(self.root)  # the node's folder, if no other job uses it
            except OSError:
                pass
