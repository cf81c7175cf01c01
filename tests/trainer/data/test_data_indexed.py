"""Round trip of Megatron's MMIDIDX format through our builder and reader."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from trainer.data import IndexedDataset, IndexedDatasetBuilder
from trainer.data.indexed import best_dtype


def _build(prefix, dtype, documents):
    """documents: list of lists of sequences; multi-sequence docs go through add_document."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype)
    for doc in documents:
        if len(doc) == 1:
            builder.add_item(np.asarray(doc[0]))
            builder.end_document()
        else:
            builder.add_document(np.concatenate(doc) if doc else np.zeros(0), [len(s) for s in doc])
    builder.finalize(f"{prefix}.idx")


def _random_documents(rng, vocab, n_docs=40):
    return [
        [rng.integers(0, vocab, size=rng.integers(1, 60)) for _ in range(rng.integers(1, 4))] for _ in range(n_docs)
    ]


@pytest.mark.parametrize("dtype,vocab", [(np.uint16, 65_000), (np.int32, 200_000)])
def test_round_trip(tmp_path, dtype, vocab):
    rng = np.random.default_rng(0)
    documents = _random_documents(rng, vocab)
    _build(tmp_path / "ds", dtype, documents)

    ds = IndexedDataset(tmp_path / "ds")
    sequences = [s for doc in documents for s in doc]
    assert len(ds) == len(sequences)
    assert ds.dtype == dtype
    assert ds.num_documents == len(documents)
    assert ds.document_indices.tolist() == [0, *np.cumsum([len(d) for d in documents]).tolist()]
    assert ds.sequence_lengths.tolist() == [len(s) for s in sequences]
    for i, seq in enumerate(sequences):
        assert ds[i].dtype == dtype
        np.testing.assert_array_equal(ds[i], seq)
    np.testing.assert_array_equal(ds[-1], sequences[-1])
    assert [x.tolist() for x in ds[3:6]] == [s.tolist() for s in sequences[3:6]]
    longest = int(np.argmax(ds.sequence_lengths))
    np.testing.assert_array_equal(ds.get(longest, offset=2, length=5), sequences[longest][2:7])
    np.testing.assert_array_equal(ds.get(longest, offset=3), sequences[longest][3:])
    assert ds.num_tokens == sum(len(s) for s in sequences)


def test_index_file_layout(tmp_path):
    """The header and arrays sit exactly where megatron-core's _IndexReader looks for them."""
    _build(tmp_path / "ds", np.uint16, [[[1, 2, 3]], [[4], [5, 6]]])
    raw = (tmp_path / "ds.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, seq_count, doc_count = struct.unpack("<QBQQ", raw[9:34])
    assert (version, code, seq_count, doc_count) == (1, 8, 3, 3)
    lengths = np.frombuffer(raw, np.int32, 3, 34)
    pointers = np.frombuffer(raw, np.int64, 3, 34 + 12)
    docs = np.frombuffer(raw, np.int64, 3, 34 + 12 + 24)
    assert lengths.tolist() == [3, 1, 2]
    assert pointers.tolist() == [0, 6, 8]  # byte offsets: uint16 is 2 bytes
    assert docs.tolist() == [0, 1, 3]
    assert len(raw) == 34 + 12 + 24 + 24
    assert (tmp_path / "ds.bin").read_bytes() == np.arange(1, 7, dtype=np.uint16).tobytes()


def test_dtype_follows_vocab_size():
    assert best_dtype(50_257) is np.uint16
    assert best_dtype(65_499) is np.uint16
    assert best_dtype(65_500) is np.int32
    assert best_dtype(128_256) is np.int32
    assert best_dtype(None) is np.int32


def test_empty_document_and_add_index(tmp_path):
    _build(tmp_path / "a", np.int32, [[[1, 2]], [], [[3]]])
    _build(tmp_path / "b", np.int32, [[[7, 8, 9]]])
    a = IndexedDataset(tmp_path / "a")
    assert a.document_indices.tolist() == [0, 1, 1, 2]

    merged = IndexedDatasetBuilder(tmp_path / "m.bin", np.int32)
    merged.add_index(tmp_path / "a")
    merged.add_index(tmp_path / "b")
    merged.finalize(tmp_path / "m.idx")
    m = IndexedDataset(tmp_path / "m")
    assert [x.tolist() for x in m[:]] == [[1, 2], [3], [7, 8, 9]]
    assert m.document_indices.tolist() == [0, 1, 1, 2, 3]


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        IndexedDataset(tmp_path / "missing")
    (tmp_path / "bad.idx").write_bytes(b"NOTANIDX" + bytes(40))
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="header"):
        IndexedDataset(tmp_path / "bad")
    builder = IndexedDatasetBuilder(tmp_path / "x.bin", np.uint16)
    with pytest.raises(ValueError, match="lengths"):
        builder.add_document([1, 2, 3], [2])
    _build(tmp_path / "ok", np.uint16, [[[1, 2, 3]]])
    ds = IndexedDataset(tmp_path / "ok")
    with pytest.raises(IndexError):
        ds[1]
    with pytest.raises(IndexError):
        ds.get(0, offset=2, length=5)


def test_pickles_as_its_path(tmp_path):
    import pickle

    _build(tmp_path / "ds", np.uint16, [[list(range(1000))]])
    ds = IndexedDataset(tmp_path / "ds")
    blob = pickle.dumps(ds)
    assert len(blob) < 500  # not the 2000 bytes of tokens
    np.testing.assert_array_equal(pickle.loads(blob)[0], ds[0])
