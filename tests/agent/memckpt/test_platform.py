"""agent/memckpt/platform.py: a SageMaker node derives its area and the ring's endpoints from what
SageMaker gives every instance (resourceconfig.json's hosts, TRAINING_JOB_NAME) and the two values
the control plane put in the training job's Environment (the interval and the attempt's key)."""

from __future__ import annotations

from aerie_contracts import env as E
from aerie_contracts import memckpt
from agent.memckpt.node import parse_peers
from agent.memckpt.platform import PORT_LOW, PORT_SPAN, port_of, sagemaker_env

ON = {
    E.MEMORY_CHECKPOINT_EVERY.name: "auto",
    E.MEMORY_CHECKPOINT_KEY.name: "ab" * 32,
    "TRAINING_JOB_NAME": "warm-abc-a1",
}


def test_every_node_derives_the_same_ring_with_a_port_per_host_spares_included():
    everyone = ["algo-2", "algo-1", "algo-3"]  # algo-3: a hot spare
    envs = {h: sagemaker_env(ON, host=h, everyone=everyone) for h in everyone}
    rings = {e[E.MEMORY_CHECKPOINT_PEERS.name] for e in envs.values()}
    assert len(rings) == 1  # the same on every instance
    peers = parse_peers(rings.pop())
    assert sorted(peers) == ["algo-1", "algo-2", "algo-3"]
    assert {addr for addr, _port in peers.values()} == {"algo-1", "algo-2", "algo-3"}  # SageMaker's host names
    ports = [port for _addr, port in peers.values()]
    assert len(set(ports)) == 3 and all(PORT_LOW <= p < PORT_LOW + PORT_SPAN for p in ports)
    # Each node's own area under the shared-memory root.
    areas = {h: e[E.MEMORY_CHECKPOINT_DIR.name] for h, e in envs.items()}
    assert areas["algo-1"] == str(memckpt.root_dir(memckpt.DEFAULT_ROOT) / "algo-1") and len(set(areas.values())) == 3


def test_a_new_training_job_serves_on_new_ports_and_the_same_job_on_the_same():
    assert port_of("warm-abc-a1", 0) == port_of("warm-abc-a1", 0)
    assert [port_of("warm-abc-a1", i) for i in range(3)] != [port_of("warm-abc-a3", i) for i in range(3)]


def test_nothing_is_derived_where_the_tier_is_off_or_the_backend_gave_it_all():
    hosts = ["algo-1", "algo-2"]
    assert sagemaker_env({}, host="algo-1", everyone=hosts) == {}
    assert sagemaker_env({**ON, E.MEMORY_CHECKPOINT_EVERY.name: "0"}, host="algo-1", everyone=hosts) == {}
    no_key = {k: v for k, v in ON.items() if k != E.MEMORY_CHECKPOINT_KEY.name}
    assert sagemaker_env(no_key, host="algo-1", everyone=hosts) == {}
    not_sagemaker = {k: v for k, v in ON.items() if k != "TRAINING_JOB_NAME"}
    assert sagemaker_env(not_sagemaker, host="algo-1", everyone=hosts) == {}
    local = {**ON, E.MEMORY_CHECKPOINT_PEERS.name: "algo-1=127.0.0.1:1,algo-2=127.0.0.1:2"}
    assert sagemaker_env(local, host="algo-1", everyone=hosts) == {}
