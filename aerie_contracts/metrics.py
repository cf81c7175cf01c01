"""The metrics stream (Aerie's trainer -> the node agent): its keys and event names, defined once.

One JSON object per line in `$AERIE_METRICS_PATH/rank-<RANK:05d>.jsonl`. A training step has
`event` null; an event line has the step keys null and one of `MetricEvent`. docs/architecture.md
("Metrics stream") documents the contract; `trainer.metrics` writes it, `agent.probes.progress`
reads it.

What detection needs from each line (issue #19):

* a step: `step_s` (wall time of the step) split into `compute_s` (this rank's own work) and
  `wait_s` (time blocked in collectives waiting for peers). Ranks run in lockstep, so `step_s` is
  the same on every rank of a job; `compute_s` is not: the rank that waits least is the slow one.
* a step also carries `local_loss` (this rank's loss before the combine: a NaN that one rank
  produced is non-finite there first) and `consumed_samples` (the step read the data order's
  samples `[consumed_samples - global batch, consumed_samples)`): NaN attribution by replay.
* a save: `checkpoint_begin` (the training loop stops), `checkpoint_staged` with `stall_s` (the
  synchronous part is over: the state is copied and the upload runs beside the steps), then
  `checkpoint_end` with `stall_s`, `upload_s` and `save_s` (= stall + upload) and `ok`.
  A writer that never sends `checkpoint_staged` (older trainers, third-party pick-up) has the
  whole save counted as its stall, as before.
* `checkpoint_wait`: the loop blocks for the upload still in flight (before the next save, or at
  the end of training) until that upload's `checkpoint_end`: no step runs, and that is no hang.
"""

from __future__ import annotations

from aerie_contracts._strenum import StrEnum

# --- keys present on every line (null where they do not apply) --------------------------------
T = "t"
RANK = "rank"
STEP = "step"
LOSS = "loss"
GRAD_NORM = "grad_norm"
LR = "lr"
TOKENS = "tokens"
STEP_S = "step_s"
EVENT = "event"
CONTRACT_KEYS = (T, RANK, STEP, LOSS, GRAD_NORM, LR, TOKENS, STEP_S, EVENT)
STEP_KEYS = (LOSS, GRAD_NORM, LR, TOKENS, STEP_S)  # null on event lines

# --- optional keys of a step line -------------------------------------------------------------
COMPUTE_S = "compute_s"  # step_s minus the time blocked in collectives
WAIT_S = "wait_s"  # time blocked in collectives (gradient all-reduce, the loss gather)
LOCAL_LOSS = "local_loss"  # this rank's own loss, before the ranks' losses are combined
CONSUMED_SAMPLES = "consumed_samples"  # samples of the data order consumed after this step

# --- optional keys of checkpoint event lines -------------------------------------------------
URI = "uri"
OK = "ok"
STALL_S = "stall_s"  # the synchronous part of a save (the training loop waited)
UPLOAD_S = "upload_s"  # the asynchronous part (beside the steps)
SAVE_S = "save_s"  # stall + upload
SIZE_BYTES = "size_bytes"
SNAPSHOT_PATH = "path"  # checkpoint_memory: the snapshot file in the node's shared memory
SNAPSHOT_S = "snapshot_s"  # checkpoint_memory: the time the rank was blocked writing it


class MetricEvent(StrEnum):
    CHECKPOINT_BEGIN = "checkpoint_begin"
    CHECKPOINT_STAGED = "checkpoint_staged"
    CHECKPOINT_WAIT = "checkpoint_wait"  # the loop blocks until the in-flight upload ends (its checkpoint_end)
    CHECKPOINT_END = "checkpoint_end"
    CHECKPOINT_COMMITTED = "checkpoint_committed"
    EVAL_BEGIN = "eval_begin"
    EVAL_END = "eval_end"
    # A rank's in-memory snapshot is complete in the node's shared memory (issue #22): `path`,
    # `size_bytes`, `snapshot_s` (the time the rank was blocked for it).
    CHECKPOINT_MEMORY = "checkpoint_memory"
    # The rank's last step is done (its step reached the run's total): what follows, a final save,
    # an export, the process group's teardown, is wind-down, judged by its own limit, not a step's.
    TRAIN_END = "train_end"
    RESTORED = "restored"  # once, after a resume: `uri` and `restore_s` (seconds spent restoring)
    # `checkpoint.every_steps: auto` adopted an interval: `every_steps`, and what it came from
    # (`stall_s`, `step_s`, `mtbf_s`, `interval_s`): trainer/checkpoint/interval.py.
    CHECKPOINT_INTERVAL = "checkpoint_interval"
