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
from typing import BinaryIO

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
    path: str | Path | BinaryIO,
    dtype,
    sequence_lengths: Sequence[int] | np.ndarray,
    document_indices: Sequence[int] | np.ndarray,
) -> None:
    """Write an .idx file (a path, or any binary stream) for sequences of `sequence_lengths`
    tokens stored back to back."""
    if not isinstance(path, (str, Path)):
        _write_index(path, dtype, sequence_lengths, document_indices)
        return
    with open(path, "wb") as f:
        _write_index(f, dtype, sequence_lengths, document_indices)


def _write_index(f: BinaryIO, dtype, sequence_lengths, document_indices) -> None:
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    docs = np.asarray(document_indices, dtype=np.int64)
    f.write(INDEX_HEADER)
    f.write(struct.pack("<Q", INDEX_VERSION))
    f.write(struct.pack("<B", _dtype_code(dtype)))
    f.write(struct.pack("<Q", len(lengths)))
    f.write(struct.pack("<Q", len(docs)))
    f.write(lengths.tobytes(order="C"))
    f.write(pointers.tobytes(order="C"))
    f.write(docs.tobytes(order="C"))


def parse_index(buffer, name: str) -> tuple[type, np.ndarray, np.ndarray, np.ndarray]:
    """(dtype, sequence lengths, sequence pointers, document indices) of an .idx held in
    `buffer` (a memory map or bytes: the arrays are views of it, nothing is copied)."""
    header = bytes(memoryview(buffer)[:_HEADER_SIZE])
    if len(header) < _HEADER_SIZE or header[: len(INDEX_HEADER)] != INDEX_HEADER:
        raise ValueError(f"{name} is not a Megatron MMIDIDX index (bad header)")
    version, code, seq_count, doc_count = struct.unpack("<QBQQ", header[len(INDEX_HEADER) :])
    if version != INDEX_VERSION:
        raise ValueError(f"{name}: index version {version}, only {INDEX_VERSION} is supported")
    if code not in _CODE_DTYPES:
        raise ValueError(f"{name}: unknown dtype code {code}")
    offset = _HEADER_SIZE
    lengths = np.frombuffer(buffer, np.int32, seq_count, offset)
    offset += lengths.nbytes
    pointers = np.frombuffer(buffer, np.int64, seq_count, offset)
    offset += pointers.nbytes
    docs = np.frombuffer(buffer, np.int64, doc_count, offset)
    if doc_count == 0 or docs[-1] != seq_count:
        raise ValueError(f"{name}: document indices do not end at the sequence count {seq_count}")
    return _CODE_DTYPES[code], lengths, pointers, docs


class IndexedDatasetBuilder:
    """Appends token sequences to a .bin file and writes the matching .idx on `finalize`.

    Same API as Megatron's builder, but takes numpy arrays or lists instead of torch tensors.
    `bin_path` may also be an open binary stream (e.g. `aerie_s3.upload.StreamingUpload`, which
    sends the tokens straight to S3), and so may `finalize`'s `idx_path`.
    """

    def __init__(self, bin_path: str | Path | BinaryIO, dtype=np.int32) -> None:
        self.dtype = np.dtype(dtype).type
        _dtype_code(self.dtype)
        self.bin_path = bin_path if isinstance(bin_path, (str, Path)) else None
        self.data_file = open(bin_path, "wb") if self.bin_path is not None else bin_path
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

    def finalize(self, idx_path: str | Path | BinaryIO) -> None:
        self.data_file.close()  # for a stream to S3: the .bin upload completes here, before the .idx
        write_index(idx_path, self.dtype, self.sequence_lengths, self.document_indices)

    def abort(self) -> None:
        """Leave nothing behind: the .bin written so far is deleted (or its upload aborted)."""
        if self.bin_path is not None:
            self.data_file.close()
            Path(self.bin_path).unlink(missing_ok=True)
        elif hasattr(self.data_file, "abort"):
            self.data_file.abort()
        else:
            self.data_file.close()


class _Sequences:
    """What an indexed dataset is without its token bytes: the index arrays and item access.
    Subclasses say where `get` reads tokens from (a memory map, or S3 ranges)."""

    path_prefix: str
    dtype: type
    sequence_lengths: np.ndarray
    sequence_pointers: np.ndarray
    document_indices: np.ndarray

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def byte_range(self, idx: int, offset: int = 0, length: int | None = None) -> tuple[int, int]:
        """[start, end) in the .bin of tokens `offset:offset+length` of sequence `idx`."""
        pointer = int(self.sequence_pointers[idx])
        seq_len = int(self.sequence_lengths[idx])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(f"[{offset}:{offset + length}] out of sequence {idx} of length {seq_len}")
        itemsize = np.dtype(self.dtype).itemsize
        return pointer + offset * itemsize, pointer + (offset + length) * itemsize

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        raise NotImplementedError

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


class IndexedDataset(_Sequences):
    """Memory-mapped reader of a `prefix.bin` / `prefix.idx` pair; item i is sequence i's tokens."""

    def __init__(self, path_prefix: str | Path) -> None:
        self.path_prefix = str(path_prefix)
        ipath, bpath = idx_path(path_prefix), bin_path(path_prefix)
        for p in (ipath, bpath):
            if not Path(p).is_file():
                raise FileNotFoundError(f"indexed dataset file not found: {p}")
        self._idx_mmap = np.memmap(ipath, mode="r", dtype=np.uint8)
        self.dtype, self.sequence_lengths, self.sequence_pointers, self.document_indices = parse_index(
            self._idx_mmap, ipath
        )
        self._itemsize = np.dtype(self.dtype).itemsize
        # An empty .bin cannot be memory-mapped; nothing can be read from it anyway.
        self._bin = np.memmap(bpath, mode="r", dtype=np.uint8) if Path(bpath).stat().st_size else np.zeros(0, np.uint8)

    def __getstate__(self) -> dict:
        # Pickled (e.g. into DataLoader workers) as its path, not as a copy of the mapped files.
        return {"path_prefix": self.path_prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path_prefix"])

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `offset:offset+length` of sequence `idx` (a read-only view of the mapped file)."""
        start, end = self.byte_range(idx, offset, length)
        return np.frombuffer(self._bin, self.dtype, (end - start) // self._itemsize, start)

    @staticmethod
    def exists(path_prefix: str | Path) -> bool:
        return Path(idx_path(path_prefix)).is_file() and Path(bin_path(path_prefix)).is_file()
