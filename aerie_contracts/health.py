"""The `health` section of a job spec: the thresholds of every detector, defined once.

The spec validates it (`orchestrator.spec` builds its pydantic model from this class, bounds
included) and the agent reads it from `AERIE_HEALTH` (`HealthSettings.from_dict`), so the two
can never drift. Each field's `metadata` holds its bounds (`gt`, `ge`, `lt`, `le`) and its
meaning (`doc`); nested sections are dataclasses of their own.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aerie_contracts._strenum import StrEnum


def compact_learned(learned: Mapping[str, Sequence[float]], points: int = 9) -> dict[str, list[float]]:
    """Each section's durations as `points` evenly spaced quantiles (min .. max), 4 significant
    digits: what `AERIE_SECTIONS` carries (SageMaker caps an environment value at 512 characters),
    and close enough for a p95 (the agent pools them with what it observes itself)."""
    out: dict[str, list[float]] = {}
    for name, values in merge_learned([learned]).items():
        s = sorted(values)
        if len(s) > points:
            s = [s[round(i * (len(s) - 1) / (points - 1))] for i in range(points)]
        out[name] = [float(f"{v:.4g}") for v in s]
    return out


class Section(StrEnum):
    """The parts of a run that get a timeout of their own, learned from the job's history."""

    SETUP = "setup"  # the node's launch -> the first step
    STEP = "step"  # one training step
    CHECKPOINT_STALL = "checkpoint_stall"  # the synchronous part of a save (no step runs)
    CHECKPOINT_UPLOAD = "checkpoint_upload"  # the asynchronous part (steps run beside it)
    EVAL = "eval"  # an in-loop evaluation (no step runs)
    WIND_DOWN = "wind_down"  # after the last step: a final save, an export, the teardown (no step runs)


# A heartbeat's summary carries the node's recent section durations under this key, so the control
# plane can hand them to the job's next attempt (`AERIE_SECTIONS`, same shape).
SUMMARY_SECTIONS = "sections"
LEARNED_SAMPLES = 32  # durations kept per section (the newest), per node and across attempts
# ... and each rank's recent compute/wait time per step (the control plane's straggler detector):
# `ranks: {rank: {compute_p50, wait_p50, n}}`, and the node's slowest rank's `compute_p50`.
SUMMARY_RANKS = "ranks"
SUMMARY_COMPUTE_P50 = "compute_p50"
SUMMARY_WAIT_P50 = "wait_p50"
SUMMARY_SLOWEST_RANK = "slowest_rank"
# ... and each rank's newest step as the node saw it (the API shows every rank's progress, from
# the probe where the log says nothing): `rank_steps: {rank: {step, loss, t}}`, `loss` null when
# it was not a finite number.
SUMMARY_RANK_STEPS = "rank_steps"


def merge_learned(
    sources: Iterable[Mapping[str, Sequence[float]]], keep: int = LEARNED_SAMPLES
) -> dict[str, list[float]]:
    """Section -> the newest `keep` durations of all `sources`, given oldest first (unknown sections
    and non-numbers are dropped: an older or newer agent's heartbeat must not break a launch)."""
    out: dict[str, list[float]] = {}
    for source in sources:
        for name, values in (source or {}).items():
            if name not in Section.values() or not isinstance(values, (list, tuple)):
                continue
            good = [
                float(v)
                for v in values
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            ]
            out[name] = (out.get(name, []) + good)[-keep:]
    return {k: v for k, v in out.items() if v}


def _f(default: Any, doc: str, **bounds: float) -> Any:
    return field(default=default, metadata={"doc": doc, **bounds})


@dataclass(frozen=True)
class PreflightSettings:
    """`health.preflight`: the checks each node agent runs before its ranks start in a new attempt
    (agent/preflight/). A node that fails one is never given ranks: the attempt fails with
    `preflight.failed` naming it, and chaining relaunches without it.

    Off by default: every check is cheap on its own (a 2-node pre-flight takes ~2 s here, the
    burn most of it), but every node waits for its peers' results before starting ranks, which
    would add seconds to
    every job of the test suite and to every in-place restart. Turn it on per job (`enabled:
    true`); the thresholds are floors that only broken hardware misses, not performance targets.
    """

    enabled: bool = _f(False, "run the pre-flight checks before each attempt's ranks start")
    in_place: bool = _f(True, "... also before an in-place restart's worker group (a warm attempt)")
    budget_s: float = _f(60.0, "time budget of one node's checks (each check's limit is what is left)", gt=0, le=600)
    burn_s: float = _f(0.5, "compute burn: how long the matmul loop runs on each accelerator", gt=0, le=60)
    matrix_n: int = _f(256, "compute burn: side of the square float32 matrices multiplied", ge=16, le=16384)
    min_cpu_gflops: float = _f(0.5, "compute burn on CPU: the node fails below this rate (0: report only)", ge=0)
    min_gpu_tflops: float = _f(1.0, "compute burn on each GPU: the node fails below this rate (0: report only)", ge=0)
    max_gpu_ecc_errors: int = _f(0, "a GPU with more volatile uncorrected ECC errors than this fails", ge=0)
    min_host_mem_mb: float = _f(512.0, "host memory available (MiB) below which the node fails", ge=0)
    min_shm_free_mb: float = _f(256.0, "/dev/shm (or the memory tier's area) free MiB below which the node fails", ge=0)
    shm_snapshot_factor: float = _f(
        4.0, "the memory tier needs this many times its ranks' newest snapshots free (2 own + 2 replicas)", ge=0
    )
    store_timeout_s: float = _f(10.0, "the checkpoint store's PUT/HEAD/DELETE probe fails after this", gt=0)
    collective_mb: float = _f(8.0, "all-reduce and per-link probe size (MiB) across the attempt's nodes", gt=0, le=1024)
    min_link_gbps: float = _f(
        0.2, "a node whose outgoing link to its ring successor is slower (Gbit/s) fails (0: report only)", ge=0
    )
    peer_wait_s: float = _f(
        180.0, "how long a node that passed waits for its peers' results before starting its ranks anyway", gt=0
    )


@dataclass(frozen=True)
class HealthSettings:
    """Thresholds of the node agent's detectors (agent/detect.py documents each detector)."""

    hang_floor_s: float = _f(30.0, "never call a hang sooner than this", gt=0)
    hang_factor: float = _f(5.0, "... nor sooner than this many p95 step times", gt=0)
    # A rank the kernel shows stopped (SIGSTOP: alive, never progressing) is no save or eval the
    # agent cannot see: the hang is certain, and it is called on the learned limit, not the floor.
    stopped_floor_s: float = _f(
        10.0, "with a rank stopped (SIGSTOP), a hang is called after this (nor sooner than hang_factor p95s)", gt=0
    )
    startup_grace_s: float = _f(60.0, "no silent.* verdict this soon after the node started", ge=0)
    first_step_timeout_s: float = _f(300.0, "a job that never completes step 1 hangs after this", gt=0)
    pause_max_s: float = _f(
        1800.0, "a checkpoint stall, upload or eval with no learned history is stuck after this", gt=0
    )
    # Learned section timeouts: max(floor, section_factor x the section's p95 over this job's
    # history, previous attempts included). Setup's floor is first_step_timeout_s (a restarted
    # attempt also restores a checkpoint, so its setup is longer than a fresh one's: learning only
    # ever raises that limit); the step's are hang_floor_s and hang_factor.
    section_factor: float = _f(5.0, "a stall, upload, eval or setup may last this many times its learned p95", gt=0)
    stall_floor_s: float = _f(60.0, "a checkpoint's synchronous part is never stuck sooner than this", gt=0)
    # Two minutes: a third-party trainer's final save is invisible to the agent (no checkpoint
    # events), and a loaded host once took over 12 s for a tiny model's save and gloo teardown.
    wind_down_floor_s: float = _f(
        120.0, "after a rank's last step, its final save and teardown are never stuck sooner than this", gt=0
    )
    upload_floor_s: float = _f(120.0, "a checkpoint's asynchronous upload is never stuck sooner than this", gt=0)
    eval_floor_s: float = _f(60.0, "an in-loop eval is never stuck sooner than this", gt=0)
    heartbeat_s: float = _f(5.0, "how often the agent reports to the control plane", gt=0)
    # 120 s: an agent sends its first heartbeat as soon as its ranks are started (about a second
    # here, seconds in a container); two minutes leave room for a cold Python start on a shared
    # filesystem or a slow API, while a node that never boots costs the job two minutes instead
    # of `max_runtime_s`. The clock starts when the backend reports the attempt's machines
    # allocated (not while Slurm queues the job or SageMaker provisions instances).
    first_heartbeat_s: float = _f(
        120.0, "a node with no heartbeat this long after its machines were allocated is lost", gt=0
    )
    sample_s: float = _f(1.0, "how often the agent samples its probes", gt=0)
    window_s: float = _f(300.0, "how much history the monitor keeps per series", gt=0)
    busy_util: float = _f(50.0, "% above which a stalled accelerator counts as busy", ge=0, le=100)
    gpu_idle_util: float = _f(5.0, "% below which an accelerator counts as idle", ge=0, le=100)
    gpu_work_util: float = _f(10.0, "% (median of peers) above which peers count as working", ge=0, le=100)
    gpu_idle_s: float = _f(20.0, "how long one accelerator may idle while its peers work", gt=0)
    nic_drop_ratio: float = _f(0.1, "collapse = below this fraction of the NIC's recent median", gt=0, lt=1)
    nic_window_s: float = _f(20.0, "... held for this long", gt=0)
    nic_baseline_s: float = _f(120.0, "the recent median looks back this far", gt=0)
    nic_min_bps: float = _f(256 * 1024, "baselines below this are too quiet to judge", ge=0)
    nic_min_retrans: int = _f(5, "TCP retransmissions in the window that corroborate a stall", ge=0)
    spike_z: float = _f(6.0, "robust z-score of a loss spike", gt=0)
    spike_steps: int = _f(3, "steps a spike must hold", ge=1)
    spike_min_rel: float = _f(0.1, "... and at least this far above the median (a flat loss has a tiny MAD)", ge=0)
    spike_baseline: int = _f(50, "steps the median/MAD is taken over", ge=2)
    spike_min_baseline: int = _f(20, "no spike verdict before this many steps", ge=2)
    accelerator: Literal["auto", "nvml", "cpu"] = _f("auto", "which utilisation probe: NVML, the ranks' CPU, or auto")
    gpus: Literal["owned", "all"] = _f(
        "owned", "GPUs the probe watches: those the ranks own (NVML process list, visible devices), or every GPU"
    )
    # Stragglers (orchestrator/straggler.py): judged by the control plane across nodes.
    straggler: Literal["report", "restart"] = _f(
        "report", "on node.straggler: report (a verdict and an event; the job runs on) or restart without the node"
    )
    straggler_z: float = _f(3.0, "robust z-score (against its peers' median/MAD) of a straggler's compute time", gt=0)
    straggler_rel: float = _f(0.2, "the MAD is floored at this fraction of the peers' median (2 nodes have none)", gt=0)
    straggler_min_s: float = _f(0.05, "... and a straggler computes at least this much longer per step", ge=0)
    straggler_persist_s: float = _f(30.0, "how long a node must stay an outlier before the verdict", ge=0)
    straggler_nic_ratio: float = _f(
        0.5, "with 3 nodes or more: a NIC rate below this fraction of the peers' median is an outlier", gt=0, lt=1
    )
    enabled: bool = _f(True, "run the detectors at all")
    # The in-process probe (agent/inproc): steps, loss, collectives and sections from inside each
    # Python rank, with no change to the user's command. `off`: the ranks start without it.
    probe: Literal["on", "off"] = _f("on", "inject the in-process probe into every Python rank (on) or not (off)")
    preflight: PreflightSettings = field(
        default_factory=PreflightSettings, metadata={"doc": "checks before each attempt's ranks start"}
    )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> HealthSettings:
        """The settings from JSON (`AERIE_HEALTH`): known keys override defaults, coerced to the
        field's type; unknown keys are ignored (an older agent reading a newer spec)."""
        settings: HealthSettings = _from_dict(cls, data or {})
        return settings

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data or data[f.name] is None:
            continue
        kwargs[f.name] = _coerce(hints[f.name], data[f.name])
    return cls(**kwargs)


def _coerce(tp: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return value if isinstance(value, tp) else _from_dict(tp, dict(value))
    if tp is bool:
        return bool(value)
    if tp is int:
        return int(value)
    if tp is float:
        return float(value)
    return value  # Literal[...] and str: taken as given (the spec validated them)


def field_bounds(f: dataclasses.Field[Any]) -> dict[str, float]:
    """A field's numeric bounds, as pydantic's `Field(gt=..., le=...)` keywords."""
    return {k: v for k, v in f.metadata.items() if k in ("gt", "ge", "lt", "le")}
