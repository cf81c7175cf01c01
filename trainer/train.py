"""The training loop: `python -m trainer.train --config X [--set key=value ...]`.

Runs under torchrun (or the Aerie agent, which uses torchrun) and alone as a world of one.
Read top to bottom, `train()` is the whole run: config -> process group -> data -> model ->
optimizer and schedule -> resume -> steps (gradient accumulation, clipping, metrics, periodic
asynchronous checkpoints) -> exit code.

Determinism: the model is initialised from `seed` identically on every rank, the data order is a
pure function of (`seed`, consumed samples), and on CPU everything is fp32, so a run resumed from
a checkpoint produces bitwise the same losses as an uninterrupted one (same world size).

Exit codes: 0 when `steps` are done; 143 (128 + SIGTERM) or 130 (SIGINT) when stopped by a
signal: the step in progress finishes on every rank, an in-flight checkpoint save is allowed to
finish and commit, nothing new is started.

`_train` stays one function, read top to bottom: the order of what it writes (steps, saves,
snapshots, evals, `train_end`) is what the agent's detectors rely on. The parts that stand alone
live beside it: a step's compute (trainer/train_step.py, re-exported here), the stop signal
(trainer/stop_signal.py), resume (trainer/resume.py), the checkpoint interval
(trainer/checkpoint/interval.py), the step clock (trainer/step_clock.py).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from aerie_contracts import env
from aerie_contracts import metrics as keys
from aerie_contracts.metrics import MetricEvent
from trainer import parallel, pricing
from trainer.checkpoint.dcp import Checkpointer
from trainer.checkpoint.interval import YoungDalyInterval, mtbf_from_env
from trainer.config import TrainConfig, load_config
from trainer.data.build import build_dataset, micro_batches
from trainer.faults import FaultInjector
from trainer.metrics import MetricsWriter
from trainer.resume import fencing_of_attempt, memory_snapshotter, restore
from trainer.step_clock import StepClock
from trainer.stop_signal import STOP_GRACE_S, StopRequest
from trainer.train_step import build_model_config, build_optimizer, evaluate, loss_of, train_step

log = logging.getLogger("trainer.train")

# --- the run ---------------------------------------------------------------------------------------


def train(cfg: TrainConfig) -> int:
    stop = StopRequest()
    stop.install()
    if cfg.deterministic:
        parallel.use_deterministic_kernels()
    world = parallel.init_distributed()
    if world.is_main:
        log.info("process group: %d ranks, collective timeout %g s", world.world_size, world.collective_timeout_s)
    metrics = MetricsWriter(world.rank)
    try:
        return _train(cfg, world, metrics, stop)
    finally:
        metrics.close()
        parallel.destroy_distributed()


def _train(cfg: TrainConfig, world: parallel.World, metrics: MetricsWriter, stop: StopRequest) -> int:
    from trainer.data import MegatronPretrainingSampler
    from trainer.models import build_model, flops_per_token

    # Data: one global batch = micro-batch x accumulation x data-parallel ranks.
    global_batch = cfg.micro_batch_size * cfg.grad_accum * world.world_size
    num_samples = cfg.steps * global_batch
    dataset = build_dataset(cfg, world, num_samples, cfg.seed)
    eval_dataset = None
    if cfg.eval_every > 0:
        eval_samples = cfg.eval_iters * cfg.micro_batch_size * world.world_size
        eval_dataset = build_dataset(cfg, world, eval_samples, cfg.seed + 1)

    # Model: the same initial weights on every rank, then wrapped.
    model_cfg = build_model_config(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg).to(world.device)
    model = parallel.parallelize(model, world, cfg.parallelism, cfg.activation_checkpointing, cfg.compile)
    clock = StepClock()  # compute vs collective wait per step: what straggler detection compares
    model = clock.attach(model)
    optimizer, scheduler = build_optimizer(model, cfg)

    every = cfg.checkpoint.resolved_every()
    checkpointer = Checkpointer(
        cfg.checkpoint.resolved_uri(),
        every if isinstance(every, int) else 0,
        metrics,
        world={
            "world_size": world.world_size,
            "num_nodes": world.num_nodes,
            "procs_per_node": world.local_world_size,
            "parallelism": cfg.parallelism,
        },
        config_hash=cfg.config_hash(),
        async_=cfg.checkpoint.async_save,
        thread_count=cfg.checkpoint.thread_count,
        **fencing_of_attempt(),
    )

    # Resume: weights, optimizer, schedule, RNG and the data position.
    step, consumed, tokens = 0, 0, 0
    resume_from = os.environ.get(env.RESUME_FROM)
    if resume_from:
        restore_started = time.time()
        extra, resumed_from = restore(checkpointer, resume_from, model, optimizer, scheduler)
        if extra is not None:  # None: a memory point every rank could not restore, and no fallback
            step, consumed, tokens = extra["step"], extra["consumed_samples"], extra["tokens"]
            sample = torch.zeros((cfg.micro_batch_size, cfg.seq_len + 1), dtype=torch.long, device=world.device)
            parallel.settle_gradient_buckets(model, sample, lambda m, t: loss_of(m, t, world, cfg.precision))
        # For the goodput ledger: the agent reports its ranks' slowest restore in its heartbeats.
        metrics.event(MetricEvent.RESTORED, step, uri=resumed_from, restore_s=time.time() - restore_started)
        if world.is_main:
            log.info("resumed from %s at step %d (%d samples consumed)", resumed_from, step, consumed)
    if step >= cfg.steps:
        checkpointer.wait()
        return 0
    sampler = MegatronPretrainingSampler(num_samples, consumed, cfg.micro_batch_size, world.rank, world.world_size)
    batches = micro_batches(dataset, sampler, world.device, cfg.data.read_ahead_mb)

    # Throughput accounting for MFU and tokens/$.
    flops_tok = flops_per_token(model_cfg, cfg.seq_len)
    device_name = torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else None
    peak = pricing.device_peak_flops(device_name, cfg.peak_flops, bf16=cfg.precision == "bf16") * world.world_size
    price = pricing.instance_price(cfg.resolved_instance_type(), cfg.price_per_hour)
    tokens_per_step = global_batch * cfg.seq_len

    faults = FaultInjector(world.rank)  # chaos rehearsal (AERIE_FAULTS); a no-op otherwise
    # `every_steps: auto`: saves at the Young–Daly interval this run measures (its ranks agree on it
    # through the per-step all-gather below).
    auto = None
    if every == "auto" and checkpointer.base_uri:
        auto = YoungDalyInterval(mtbf_from_env(), cfg.checkpoint.auto_first_steps, max_steps=max(1, cfg.steps))
        if world.is_main:
            log.info(
                "checkpoint.every_steps auto: first save at step %d, then Young–Daly from its stall (MTBF %s)",
                auto.first_after,
                f"{auto.mtbf_s:.0f} s" if auto.mtbf_s else f"unknown: every {auto.first_after} steps",
            )
    memsnap = memory_snapshotter(world.rank)
    # `auto` snapshots agree on their cost with a collective: on a group of their own, never the
    # checkpointer's, whose asynchronous S3 save runs collectives from another thread meanwhile.
    memgroup = dist.new_group(backend="gloo") if memsnap is not None and dist.is_initialized() else None

    model.train()
    while step < cfg.steps:
        t0 = time.perf_counter()
        clock.begin()
        faults.before_step(step + 1)
        lr = scheduler.get_last_lr()[0]
        loss_sum, grad_norm = train_step(
            model, optimizer, scheduler, batches, world, cfg, poison_loss=faults.loss_is_nan(step + 1)
        )
        loss_sum = loss_sum * faults.loss_scale(step + 1)  # the `spike` fault: reported loss only
        step += 1
        consumed += global_batch
        tokens += tokens_per_step

        # One collective carries every rank's loss, whether any rank was asked to stop, and (with
        # `every_steps: auto`) the checkpoint interval each rank would use.
        # Gathered, then summed in rank order: an all-reduce may add in a different order from run
        # to run, and a resumed run must report bitwise the losses of an uninterrupted one.
        # A superseded attempt (its commit was refused: the job moved on without it) stops too.
        halt = stop.signum > 0 or checkpointer.superseded is not None
        proposal = 0.0
        if auto is not None:
            auto.observe_upload(checkpointer.last_save_s)  # before it proposes: what it sends is what it logs
            proposal = auto.proposal()
        flags = [torch.tensor(x, device=world.device) for x in (float(halt), proposal)]
        summary = torch.stack([loss_sum, *flags])
        gathered = [torch.empty_like(summary) for _ in range(world.world_size)]
        with clock.collective():
            dist.all_gather(gathered, summary)
        loss_value = sum(g[0].item() for g in gathered) / world.world_size
        stopping = any(g[1].item() > 0 for g in gathered)
        step_s = time.perf_counter() - t0
        compute_s, wait_s = clock.split(step_s)
        if auto is not None:
            auto.observe_step(step_s)
            if auto.adopt(max(g[2].item() for g in gathered)) is not None:
                adopted = auto.describe()
                metrics.event(MetricEvent.CHECKPOINT_INTERVAL, step, **adopted)
                if world.is_main:
                    log.info(
                        "checkpoint.every_steps auto: every %d steps (~%.0f s): Young–Daly √(2·C·MTBF) with "
                        "C=%.3f s stall, MTBF %.0f s, %.3f s per step",
                        auto.every,
                        adopted["interval_s"] or 0.0,
                        auto.stall_s or 0.0,
                        auto.mtbf_s or 0.0,
                        adopted["step_s"] or 0.0,
                    )

        if step % cfg.log_every == 0 or step == cfg.steps or stopping:
            tokens_per_s = tokens_per_step / step_s
            metrics.step(
                step,
                loss=loss_value,
                grad_norm=grad_norm.item(),
                lr=lr,
                tokens=tokens,
                step_s=step_s,
                tokens_per_s=tokens_per_s,
                mfu=flops_tok * tokens_per_s / peak,
                tokens_per_dollar=pricing.tokens_per_dollar(tokens_per_s, price, world.num_nodes),
                **{
                    keys.COMPUTE_S: compute_s,
                    keys.WAIT_S: wait_s,
                    keys.LOCAL_LOSS: gathered[world.rank][0].item(),
                    keys.CONSUMED_SAMPLES: consumed,
                },
            )
        if world.rank == 0 and cfg.print_every and (step % cfg.print_every == 0 or step == cfg.steps):
            print(
                f"step {step}/{cfg.steps} loss {loss_value:.4f} grad_norm {grad_norm.item():.3f} "
                f"lr {lr:.2e} {tokens_per_step / step_s:,.0f} tokens/s",
                flush=True,
            )
        if eval_dataset is not None and step % cfg.eval_every == 0:
            metrics.event("eval_begin", step)
            eval_loss = evaluate(model, eval_dataset, world, cfg)
            metrics.event("eval_end", step, eval_loss=eval_loss)
            metrics.scalars(step, eval_loss=eval_loss)
        if stopping:
            stop.signum = stop.signum or signal.SIGTERM  # a peer was signalled: this rank stops too
            if checkpointer.superseded is not None:
                log.error("this attempt was superseded (%s): leaving after step %d", checkpointer.superseded, step)
            else:
                log.warning("stop requested (signal %d): leaving after step %d", stop.signum, step)
            break
        # Periodic checkpoints, and one of the final state (what export and evaluation read).
        # Never checkpoint a diverged model: a NaN state must not become a resume point.
        due = checkpointer.due(step) or (auto is not None and auto.due(step))
        if (due or (step == cfg.steps and checkpointer.base_uri)) and math.isfinite(loss_value):
            checkpointer.save(
                step,
                model,
                optimizer,
                scheduler,
                {"step": step, "consumed_samples": consumed, "tokens": tokens},
                metrics_at_step={"loss": loss_value, "grad_norm": grad_norm.item(), "lr": lr},
            )
            if auto is not None:
                auto.observe_save(step, checkpointer.last_stall_s)
        if memsnap is not None:
            memsnap.observe_step(step_s)
            if math.isfinite(loss_value) and memsnap.due(step):
                extra = {"step": step, "consumed_samples": consumed, "tokens": tokens}
                memsnap.snapshot(step, model, optimizer, scheduler, extra, group=memgroup)
            _report_snapshots(metrics, memsnap.finished())  # written in the background meanwhile

    if memsnap is not None:
        # The snapshot being written, if any (a rank that exits mid-write leaves it torn: unused).
        _report_snapshots(metrics, memsnap.close(timeout=STOP_GRACE_S))
    if stopping:
        # A save in flight was staged before the signal: let it finish and commit, within a grace
        # period (an unfinished one is never mistaken for good: it has no manifest).
        checkpointer.wait(timeout=STOP_GRACE_S)
        return stop.exit_code
    # What follows the last step (the final upload, the teardown) is wind-down, not a hang between
    # steps: the agent judges it by its own limit (agent/sections.py).
    metrics.event(MetricEvent.TRAIN_END, cfg.steps)
    checkpointer.wait()
    return 0


def _report_snapshots(metrics, written) -> None:
    """`checkpoint_memory` for each snapshot complete in shared memory (the step loop's wait for it
    as `snapshot_s`)."""
    for done in written:
        metrics.event(
            MetricEvent.CHECKPOINT_MEMORY,
            done.step,
            **{
                keys.SNAPSHOT_PATH: str(done.path),
                keys.SIZE_BYTES: done.header.size,
                keys.SNAPSHOT_S: done.blocking_s,
            },
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="training config YAML (relative: to $AERIE_WORKDIR, else the cwd)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by dotted path, e.g. --set lr=3e-4 (repeatable)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get(env.LOG_LEVEL, "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per checkpoint fence check and commit is noise in the node log (the agent does the same).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_args(argv)
    cfg = load_config(args.config, args.set)
    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
