"""Megatron-style data pipeline, numpy only (importable without torch).

IndexedDataset(prefix)                       # read prefix.bin/.idx (MMIDIDX format)
IndexedDatasetBuilder(bin_path, dtype)       # write one; finalize(idx_path)
GPTDataset(prefixes, seq_len, num_samples, seed=1234, cache_dir=None, weights=None)
    [i] -> np.ndarray int64 of seq_len + 1 tokens
MegatronPretrainingSampler(total_samples, consumed_samples, micro_batch_size,
                           data_parallel_rank, data_parallel_size, drop_last=True)
    iter -> list[int] sample indices, one micro-batch per item
load_tokenizer(path) -> Tokenizer            # .encode .decode .vocab_size .eod_id
train_bpe(texts_or_files, vocab_size, out_path) -> Tokenizer (saved as tokenizer.json)
write_stdlib_corpus(out_jsonl, max_docs=None, max_bytes=None) -> Path
preprocess(input, json_key, tokenizer, output_prefix, workers, append_eod) -> dict
"""

from __future__ import annotations

import importlib

# Lazy exports (PEP 562): `aerie data` (trainer.data.cli) is mounted in the orchestrator's CLI,
# whose core install has neither numpy nor tokenizers; importing the package must not need them.
_EXPORTS = {
    "GPTDataset": "trainer.data.gpt_dataset",
    "IndexedDataset": "trainer.data.indexed",
    "IndexedDatasetBuilder": "trainer.data.indexed",
    "MegatronPretrainingSampler": "trainer.data.sampler",
    "Tokenizer": "trainer.data.tokenizer",
    "load_tokenizer": "trainer.data.tokenizer",
    "train_bpe": "trainer.data.tokenizer",
    "write_stdlib_corpus": "trainer.data.corpus",
    "preprocess": "trainer.data.preprocess_data",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
