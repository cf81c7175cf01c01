"""Bring your own trainer: the names that carry a third-party trainer's progress and checkpoints.

- The spec's `metrics` section: a log preset (`PRESETS`) and/or SageMaker `MetricDefinitions`
  (`[{"Name", "Regex"}]`, the first capture group is the value); the backend passes it to every
  node as `AERIE_LOG_METRICS` (JSON `{"preset": str | null, "definitions": [...]}`), and each rank's
  wrapper (`agent.rank`) turns matching output lines into records of the metrics stream.
- Field names: a definition's `Name` is mapped onto the stream's keys by `FIELD_ALIASES`
  (SageMaker users write `train:loss`, `global_step`, ...); other names are kept as extra keys.
- Records that came from log lines carry `"source": "log"`.
- TensorBoard event files as a source (`metrics.tensorboard`: `{dir, tags, flush_s}`, in the same
  JSON under `"tensorboard"`): the node agent tails the trainer's event files (agent/tb_progress.py)
  and turns the scalars of `TB_TAGS` (plus the spec's own tags) into records with `"source":
  "tensorboard"`, the event's step as the step.
- The in-process probe (agent/inproc, injected into every Python rank): optimizer steps, the loss,
  collectives and save/eval sections, records with `"source": "probe"` (aerie_contracts.probe).

Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

# Log presets: the formats these trainers print (agent/logparse.py holds the regexes).
PRESET_MEGATRON = "megatron"  # Megatron-LM / GPT-NeoX: "iteration N/ M | ... | lm loss: ... |"
PRESET_HF_TRAINER = "hf-trainer"  # transformers.Trainer: "{'loss': ..., 'grad_norm': ...}" + its tqdm bar
PRESET_TORCHTITAN = "torchtitan"  # "step: N  loss: ...  grad_norm: ...  tps: ..."
PRESET_LIGHTNING = "lightning"  # Lightning's bar: "Epoch E: ..| i/n [.., loss=..]"
PRESETS = (PRESET_MEGATRON, PRESET_HF_TRAINER, PRESET_TORCHTITAN, PRESET_LIGHTNING)

# Which global rank prints progress in each preset's trainer (the others print none): a node
# hosting none of these cannot see progress itself (agent.monitor defers no-step hangs there).
PRINTING_RANK = {PRESET_MEGATRON: -1, PRESET_HF_TRAINER: 0, PRESET_TORCHTITAN: 0, PRESET_LIGHTNING: 0}

SOURCE_KEY = "source"
SOURCE_LOG = "log"
SOURCE_REPORT = "report"  # aerie_report.report()
SOURCE_TENSORBOARD = "tensorboard"  # the trainer's TensorBoard event files (agent.tb_progress)
SOURCE_PROBE = "probe"  # the in-process probe inside every rank (agent/inproc, aerie_contracts.probe)

MAX_DEFINITIONS = 40  # SageMaker's limit on MetricDefinitions
MAX_REGEX_LEN = 500  # SageMaker's limit on one Regex

# MetricDefinitions Name (lower-cased, ':' '/' '-' as '_') -> metrics-stream key.
FIELD_ALIASES = {
    "step": "step",
    "global_step": "step",
    "iteration": "step",
    "iter": "step",
    "train_step": "step",
    "loss": "loss",
    "train_loss": "loss",
    "training_loss": "loss",
    "lm_loss": "loss",
    "grad_norm": "grad_norm",
    "train_grad_norm": "grad_norm",
    "lr": "lr",
    "learning_rate": "lr",
    "train_lr": "lr",
    "step_s": "step_s",
    "tokens_per_s": "tokens_per_s",
    "tps": "tokens_per_s",
    "mfu": "mfu",
    "epoch": "epoch",
}


# --- progress from TensorBoard event files ------------------------------------------------------
TB_DEFAULT_DIR = "/opt/ml/output/tensorboard"  # SageMaker's TensorBoardOutputConfig.LocalPath default
# How late a trainer's writer may put a step on disk: torch's and tensorboardX's SummaryWriter
# flush every 120 s (flush_secs); a node whose only progress is TensorBoard allows that much more
# before it calls a hang. HF Trainer flushes on every log (flush_s: 0 is safe there).
TB_FLUSH_S = 120.0
MAX_TB_TAGS = 40
# Scalar tag -> metrics-stream key, for the trainers' own names (the spec's `tags` add to these).
TB_TAGS = {
    # transformers.Trainer (report_to=tensorboard): its logs dict, "train/" prefixed
    "train/loss": "loss",
    "train/grad_norm": "grad_norm",
    "train/learning_rate": "lr",
    "train/epoch": "epoch",
    # torchtitan (metrics.enable_tensorboard)
    "loss_metrics/global_avg_loss": "loss",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "throughput(tps)": "tokens_per_s",
    "mfu(%)": "mfu",
    # Megatron-LM (--tensorboard-dir)
    "lm loss": "loss",
    "learning-rate": "lr",
    "grad-norm": "grad_norm",
    # generic writers (Lightning's self.log("train_loss"), hand-rolled loops)
    "loss": "loss",
    "train_loss": "loss",
    "learning_rate": "lr",
}
_RESERVED_KEYS = ("t", "rank", "step", "event", SOURCE_KEY)
_KEY_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")


def validate_tensorboard(value: Any) -> dict[str, Any]:
    """`metrics.tensorboard`, normalised to `{"dir", "tags", "flush_s"}`. `true` or `{}` means the
    defaults; a string is the directory. Raises ValueError saying what is wrong."""
    if value is True or value is None:
        value = {}
    elif isinstance(value, str):
        value = {"dir": value}
    if not isinstance(value, dict):
        raise ValueError("metrics.tensorboard: true, a directory, or {dir, tags, flush_s}")
    unknown = set(value) - {"dir", "tags", "flush_s"}
    if unknown:
        raise ValueError(f"metrics.tensorboard: unknown field(s) {', '.join(sorted(unknown))} (dir, tags, flush_s)")
    directory = value.get("dir") or TB_DEFAULT_DIR
    if not isinstance(directory, str) or not directory.startswith("/") or ".." in directory.split("/"):
        raise ValueError(f"metrics.tensorboard.dir: an absolute path without '..' (got {directory!r})")
    tags = value.get("tags") or {}
    if not isinstance(tags, dict):
        raise ValueError("metrics.tensorboard.tags: a mapping {scalar tag: metrics key}, e.g. {'my/loss': 'loss'}")
    if len(tags) > MAX_TB_TAGS:
        raise ValueError(f"metrics.tensorboard.tags: at most {MAX_TB_TAGS} (got {len(tags)})")
    out_tags = {}
    for tag, key in tags.items():
        if not isinstance(tag, str) or not tag.strip() or len(tag) > 255:
            raise ValueError(f"metrics.tensorboard.tags: a tag is a non-empty string ≤ 255 characters (got {tag!r})")
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"metrics.tensorboard.tags[{tag!r}]: the metrics key is a non-empty string")
        field = field_for(key)
        if not _KEY_RE.match(field) or field in _RESERVED_KEYS:
            raise ValueError(
                f"metrics.tensorboard.tags[{tag!r}]: {key!r} cannot be a metrics key "
                f"(a name like loss or grad_norm; not {', '.join(_RESERVED_KEYS)}: the step is the event's own)"
            )
        out_tags[tag] = field
    flush_s = value.get("flush_s", TB_FLUSH_S)
    if isinstance(flush_s, bool) or not isinstance(flush_s, (int, float)) or not 0 <= flush_s <= 3600:
        raise ValueError(f"metrics.tensorboard.flush_s: seconds between 0 and 3600 (got {flush_s!r})")
    return {"dir": directory, "tags": out_tags, "flush_s": float(flush_s)}


def field_for(name: str) -> str:
    """The metrics-stream key a MetricDefinitions `Name` feeds."""
    key = re.sub(r"[:/\-\s.]+", "_", name.strip().lower())
    return FIELD_ALIASES.get(key, key)


def validate_definitions(definitions: list[Any]) -> list[dict[str, str]]:
    """SageMaker's rules for MetricDefinitions, plus: each Regex compiles and has a capture group.
    Raises ValueError naming the bad entry."""
    if len(definitions) > MAX_DEFINITIONS:
        raise ValueError(f"at most {MAX_DEFINITIONS} metric definitions (got {len(definitions)})")
    out = []
    for i, d in enumerate(definitions):
        if not isinstance(d, dict) or set(d) - {"Name", "Regex"} or not d.get("Name") or not d.get("Regex"):
            raise ValueError(f"metrics definition {i}: give exactly {{'Name': ..., 'Regex': ...}}")
        name, regex = str(d["Name"]), str(d["Regex"])
        if len(name) > 255 or len(regex) > MAX_REGEX_LEN:
            raise ValueError(f"metrics definition {name!r}: Name ≤ 255 and Regex ≤ {MAX_REGEX_LEN} characters")
        try:
            groups = re.compile(regex).groups
        except re.error as exc:
            raise ValueError(f"metrics definition {name!r}: Regex does not compile: {exc}") from None
        if groups < 1:
            raise ValueError(f"metrics definition {name!r}: Regex needs a capture group around the value")
        out.append({"Name": name, "Regex": regex})
    return out


# --- faults from the outside (`aerie chaos`) ---------------------------------------------------
FAULT_SIGSTOP = "sigstop"  # the real rank process stops (a hang: its peers block in a collective)
FAULT_SIGKILL = "sigkill"  # the real rank process dies
FAULT_FREEZE = "freeze"  # the rank and every process under it stop (dataloader workers included)
FAULT_SLOW_NIC = "slow-nic"  # netem on the node's own interface (nodes in network namespaces only)
# The whole machine goes away: its agent and every rank die at once (SIGKILL, no grace) and its
# shared memory (the memory tier's snapshots and the replicas it holds) is gone. Done by the backend,
# not the agent (the agent is one of the victims): the local backend only, whose nodes are folders.
FAULT_NODE_LOSS = "node-loss"
CHAOS_FAULTS = (FAULT_SIGSTOP, FAULT_SIGKILL, FAULT_FREEZE, FAULT_SLOW_NIC, FAULT_NODE_LOSS)
# Faults aimed at one rank (the request names it); the others are done to the whole node.
RANK_FAULTS = (FAULT_SIGSTOP, FAULT_SIGKILL, FAULT_FREEZE)
CHAOS_DIR = "chaos"  # <node dir>/chaos/<id>.json: requests for the agent; <id>.done.json its answers


# --- checkpoints from any trainer --------------------------------------------------------------
# `checkpoint.marker`: how the agent knows a checkpoint directory under `checkpoint.local_path` is
# complete. A preset, or a glob (relative to local_path) matching the completion marker file,
# whose parent directory is the checkpoint (its step: the last number in that directory's name).
MARKER_HF = "hf-trainer"  # checkpoint-N/trainer_state.json (written last by transformers.Trainer)
MARKER_DCP = "dcp"  # step-N/.metadata (torch.distributed.checkpoint's last write; torchtitan's layout)
MARKER_TORCHTITAN = "torchtitan"  # the same as dcp
MARKER_MEGATRON = "megatron"  # latest_checkpointed_iteration.txt naming iter_000000N/
# Lightning's ModelCheckpoint: flat files, "epoch=E-step=S.ckpt" and "last.ckpt", in one directory
# anywhere under local_path; each complete file is a checkpoint, restored as "last.ckpt".
MARKER_LIGHTNING = "lightning"
MARKERS = (MARKER_HF, MARKER_DCP, MARKER_TORCHTITAN, MARKER_MEGATRON, MARKER_LIGHTNING)
DEFAULT_LOCAL_PATH = "/opt/ml/checkpoints"  # SageMaker's CheckpointConfig.LocalPath default
SETTLE_S = 2.0  # a checkpoint's files must keep the same sizes and mtimes this long before upload
MANIFEST_LOCAL_DIR = "local_dir"  # manifest extra: the directory's name under local_path (restore puts it back)
MANIFEST_SOURCE = "source"  # manifest extra: "agent" for a third-party trainer's checkpoint
MANIFEST_LOCAL_FILE = "local_file"  # manifest extra: a flat checkpoint file's path under local_path (Lightning)
