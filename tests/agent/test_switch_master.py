"""An in-place switch where a hot spare took rank 0's node slot: the agent's next worker group
rendezvouses at the spare's address (the /next answer's `master_addr`), not the old node's."""

from __future__ import annotations

import os

from aerie_contracts import env as E
from agent.config import rank_command
from agent.supervisor import Supervisor
from tests.helpers.supervisor_parts import SampleMonitor, agent_config


class Reporter:
    enabled = False

    def retarget(self, attempt: str, token: str) -> None:
        self.attempt = attempt


def test_a_spare_in_rank_0_s_slot_moves_the_rendezvous_to_its_address(tmp_path, monkeypatch):
    monkeypatch.delenv(E.IN_PLACE_WAIT_S, raising=False)  # no warm group spawned by the retarget
    switched = (E.ATTEMPT, E.AGENT_TOKEN, E.ATTEMPT_NUMBER, E.RESUME_FROM, E.RESUME_FALLBACK)
    for name in (*switched, E.MEMORY_RESUME_NODES, E.MASTER_PORT, E.MASTER_ADDR):
        monkeypatch.setenv(name, "")  # restored after the test: the switch writes them
    # Rank 0's address is algo-1's: the node that was lost.
    cfg = agent_config(tmp_path, procs_per_node=2, master_addr="10.0.0.1", master_port=1234)
    sup = Supervisor(cfg, monitor=SampleMonitor(), reporter=Reporter())
    successor = {
        "action": "restart",
        "attempt_id": "job-a2",
        "attempt_number": 2,
        "token": "tok-2",
        "master_port": 4321,
        "master_addr": "10.0.0.3",  # algo-3, the spare, now node rank 0
        "hosts": ["algo-3", "algo-2"],
    }
    sup._switch(successor)
    assert (sup.cfg.hosts, sup.cfg.node_rank) == (("algo-3", "algo-2"), 1)
    assert (sup.cfg.master_addr, sup.cfg.master_port) == ("10.0.0.3", 4321)
    assert os.environ[E.MASTER_ADDR] == "10.0.0.3" and os.environ[E.MASTER_PORT] == "4321"
    cmd = rank_command(sup.cfg)
    assert "--master-addr=10.0.0.3" in cmd and "--master-port=4321" in cmd and "--node-rank=1" in cmd
    # Without an address in the answer (an older control plane, rank 0 unchanged) it stays.
    sup._switch({**successor, "attempt_id": "job-a3", "master_addr": None, "hosts": ["algo-3", "algo-2"]})
    assert sup.cfg.master_addr == "10.0.0.3"
