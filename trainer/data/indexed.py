"""Megatron-LM's indexed dataset (`.bin` tokens + `.idx` index), numpy only.

Byte-compatible with `megatron.core.datasets.indexed_dataset`. The `.idx` file is:

    b"MMIDIDX\\x00\\x00"             9-byte magic
    <Q version = 1
    <B dtype code                   (DTYPE_CODES below)
    <Q sequence count               S
    <Q document count               D + 1 (document_indices starts with 0)
    int32[S]  sequence lengths      in tokens
    int64[S]  sequence pointers     byte offset of each sequence in the .bin file
    int64[D+1] document indices     sequence index where each document ends (cumulative)

The `.bin` file is the sequences' tokens back to back in the dtype. A "sequence" is what
`add_item` wrote; for pretraining each document is usually one sequence.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER_SIZE = len(INDEX_HEADER) + 8 + 1 + 8 + 8  # 34 bytes before the arrays

# Megatron's DType enum: numpy dtype <-> code stored in the .idx header.
DTYPE_CODES: dict[type, int] = {
    np.uint8: 1,
    np.int8: 2,
    np.int16: 3,
    np.int32: 4,
    np.int64: 5,
    np.float64: 6,
    np.float32: 7,
    np.uint16: 8,
}
_CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def best_dtype(vocab_size: int | None) -> type:
    """uint16 when every token id fits with margin (vocab < 65500), else int32 — Megatron's rule."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def idx_path(prefix: str | Path) -> str:
    return f"{prefix}.idx"


def bin_path(prefix: str | Path) -> str:
    return f"{prefix}.bin"


def _dtype_code(dtype) -> int:
    dtype = np.dtype(dtype).type
    if dtype not in DTYPE_CODES:
        raise ValueError(f"dtype {dtype} has no code in the indexed format")
    return DTYPE_CODES[dtype]


def write_index(
    path: str | Path, dtype, sequence_lengths: Sequence[int] | np.ndarray, document_indices: Sequence[int] | np.ndarray
) -> None:
    """Write an .idx file for sequences of `sequence_lengths` tokens stored back to back."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    docs = np.asarray(document_indices, dtype=np.int64)
    with open(path, "wb") as f:
        f.write(INDEX_HEADER)
        f.write(struct.pack("<Q", INDEX_VERSION))
        f.write(struct.pack("<B", _dtype_code(dtype)))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(docs)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(docs.tobytes(order="C"))


class IndexedDatasetBuilder:
    """Appends token sequences to a .bin file and writes the matching .idx on `finalize`.

    Same API as Megatron's builder, but takes numpy arrays or lists instead of torch tensors.
    """

    def __init__(self, bin_path: str | Path, dtype=np.int32) -> None:
        self.dtype = np.dtype(dtype).type
        _dtype_code(self.dtype)
        self.data_file = open(bin_path, "wb")
        self.sequence_lengths: list[int] = []
        self.document_indices: list[int] = [0]

    def add_item(self, tokens) -> None:
        """Append one sequence (not closing its document: call `end_document` for that)."""
        array = np.asarray(tokens, dtype=self.dtype)
        self.data_file.write(array.tobytes(order="C"))
        self.sequence_lengths.append(int(array.size))

    def add_document(self, tokens, lengths: Sequence[int]) -> None:
        """Append a whole document made of sequences of `lengths` tokens, and close it."""
        array = np.asarray(tokens, dtype=self.dtype)
        if int(np.sum(lengths)) != array.size:
            raise ValueError(f"lengths sum to {int(np.sum(lengths))} but the document has {array.size} tokens")
        self.data_file.write(array.tobytes(order="C"))
        self.sequence_lengths.extend(int(n) for n in lengths)
        self.document_indices.append(len(self.sequence_lengths))

    def end_document(self) -> None:
        self.document_indices.append(len(self.sequence_lengths))

    def add_index(self, prefix: str | Path) -> None:
        """Append a whole existing dataset (same dtype), like Megatron's merge tool."""
        other = IndexedDataset(prefix)
        if other.dtype != self.dtype:
            raise ValueError(f"cannot merge {prefix}: dtype {other.dtype} != {self.dtype}")
        offset = len(self.sequence_lengths)
        self.sequence_lengths.extend(int(n) for n in other.sequence_lengths)
        self.document_indices.extend(int(d) + offset for d in other.document_indices[1:])
        with open(bin_path(prefix), "rb") as f:
            while chunk := f.read(1 << 24):
                self.data_file.write(chunk)

    def finalize(self, idx_path: str | Path) -> None:
        self.data_file.close()
        write_index(idx_path, self.dtype, self.sequence_lengths, self.document_indices)


class IndexedDataset:
    """Memory-mapped reader of a `prefix.bin` / `prefix.idx` pair; item i is sequence i's tokens."""

    def __init__(self, path_prefix: str | Path) -> None:
        self.path_prefix = str(path_prefix)
        ipath, bpath = idx_path(path_prefix), bin_path(path_prefix)
        for p in (ipath, bpath):
            if not Path(p).is_file():
                raise FileNotFoundError(f"indexed dataset file not found: {p}")
        with open(ipath, "rb") as f:
            header = f.read(_HEADER_SIZE)
        if len(header) < _HEADER_SIZE or header[: len(INDEX_HEADER)] != INDEX_HEADER:
            raise ValueError(f"{ipath} is not a Megatron MMIDIDX index (bad header)")
        version, code, seq_count, doc_count = struct.unpack("<QBQQ", header[len(INDEX_HEADER) :])
        if version != INDEX_VERSION:
            raise ValueError(f"{ipath}: index version {version}, only {INDEX_VERSION} is supported")
        if code not in _CODE_DTYPES:
            raise ValueError(f"{ipath}: unknown dtype code {code}")
        self.dtype = _CODE_DTYPES[code]
        self._itemsize = np.dtype(self.dtype).itemsize

        self._idx_mmap = np.memmap(ipath, mode="r", dtype=np.uint8)
        offset = _HEADER_SIZE
        self.sequence_lengths = np.frombuffer(self._idx_mmap, np.int32, seq_count, offset)
        offset += self.sequence_lengths.nbytes
        self.sequence_pointers = np.frombuffer(self._idx_mmap, np.int64, seq_count, offset)
        offset += self.sequence_pointers.nbytes
        self.document_indices = np.frombuffer(self._idx_mmap, np.int64, doc_count, offset)
        if doc_count == 0 or self.document_indices[-1] != seq_count:
            raise ValueError(f"{ipath}: document indices do not end at the sequence count {seq_count}")
        # An empty .bin cannot be memory-mapped; nothing can be read from it anyway.
        self._bin = (
            np.memmap(bpath, mode="r", dtype=np.uint8) if Path(bpath).stat().st_size else np.zeros(0, np.uint8)
        )

    def __getstate__(self) -> dict:
        # Pickled (e.g. into DataLoader workers) as its path, not as a copy of the mapped files.
        return {"path_prefix": self.path_prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path_prefix"])

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `offset:offset+length` of sequence `idx` (a read-only view of the mapped file)."""
        pointer = int(self.sequence_pointers[idx])
        seq_len = int(self.sequence_lengths[idx])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(f"[{offset}:{offset + length}] out of sequence {idx} of length {seq_len}")
        return np.frombuffer(self._bin, self.dtype, length, pointer + offset * self._itemsize)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("slices into an indexed dataset must be contiguous")
            return [self.get(i) for i in range(start, stop)]
        if isinstance(idx, (int, np.integer)):
            if idx < 0:
                idx += len(self)
            if not 0 <= idx < len(self):
                raise IndexError(f"sequence {idx} out of range ({len(self)} sequences)")
            return self.get(int(idx))
        raise TypeError(f"unexpected index type {type(idx)}")

    @staticmethod
    def exists(path_prefix: str | Path) -> bool:
        return Path(idx_path(path_prefix)).is_file() and Path(bin_path(path_prefix)).is_file()
