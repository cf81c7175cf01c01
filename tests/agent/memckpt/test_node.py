"""A node's memory tier as the agent runs it (agent/memckpt/node.py): two tiers in this process,
each serving on a real TCP port, replicate a group's snapshots around the ring and report them;
a replacement node stages its ranks from the replicas their holder keeps; the area goes with the
job. Payloads are random bytes (the agent never reads them)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aerie_contracts import env as E
from aerie_contracts import memckpt
from aerie_contracts.checkpoints import memory_uri
from agent.memckpt.node import NodeMemoryTier, parse_peers
from tests.agent.memckpt.test_replicate import JOB, KEY_HEX, payload, write
from tests.helpers.wait import wait_for


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Reports:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.memory_good_step: int | None = None  # as the heartbeat's answer said (agent.report.Reporter)

    def checkpoint(self, body: dict) -> None:
        self.bodies.append(body)


def _env(tmp: Path, host: str, peers: str) -> dict[str, str]:
    return {
        E.MEMORY_CHECKPOINT_EVERY: "4",
        E.MEMORY_CHECKPOINT_DIR: str(tmp / host),
        E.MEMORY_CHECKPOINT_PEERS: peers,
        E.JOB: JOB,
        E.MEMORY_CHECKPOINT_KEY: KEY_HEX,
    }


def test_peers_are_parsed_and_nonsense_is_refused():
    assert parse_peers("algo-1=127.0.0.1:5000,algo-2=10.0.0.2:5001") == {
        "algo-1": ("127.0.0.1", 5000),
        "algo-2": ("10.0.0.2", 5001),
    }
    for bad in ("algo-1", "algo-1=host", "algo-1=host:99999", "=h:1"):
        with pytest.raises(ValueError):
            parse_peers(bad)


def test_off_unless_the_backend_set_everything(tmp_path):
    env = _env(tmp_path, "algo-1", "algo-1=127.0.0.1:1,algo-2=127.0.0.1:2")
    assert NodeMemoryTier.from_env(env, host="algo-1", hosts=["algo-1", "algo-2"]) is not None
    for name, value in ((E.MEMORY_CHECKPOINT_EVERY, "0"), (E.MEMORY_CHECKPOINT_PEERS, "")):
        assert NodeMemoryTier.from_env({**env, name: value}, host="algo-1", hosts=["algo-1", "algo-2"]) is None
    with pytest.raises(ValueError, match="no endpoint for algo-3"):
        NodeMemoryTier.from_env(env, host="algo-1", hosts=["algo-1", "algo-2", "algo-3"])


def test_a_group_is_replicated_reported_then_staged_on_a_replacement_node(tmp_path):
    hosts = ["algo-1", "algo-2"]
    peers = ",".join(f"{h}=127.0.0.1:{_port()}" for h in [*hosts, "algo-3"])
    tiers = {h: NodeMemoryTier.from_env(_env(tmp_path, h, peers), host=h, hosts=hosts) for h in hosts}
    reports = {h: Reports() for h in hosts}
    try:
        for tier in tiers.values():
            tier.start()
        for node, ranks in (("algo-1", [0, 1]), ("algo-2", [2, 3])):
            for rank in ranks:
                write(tmp_path / node, 8, rank, payload(5000, rank))
            tiers[node].begin_group(reports[node], attempt=1, ranks=ranks, world_size=4, resumed_step=None)
        # begin_group drops snapshots newer than the resume point (none: all of them): write after.
        for node, ranks in (("algo-1", [0, 1]), ("algo-2", [2, 3])):
            for rank in ranks:
                write(tmp_path / node, 8, rank, payload(5000, rank))
        wait_for(what="both nodes reported step 8", check=lambda: all(r.bodies for r in reports.values()), timeout_s=20)
        body = reports["algo-2"].bodies[0]
        assert body["uri"] == memory_uri(JOB, 8, 1) and body["meta"]["ranks"] == [2, 3]
        assert body["meta"]["replica_node"] == "algo-1"
        # Step 8 is good (the heartbeat's answer says so); algo-1 alone gets to step 12 (algo-2's
        # group ends first): 8 stays on algo-1 and in the replicas algo-2 holds.
        for r in reports.values():
            r.memory_good_step = 8
        wait_for(what="the good step learnt", check=lambda: all(t.server.good_step == 8 for t in tiers.values()))
        tiers["algo-2"].end_group()
        for rank in (0, 1):
            write(tmp_path / "algo-1", 12, rank, payload(5000, rank))
        wait_for(what="algo-1 reported step 12", check=lambda: len(reports["algo-1"].bodies) == 2, timeout_s=20)
        held = {e.header.step for e in tiers["algo-1"].store.complete().get(0, [])}
        replicas = {e.header.step for e in tiers["algo-2"].store.complete("algo-1").get(0, [])}
        assert held == replicas == {8, 12}
        for tier in tiers.values():
            tier.end_group()

        # algo-2 is gone with its memory; algo-3 takes ranks 2-3 from the replicas algo-1 holds.
        tiers["algo-2"].close(job_over=True)
        new_hosts = ["algo-1", "algo-3"]
        replacement = NodeMemoryTier.from_env(_env(tmp_path, "algo-3", peers), host="algo-3", hosts=new_hosts)
        tiers["algo-3"] = replacement.start()
        writers = {
            "algo-1": {"ranks": [0, 1], "replica_node": "algo-2"},
            "algo-2": {"ranks": [2, 3], "replica_node": "algo-1"},
        }
        assert replacement.stage([2, 3], 8, writers) == {2: "replica", 3: "replica"}
        staged = memckpt.local_dir(tmp_path / "algo-3", JOB) / memckpt.file_name(8, 2)
        assert memckpt.verify(staged).rank == 2
        assert tiers["algo-1"].stage([0, 1], 8, writers) == {0: "local", 1: "local"}
        # A rank whose holder is gone too is left to the trainer's fallback.
        assert replacement.stage([4], 8, {"algo-9": {"ranks": [4], "replica_node": "algo-8"}}) == {4: "s3"}
    finally:
        for tier in tiers.values():
            tier.close(job_over=True)
    assert not memckpt.area_dir(tmp_path / "algo-1", JOB).exists()


def test_a_rank_whose_replica_holder_is_gone_is_fetched_from_the_node_that_wrote_it(tmp_path):
    """A relaunch without the first node (algo-1) moves algo-2's ranks 2-3 to the new algo-3,
    while algo-2 takes ranks 0-1: the replica of ranks 2-3 was on algo-1, gone; algo-2, their
    writer, still has its own copies, and serves them."""
    hosts = ["algo-2", "algo-3"]
    peers = ",".join(f"{h}=127.0.0.1:{_port()}" for h in hosts)
    tiers = {h: NodeMemoryTier.from_env(_env(tmp_path, h, peers), host=h, hosts=hosts) for h in hosts}
    try:
        for tier in tiers.values():
            tier.start()
        for rank in (2, 3):
            write(tmp_path / "algo-2", 8, rank, payload(5000, rank))
        writers = {
            "algo-1": {"ranks": [0, 1], "replica_node": "algo-2"},
            "algo-2": {"ranks": [2, 3], "replica_node": "algo-1"},
        }
        assert tiers["algo-3"].stage([2, 3], 8, writers) == {2: "writer", 3: "writer"}
        staged = memckpt.local_dir(tmp_path / "algo-3", JOB) / memckpt.file_name(8, 3)
        assert memckpt.verify(staged).rank == 3
    finally:
        for tier in tiers.values():
            tier.close(job_over=True)


@pytest.mark.parametrize("flush", [True, False])
def test_a_failed_groups_last_snapshot_is_flushed_before_the_node_reports_the_failure(tmp_path, monkeypatch, flush):
    """The ranks run ahead of the replication thread: when a group fails, its newest snapshot (that
    the peer may have reported already) is replicated and reported by `end_group(flush=True)`, not
    dropped; a group that ends otherwise (a stop, a switch) reports nothing more. The thread's
    ticks are an hour apart here, so only the end of the group can replicate."""
    from agent.memckpt import node

    monkeypatch.setattr(node, "TICK_S", 3600.0)
    hosts = ["algo-1", "algo-2"]
    peers = ",".join(f"{h}=127.0.0.1:{_port()}" for h in hosts)
    tiers = {h: NodeMemoryTier.from_env(_env(tmp_path, h, peers), host=h, hosts=hosts) for h in hosts}
    reports = Reports()
    try:
        for tier in tiers.values():
            tier.start()
        tiers["algo-2"].begin_group(reports, attempt=1, ranks=[2, 3], world_size=4, resumed_step=None)
        for rank in (2, 3):
            write(tmp_path / "algo-2", 8, rank, payload(5000, rank))
        tiers["algo-2"].end_group(flush=flush)
        assert [b["step"] for b in reports.bodies] == ([8] if flush else [])
        replicas = {e.header.step for e in tiers["algo-1"].store.complete("algo-2").get(2, [])}
        assert replicas == ({8} if flush else set())
    finally:
        for tier in tiers.values():
            tier.close(job_over=True)


def test_an_in_place_switch_brings_the_next_attempts_key(tmp_path):
    """The endpoint accepts only the attempt the node serves: after `begin_from_env` with attempt
    N+1's key, a peer still on N is refused, and one on N+1 is served."""
    from agent.memckpt import replicate
    from tests.agent.memckpt.test_replicate import KEY

    hosts = ["algo-1", "algo-2"]
    peers = ",".join(f"{h}=127.0.0.1:{_port()}" for h in hosts)
    tier = NodeMemoryTier.from_env(_env(tmp_path, "algo-1", peers), host="algo-1", hosts=hosts)
    assert tier is not None
    tier.start()
    try:
        path = write(tmp_path / "algo-2", 4, 2, payload(3000, 2))
        address = tier.peers["algo-1"]
        replicate.send_snapshot(address, path, job=JOB, node="algo-2", key=KEY)
        following = "c3" * 32
        env = {**_env(tmp_path, "algo-1", peers), E.MEMORY_CHECKPOINT_KEY: following, E.ATTEMPT_NUMBER: "2"}
        tier.begin_from_env(Reports(), env, node_rank=0, procs=2)
        with pytest.raises(replicate.ReplicationError):
            replicate.send_snapshot(address, path, job=JOB, node="algo-2", key=KEY)
        replicate.send_snapshot(address, path, job=JOB, node="algo-2", key=bytes.fromhex(following))
        assert tier.key == bytes.fromhex(following)
    finally:
        tier.close(job_over=True)


def test_no_tier_without_a_key(tmp_path):
    env = _env(tmp_path, "algo-1", "algo-1=127.0.0.1:1,algo-2=127.0.0.1:2")
    del env[E.MEMORY_CHECKPOINT_KEY]
    with pytest.raises(ValueError, match="AERIE_MEMORY_CHECKPOINT_KEY"):
        NodeMemoryTier.from_env(env, host="algo-1", hosts=["algo-1", "algo-2"])
