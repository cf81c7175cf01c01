"""The in-process probe's contract (issue #33): what it writes, where, and the signal it answers.

The agent's rank wrapper (`agent.rank`) puts `agent/inproc/site` first on every rank's `PYTHONPATH`
(unless `health.probe` is `off`, passed as `AERIE_PROBE`). Once the user's script imports torch,
the probe hooks optimizer steps, `backward()`, the `torch.distributed` collectives and saves, and:

- appends records to the rank's metrics stream (`aerie_contracts.metrics`), `"source": "probe"`
  (`aerie_contracts.byo.SOURCE_PROBE`): a step record per optimizer step (`step`, `loss` =
  `local_loss`, `lr`, `step_s`, and the `*_S` keys below; at most one per `RECORD_S`), and
  `checkpoint_begin`/`checkpoint_end` around `torch.save` / `torch.distributed.checkpoint.save`,
  `eval_begin`/`eval_end` around forward passes with no backward (an evaluation);
- keeps `<node dir>/ranks/rank-<R>.probe.json` current (`STATE_FILE`, `STATE_SIZE` bytes, a JSON
  object padded with spaces, rewritten in place at every collective's entry and exit): the
  collective count, the collective the rank is inside (or null) and when it changed;
- registers `faulthandler` on `stack_signal()`: that signal makes the rank write every thread's
  Python stack to `<node dir>/ranks/rank-<R>.stacks` (`STACKS_FILE`) and carry on. No trainer uses
  a real-time signal this high; a later stop-time diagnosis sends it before stopping a hung attempt.

Standard library only.
"""

from __future__ import annotations

import signal

ON, OFF = "on", "off"
MODES = (ON, OFF)

# `signal.SIGRTMIN + STACK_SIGNAL_OFFSET` (Linux): the rank dumps its Python stacks, all threads.
STACK_SIGNAL_OFFSET = 5
STACKS_FILE = "rank-{rank}.stacks"  # under <node dir>/ranks
STATE_FILE = "rank-{rank}.probe.json"  # under <node dir>/ranks
STATE_SIZE = 512  # bytes: the state file is this long, its JSON padded with spaces

# --- keys of the state file --------------------------------------------------------------------
STATE_COLLECTIVES = "collectives"  # collectives entered so far (the Python-visible ones)
STATE_IN_COLLECTIVE = "in_collective"  # the collective's name while inside one, else null
STATE_STEP = "step"  # the last optimizer step
STATE_PID = "pid"
STATE_T = "t"  # wall time of the last change

# --- optional keys of a probe step record ------------------------------------------------------
FORWARD_S = "forward_s"  # the step's time outside backward, optimizer, input wait and collectives
BACKWARD_S = "backward_s"  # time inside backward() calls (on a GPU: to launch them)
OPTIMIZER_S = "optimizer_s"  # time inside optimizer.step()
DATA_S = "data_s"  # time waiting for the DataLoader's next batch
COLLECTIVES = "collectives"  # Python-visible collectives during the step (DDP's reducer is C++: not seen)
COLLECTIVE_S = "collective_s"  # time inside them (for NCCL or async_op: to enqueue them)
FOLDED = "folded"  # optimizer steps this record stands for (more than 1: see RECORD_S)

# A step record at most every RECORD_S seconds (`AERIE_PROBE_RECORD_S` overrides it; 0: every step).
# A loop faster than that (a toy model's millisecond steps) folds the steps in between into the next
# record: `step` is the newest, `step_s` the longest of them, the `*_S` phase keys and `collectives`
# their mean per step, `loss` the newest step's. A real model's step is longer: every step has its own.
RECORD_S = 0.05


def stack_signal() -> int | None:
    """The signal number the probe answers with a stack dump; None where there are no real-time
    signals (not Linux)."""
    rtmin = getattr(signal, "SIGRTMIN", None)
    return None if rtmin is None else int(rtmin) + STACK_SIGNAL_OFFSET
