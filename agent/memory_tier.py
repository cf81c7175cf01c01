"""The node's part of the in-memory checkpoint tier (agent/memckpt/): started once per agent
(spares too), begun for each worker group, and closed at exit, its area removed only when the
control plane says the job ended (a relaunch may restore from what this node holds).
"""

from __future__ import annotations

import os
import time

from aerie_contracts.restarts import NextAction
from agent.identity import spare_hosts
from agent.node_state import NodeState

JOB_END_WAIT_S = 5.0  # at exit: how long a node waits for the control plane to say whether the job ended


class MemoryTierPhase(NodeState):
    """Start, begin each group, and whether the job is over (its area can go)."""

    def _start_memory_tier(self) -> None:
        from agent.memckpt.node import start_tier
        from agent.memckpt.platform import sagemaker_env

        # On SageMaker the node derives its area and the ring (every instance, spares too); the
        # ranks read the area from the same environment.
        ident = self.cfg.identity
        everyone = [*self.cfg.hosts, *spare_hosts(), *(ident.all_hosts if ident is not None else ())]
        os.environ.update(sagemaker_env(os.environ, host=self.cfg.host, everyone=everyone))
        self.memory = start_tier(os.environ, host=self.cfg.host, hosts=list(self.cfg.hosts))

    def _begin_memory_group(self) -> None:
        if self.memory is not None:
            cfg = self.cfg
            self.memory.begin_from_env(self.reporter, os.environ, node_rank=cfg.node_rank, procs=cfg.procs_per_node)

    def _job_ended(self, wait_s: float = JOB_END_WAIT_S, poll_s: float = 0.5) -> bool:
        """Whether the job is over (its memory area can go), as the control plane says: a stop
        request is also how a relaunch tears this node down, and the next attempt may restore
        from what this node holds. While the control plane has not decided yet (the last attempt
        failed a moment ago), asked again for up to `wait_s`: a failed job's area must not stay
        in /dev/shm (what is left anyway, lease.sweep takes later)."""
        deadline = time.time() + wait_s
        while not self._job_over and self.reporter.enabled:
            answer = self.reporter.next_attempt()
            if answer is None:
                break  # unreachable: the sweep will do
            action, why = answer.get("action"), str(answer.get("why", ""))
            self._job_over = action == NextAction.EXIT and why.startswith("job ")
            if action != NextAction.WAIT or time.time() >= deadline:
                break
            time.sleep(poll_s)
        return self._job_over
