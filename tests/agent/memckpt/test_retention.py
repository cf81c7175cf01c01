"""Which snapshots a node keeps (issue #22, found on Slurm): a step a node replicated is not yet good
job-wide, so the job's newest good memory checkpoint (the heartbeat's answer) stays on every node,
own copy and replica, until a newer one is good; and however long a peer stays behind, a node holds
at most memckpt.MAX_HELD snapshots per rank and copy. Two real replication endpoints (threads, TCP
on localhost), two nodes of one rank each, the ring node1 -> node2 -> node1."""

from __future__ import annotations

from pathlib import Path

import pytest

from aerie_contracts import memckpt
from agent.memckpt import replicate, ring
from agent.memckpt.store import SnapshotStore
from tests.agent.memckpt.test_replicate import JOB, KEY, write


def steps(root: Path, rank: int, replica_of: str | None = None) -> set[int]:
    return {e.header.step for e in SnapshotStore(JOB, root).complete(replica_of).get(rank, [])}


@pytest.fixture
def ring2(tmp_path):
    """Two nodes: (root, endpoint, replicator) each; node1 holds rank 0, node2 rank 1."""
    roots = {n: tmp_path / n for n in ("node1", "node2")}
    servers = {n: replicate.ReplicaServer(roots[n], key=KEY).start() for n in roots}
    peers = {"node1": "node2", "node2": "node1"}
    reps = {
        n: ring.Replicator(
            SnapshotStore(JOB, roots[n]),
            node=n,
            ranks=[rank],
            peer=servers[peers[n]].address,
            peer_node=peers[n],
            key=KEY,
        )
        for rank, n in enumerate(roots)
    }
    yield roots, servers, reps
    for server in servers.values():
        server.close()


def learn_good(servers, reps, step: int | None) -> None:
    """What the heartbeat's answer does on each node (NodeMemoryTier.learn_good)."""
    for n in reps:
        reps[n].good = servers[n].good_step = step


def replicated_good(ring2, step: int) -> None:
    """Both nodes snapshot `step` and replicate it, and the control plane records it good."""
    roots, servers, reps = ring2
    write(roots["node1"], step, 0, b"n1-%d" % step)
    write(roots["node2"], step, 1, b"n2-%d" % step)
    assert reps["node1"].tick().step == step and reps["node2"].tick().step == step
    learn_good(servers, reps, step)


def test_a_step_one_node_replicated_does_not_replace_the_good_one_until_it_is_good(ring2):
    roots, servers, reps = ring2
    replicated_good(ring2, 10)

    # Step 12: node1 replicates it, node2 never finishes it.
    write(roots["node1"], 12, 0, b"n1-12")
    write(roots["node2"], 12, 1, b"n2-12")
    assert reps["node1"].tick().step == 12
    assert reps["node1"].tick() is None  # later ticks prune again: 10 is still the good one
    assert steps(roots["node1"], 0) == {10, 12}  # node1's own copy of the good step stays
    assert steps(roots["node1"], 1, replica_of="node2") == {10}  # and the replica it holds of node2's
    assert steps(roots["node2"], 0, replica_of="node1") == {10, 12}  # node2 keeps node1's replica of 10
    assert steps(roots["node2"], 1) == {10, 12}

    # node2 finishes 12; once the control plane says 12 is good, 10 goes everywhere.
    assert reps["node2"].tick().step == 12
    learn_good(servers, reps, 12)
    for n in reps:
        reps[n].tick()
    assert steps(roots["node1"], 0) == steps(roots["node2"], 1) == {12}
    assert steps(roots["node1"], 1, replica_of="node2") == steps(roots["node2"], 0, replica_of="node1") == {12}
    assert memckpt.read_keep(memckpt.local_dir(roots["node1"], JOB)) == 12  # what the ranks must not drop


def test_a_peer_that_stays_behind_costs_at_most_max_held_snapshots_never_the_good_one(ring2):
    roots, _, reps = ring2
    replicated_good(ring2, 10)
    for step in range(12, 30, 2):  # node2 is stuck: node1 alone goes on replicating
        write(roots["node1"], step, 0, b"n1-%d" % step)
        assert reps["node1"].tick().step == step
        own, replica = steps(roots["node1"], 0), steps(roots["node2"], 0, replica_of="node1")
        assert 10 in own and 10 in replica and step in own and step in replica
        assert len(own) <= memckpt.MAX_HELD and len(replica) <= memckpt.MAX_HELD
    assert steps(roots["node1"], 1, replica_of="node2") == {10}


def test_kept_steps():
    kept = memckpt.kept_steps
    assert kept({10, 12}, good=10, floor=10) == {10, 12}
    assert kept({8, 10, 12}, good=10, floor=10) == {10, 12}  # below min(replicated, good): gone
    assert kept({10, 12, 14, 16}, good=10, floor=10, cap=3) == {10, 14, 16}  # the oldest non-good first
    assert kept({10, 12, 14, 16}, good=None, floor=None, cap=3) == {12, 14, 16}  # none known: the cap only
    assert kept({12}, good=10, floor=10) == {12}  # the good step is not held: nothing to protect
