"""The in-memory checkpoint tier, node-agent side: keep, replicate (a ring over the attempt's
nodes, over TCP) and restore the ranks' shared-memory snapshots (aerie_contracts.memckpt)."""
