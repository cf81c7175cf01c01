"""The training data of a run: the stdlib corpus built once per cache directory, the dataset over
the configured prefixes (or an S3 channel's), and its micro-batches in the sampler's order."""

from __future__ import annotations

import fcntl
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from aerie_contracts import env
from trainer import parallel
from trainer.config import TrainConfig, resolve_path

log = logging.getLogger("trainer.data.build")


def data_cache_dir(cfg: TrainConfig) -> Path:
    if cfg.data.cache_dir:
        return resolve_path(cfg.data.cache_dir)
    return Path(os.environ.get(env.DATA_CACHE) or Path.home() / ".cache" / "aerie" / "data")


def prepare_stdlib_corpus(cfg: TrainConfig, world: parallel.World) -> tuple[str, Path]:
    """Tokenizer + `.bin/.idx` of the stdlib sources, built once per cache dir.

    The local rank 0 of each node builds it under a file lock (nodes may share a filesystem);
    everybody else waits on a barrier. Returns (dataset prefix, tokenizer path).
    """
    from trainer.data import preprocess, train_bpe, write_stdlib_corpus

    d = cfg.data
    out = data_cache_dir(cfg) / f"stdlib-py{sys.version_info[0]}{sys.version_info[1]}-v{d.vocab_size}-b{d.max_bytes}"
    ready, tokenizer, prefix = out / "READY", out / "tokenizer.json", out / "stdlib"
    if world.local_rank == 0 and not ready.exists():
        out.mkdir(parents=True, exist_ok=True)
        with open(out.parent / (out.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not ready.exists():
                log.info("building the stdlib corpus in %s", out)
                corpus = write_stdlib_corpus(out / "corpus.jsonl", max_bytes=d.max_bytes)
                train_bpe([corpus], d.vocab_size, tokenizer)
                preprocess(
                    corpus,
                    json_key="text",
                    tokenizer=tokenizer,
                    output_prefix=prefix,
                    workers=d.workers,
                    append_eod=True,
                    progress=False,
                )
                (out / "corpus.jsonl").unlink()
                ready.write_text("ok\n")
    dist.barrier()
    return f"{prefix}_text_document", tokenizer


def build_dataset(cfg: TrainConfig, world: parallel.World, num_samples: int, seed: int):
    from trainer.data import GPTDataset

    if cfg.data.corpus == "stdlib":
        prefix, _ = prepare_stdlib_corpus(cfg, world)
        prefixes, weights = [prefix], None
    elif cfg.data.channel:
        from trainer.data.channels import resolve

        prefixes, weights = [resolve(cfg.data.channel, p) for p in cfg.data.prefixes], cfg.data.weights
    else:
        prefixes, weights = [str(resolve_path(p)) for p in cfg.data.prefixes], cfg.data.weights
    index_cache = data_cache_dir(cfg) / "index"
    # Rank 0 builds (and caches) the shuffle indices first so the others only read them.
    if world.rank == 0:
        dataset = GPTDataset(prefixes, cfg.seq_len, num_samples, seed=seed, cache_dir=index_cache, weights=weights)
    dist.barrier()
    if world.rank != 0:
        dataset = GPTDataset(prefixes, cfg.seq_len, num_samples, seed=seed, cache_dir=index_cache, weights=weights)
    return dataset


def micro_batches(dataset, sampler, device: torch.device, read_ahead_mb: float = 64.0) -> Iterator[torch.Tensor]:
    """[micro_batch_size, seq_len + 1] token tensors in the sampler's order (a streamed, FastFile
    dataset's bytes fetched `read_ahead_mb` ahead: trainer.data.readahead)."""
    from trainer.data.readahead import read_ahead

    for samples in read_ahead(dataset, sampler, int(read_ahead_mb * 2**20)):
        yield torch.from_numpy(np.stack(samples)).to(device, non_blocking=True)
