"""Megatron's GPT dataset: fixed-length samples cut from a shuffled stream of documents.

Three index arrays define the sample order (as in megatron.core.datasets.gpt_dataset):

- document index: every document id repeated once per epoch, shuffled (seeded); when the last
  epoch is needed only for a small part (< 80 %) of it, that epoch is shuffled separately so the
  earlier epochs are not diluted.
- sample index [num+1, 2]: (position in the document index, token offset) where sample i starts;
  sample i is the `seq_len + 1` tokens from entry i to entry i+1 inclusive, so consecutive samples
  overlap by one token (the last label of one is the first input of the next) and span documents.
- shuffle index: a seeded permutation of the samples.

They are cached as .npy files named by a hash of everything that determines them, so every rank
and every later run reuses them. Several prefixes are blended by weight like Megatron's
BlendedDataset: sample k goes to the dataset whose drawn share lags its weight the most.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trainer.data.indexed import _Sequences
from trainer.data.s3_indexed import open_indexed

_INDEX_VERSION = "aerie-gpt-v1"  # bump when the index algorithm changes, to invalidate caches
_SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80


def build_document_index(
    num_documents: int, num_epochs: int, rng: np.random.RandomState, separate_final_epoch: bool
) -> np.ndarray:
    """Document ids repeated `num_epochs` times and shuffled (Megatron's _build_document_index)."""
    if not separate_final_epoch or num_epochs == 1:
        index = np.tile(np.arange(num_documents, dtype=np.int32), num_epochs)
        rng.shuffle(index)
        return index
    first = build_document_index(num_documents, num_epochs - 1, rng, False)
    last = build_document_index(num_documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_index(sequence_lengths: np.ndarray, document_index: np.ndarray, seq_len: int) -> np.ndarray:
    """Start (document-index position, offset) of every sample of seq_len+1 tokens, plus the end.

    Same result as Megatron's C++ `build_sample_idx` (drop_last_partial_sequence=True,
    add_extra_token_to_sequence=1): sample i starts at token i*seq_len of the flattened document
    stream; a start that falls on a document boundary belongs to the next document.
    """
    doc_lengths = sequence_lengths[document_index].astype(np.int64)
    ends = np.cumsum(doc_lengths)
    total = int(ends[-1]) if len(ends) else 0
    num_samples = (total - 1) // seq_len
    starts = np.arange(num_samples + 1, dtype=np.int64) * seq_len
    position = np.searchsorted(ends, starts, side="right")
    offset = starts - (ends[position] - doc_lengths[position])
    return np.stack([position, offset], axis=1)


def build_shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    """Permutation of [0, num_samples) followed by one of [num_samples, total_size)."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset of sample k, its index within that dataset): Megatron's greedy blend.

    Sample k goes to the dataset whose drawn count lags weight * k the most (first one on ties),
    exactly as megatron's C++ `build_blending_indices`. Plain Python floats: numpy's per-call
    overhead would dominate this sequential loop.
    """
    weights = [float(w) for w in weights]
    drawn = [0] * len(weights)
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    for k in range(size):
        scale = max(float(k), 1.0)
        best, best_error = 0, weights[0] * scale - drawn[0]
        for d in range(1, len(weights)):
            error = weights[d] * scale - drawn[d]
            if error > best_error:
                best, best_error = d, error
        dataset_index[k] = best
        dataset_sample_index[k] = drawn[best]
        drawn[best] += 1
    return dataset_index, dataset_sample_index


def _save_atomic(path: Path, array: np.ndarray) -> None:
    """Ranks may build the same cache at once: each writes a temp file and renames it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)


def _cached(cache_dir: Path | None, key: str, description: dict, build) -> dict[str, np.ndarray]:
    """Load the arrays named `key-<name>.npy` from cache_dir, or build and save them."""
    if cache_dir is not None:
        names = description["arrays"]
        paths = {n: cache_dir / f"{key}-{n}.npy" for n in names}
        if all(p.is_file() for p in paths.values()):
            return {n: np.load(p, mmap_mode="r") for n, p in paths.items()}
    arrays = build()
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for n, a in arrays.items():
            _save_atomic(paths[n], a)
        (cache_dir / f"{key}-description.json").write_text(json.dumps(description, indent=1, sort_keys=True))
    return arrays


def _fingerprint(dataset: _Sequences) -> str:
    """Content key of a dataset: its sequence lengths and document boundaries, not its path."""
    h = hashlib.sha256()
    h.update(np.dtype(dataset.dtype).str.encode())
    h.update(np.ascontiguousarray(dataset.sequence_lengths).tobytes())
    h.update(np.ascontiguousarray(dataset.document_indices).tobytes())
    return h.hexdigest()[:16]


def _key(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]


class _SingleGPTDataset:
    """GPT samples over one indexed dataset (each of its sequences is a document)."""

    def __init__(self, prefix: str | Path, seq_len: int, num_samples: int, seed: int, cache_dir: Path | None) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.dataset = open_indexed(prefix)
        self.seq_len = seq_len
        self.num_samples = num_samples
        self.tokens_per_epoch = self.dataset.num_tokens
        if self.tokens_per_epoch < 2:
            raise ValueError(f"{prefix} holds {self.tokens_per_epoch} tokens: too few for any sample")
        description = {
            "class": "GPTDataset",
            "version": _INDEX_VERSION,
            "dataset": os.path.basename(str(prefix)),
            "fingerprint": _fingerprint(self.dataset),
            "seq_len": seq_len,
            "num_samples": num_samples,
            "seed": seed,
            "arrays": ["document_index", "sample_index", "shuffle_index"],
        }
        self.cache_key = _key(description)
        arrays = _cached(cache_dir, self.cache_key, description, lambda: self._build(seed))
        self.document_index = arrays["document_index"]
        self.sample_index = arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]

    def num_epochs(self) -> int:
        needed = self.num_samples * self.seq_len + 1
        return max(1, -(-needed // self.tokens_per_epoch))

    def _build(self, seed: int) -> dict[str, np.ndarray]:
        num_epochs = self.num_epochs()
        separate_final_epoch = False
        if num_epochs > 1:
            # Megatron: shuffle the last epoch on its own when little of it is used.
            sans_final = ((num_epochs - 1) * self.tokens_per_epoch - 1) // self.seq_len
            from_final = self.num_samples - sans_final
            per_epoch = (self.tokens_per_epoch - 1) // self.seq_len
            separate_final_epoch = from_final < int(_SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
        rng = np.random.RandomState(seed)
        document_index = build_document_index(len(self.dataset), num_epochs, rng, separate_final_epoch)
        sample_index = build_sample_index(self.dataset.sequence_lengths, document_index, self.seq_len)
        total = sample_index.shape[0] - 1
        first = sans_final if separate_final_epoch else total
        shuffle_index = build_shuffle_index(first, total, rng)
        return {"document_index": document_index, "sample_index": sample_index, "shuffle_index": shuffle_index}

    def __len__(self) -> int:
        return self.num_samples

    def _pieces(self, idx: int) -> list[tuple[int, int, int | None]]:
        """(sequence, token offset, length or None = to its end) of each piece of sample `idx`."""
        if not 0 <= idx < self.num_samples:
            raise IndexError(f"sample {idx} out of range ({self.num_samples} samples)")
        i = int(self.shuffle_index[idx])
        (beg, beg_offset), (end, end_offset) = self.sample_index[i], self.sample_index[i + 1]
        beg, beg_offset, end, end_offset = int(beg), int(beg_offset), int(end), int(end_offset)
        pieces = []
        for pos in range(beg, end + 1):
            offset = beg_offset if pos == beg else 0
            length = end_offset + 1 - offset if pos == end else None
            pieces.append((int(self.document_index[pos]), offset, length))
        return pieces

    def byte_ranges(self, idx: int) -> list[tuple[object, int, int]]:
        """(indexed dataset, start, end) of the .bin bytes sample `idx` reads (for a read-ahead)."""
        ds = self.dataset
        return [(ds, *ds.byte_range(seq, offset, length)) for seq, offset, length in self._pieces(idx)]

    def __getitem__(self, idx: int) -> np.ndarray:
        parts = [self.dataset.get(seq, offset=offset, length=length) for seq, offset, length in self._pieces(idx)]
        return np.concatenate(parts).astype(np.int64, copy=False)


class GPTDataset:
    """`num_samples` samples of `seq_len + 1` token ids (inputs = [:-1], labels = [1:]).

    `prefixes` is one `.bin/.idx` prefix or several; `weights` (normalised, default: each
    prefix's token count) blends them. Indices are deterministic in `seed` and cached in
    `cache_dir` when given.
    """

    def __init__(
        self,
        prefixes: str | Path | Sequence[str | Path],
        seq_len: int,
        num_samples: int,
        seed: int = 1234,
        cache_dir: str | Path | None = None,
        weights: Sequence[float] | None = None,
    ) -> None:
        if isinstance(prefixes, (str, Path)):
            prefixes = [prefixes]
        prefixes = [str(p) for p in prefixes]
        if not prefixes:
            raise ValueError("at least one dataset prefix is needed")
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        self.prefixes = prefixes
        self.seq_len = seq_len
        self.num_samples = num_samples
        self.seed = seed
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None

        if len(prefixes) == 1:
            if weights is not None and len(weights) != 1:
                raise ValueError(f"{len(weights)} weights for 1 prefix")
            self.weights = np.ones(1)
            self.datasets = [_SingleGPTDataset(prefixes[0], seq_len, num_samples, seed, self.cache_dir)]
            self.dataset_index = self.dataset_sample_index = None
            return

        if weights is None:
            weights = [open_indexed(p).num_tokens for p in prefixes]
        if len(weights) != len(prefixes):
            raise ValueError(f"{len(weights)} weights for {len(prefixes)} prefixes")
        if any(w <= 0 for w in weights):
            raise ValueError(f"blend weights must be positive, got {list(weights)}")
        self.weights = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
        description = {
            "class": "BlendedDataset",
            "version": _INDEX_VERSION,
            "weights": [float(w) for w in self.weights],
            "size": num_samples,
            "arrays": ["dataset_index", "dataset_sample_index"],
        }
        blend = _cached(
            self.cache_dir,
            _key(description),
            description,
            lambda: dict(zip(description["arrays"], build_blending_indices(self.weights, num_samples))),
        )
        self.dataset_index = blend["dataset_index"]
        self.dataset_sample_index = blend["dataset_sample_index"]
        counts = np.bincount(np.asarray(self.dataset_index), minlength=len(prefixes))
        self.datasets = [
            _SingleGPTDataset(p, seq_len, max(int(n), 1), seed, self.cache_dir) for p, n in zip(prefixes, counts)
        ]

    def __len__(self) -> int:
        return self.num_samples

    def _locate(self, idx: int) -> tuple[_SingleGPTDataset, int]:
        idx = int(idx)
        if not 0 <= idx < self.num_samples:
            raise IndexError(f"sample {idx} out of range ({self.num_samples} samples)")
        if self.dataset_index is None:
            return self.datasets[0], idx
        return self.datasets[int(self.dataset_index[idx])], int(self.dataset_sample_index[idx])

    def __getitem__(self, idx: int) -> np.ndarray:
        dataset, i = self._locate(idx)
        return dataset[i]

    def byte_ranges(self, idx: int) -> list[tuple[object, int, int]]:
        """(indexed dataset, start, end) of every .bin byte range sample `idx` reads."""
        dataset, i = self._locate(idx)
        return dataset.byte_ranges(i)

    @property
    def streaming(self) -> bool:
        """True when a dataset reads from S3 (FastFile): batches should come through a read-ahead."""
        return any(getattr(d.dataset, "streaming", False) for d in self.datasets)
