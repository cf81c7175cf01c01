"""A node's memory ring after a hot spare took a lost node's slot (NodeMemoryTier.retarget)."""

from __future__ import annotations

from agent.memckpt.node import NodeMemoryTier


def test_the_ring_follows_the_new_host_list_with_endpoints_learned_at_the_hand_over(tmp_path):
    peers = {"algo-1": ("127.0.0.1", 1), "algo-2": ("127.0.0.1", 2), "algo-3": ("127.0.0.1", 3)}
    tier = NodeMemoryTier(
        job="j", host="algo-1", hosts=["algo-1", "algo-2"], peers=dict(peers), root=str(tmp_path), key=bytes(32)
    )
    assert tier.peer_node == "algo-2"
    tier.retarget(["algo-1", "algo-3"])
    assert tier.peer_node == "algo-3" and tier.hosts == ["algo-1", "algo-3"]
    # A spare the backend started later: its endpoint comes with the answer.
    tier.retarget(["algo-1", "algo-4"], {"algo-4": "127.0.0.1:4"})
    assert tier.peer_node == "algo-4" and tier.peers["algo-4"] == ("127.0.0.1", 4)
    # No endpoint at all: one copy only, the agent goes on.
    tier.retarget(["algo-1", "algo-5"])
    assert tier.peer_node is None
