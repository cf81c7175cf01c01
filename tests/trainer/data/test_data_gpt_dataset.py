"""GPTDataset: deterministic, cached, spanning documents, blended by weight."""

from __future__ import annotations

import numpy as np
import pytest

import trainer.data.gpt_dataset as gpt_dataset
from trainer.data import GPTDataset, IndexedDataset, IndexedDatasetBuilder


def _samples(ds, n=None):
    return np.stack([ds[i] for i in range(n or len(ds))])


def test_samples_are_deterministic_in_the_seed(dataset_prefix):
    a = GPTDataset(dataset_prefix, seq_len=32, num_samples=200, seed=5)
    b = GPTDataset([dataset_prefix], seq_len=32, num_samples=200, seed=5)
    c = GPTDataset(dataset_prefix, seq_len=32, num_samples=200, seed=6)
    assert len(a) == 200
    sample = a[0]
    assert sample.dtype == np.int64 and sample.shape == (33,)
    np.testing.assert_array_equal(_samples(a), _samples(b))
    assert not np.array_equal(_samples(a), _samples(c))
    with pytest.raises(IndexError):
        a[200]


def test_samples_cover_the_shuffled_document_stream(dataset_prefix):
    """Sample i is the shuffle_index[i]-th window of seq_len+1 tokens of the document stream:
    consecutive windows overlap by one token (the last label is the next first input)."""
    seq_len = 50
    ds = GPTDataset(dataset_prefix, seq_len=seq_len, num_samples=300, seed=1)
    single = ds.datasets[0]
    indexed = IndexedDataset(dataset_prefix)
    stream = np.concatenate([indexed[int(d)] for d in single.document_index])
    for i in range(300):
        k = int(single.shuffle_index[i])
        np.testing.assert_array_equal(ds[i], stream[k * seq_len : k * seq_len + seq_len + 1])
    assert sorted(int(single.shuffle_index[i]) for i in range(300)) != list(range(300))  # shuffled


def test_samples_span_documents(dataset_prefix, tokenizer_path):
    """Samples longer than documents cross document boundaries, eod tokens marking them."""
    from trainer.data import load_tokenizer

    eod = load_tokenizer(tokenizer_path).eod_id
    indexed = IndexedDataset(dataset_prefix)
    seq_len = int(indexed.sequence_lengths.max()) + 1  # longer than any document
    ds = GPTDataset(dataset_prefix, seq_len=seq_len, num_samples=20, seed=0)
    single = ds.datasets[0]
    for i in range(20):
        j = int(single.shuffle_index[i])
        assert single.sample_index[j + 1][0] > single.sample_index[j][0]  # starts and ends in different docs
        assert (ds[i][:-1] == eod).sum() >= 1


def test_epochs_repeat_every_document(dataset_prefix):
    indexed = IndexedDataset(dataset_prefix)
    per_epoch = (indexed.num_tokens - 1) // 64
    ds = GPTDataset(dataset_prefix, seq_len=64, num_samples=int(per_epoch * 2.5), seed=2)
    single = ds.datasets[0]
    assert single.num_epochs() == 3
    counts = np.bincount(single.document_index, minlength=len(indexed))
    assert counts.tolist() == [3] * len(indexed)


def test_indices_are_cached_and_reused(tmp_path, dataset_prefix, monkeypatch):
    cache = tmp_path / "cache"
    first = GPTDataset(dataset_prefix, seq_len=40, num_samples=100, seed=3, cache_dir=cache)
    files = sorted(p.name for p in cache.iterdir())
    assert len(files) == 4  # three .npy + description
    assert {f.split("-", 1)[1] for f in files} == {
        "document_index.npy",
        "sample_index.npy",
        "shuffle_index.npy",
        "description.json",
    }

    def no_rebuild(*args, **kwargs):
        raise AssertionError("indices rebuilt despite the cache")

    monkeypatch.setattr(gpt_dataset, "build_document_index", no_rebuild)
    second = GPTDataset(dataset_prefix, seq_len=40, num_samples=100, seed=3, cache_dir=cache)
    np.testing.assert_array_equal(_samples(first), _samples(second))
    monkeypatch.undo()

    # Other parameters, other key: a second set of files next to the first.
    GPTDataset(dataset_prefix, seq_len=40, num_samples=100, seed=4, cache_dir=cache)
    assert len(list(cache.iterdir())) == 8


def _synthetic(prefix, base, n_docs=20, doc_len=30):
    """A dataset whose tokens all lie in [base, base + 1000): tells samples' origin apart."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", np.uint16)
    rng = np.random.default_rng(base)
    for _ in range(n_docs):
        builder.add_item(base + rng.integers(0, 1000, size=doc_len))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def test_blend_follows_weights(tmp_path):
    a = _synthetic(tmp_path / "a", 0)
    b = _synthetic(tmp_path / "b", 10_000, n_docs=5)
    ds = GPTDataset([a, b], seq_len=16, num_samples=1000, seed=9, weights=[0.7, 0.3], cache_dir=tmp_path / "c")
    origin = np.array([int(ds[i][0] >= 10_000) for i in range(1000)])
    assert abs(int((origin == 0).sum()) - 700) <= 1
    assert all((ds[i] >= 10_000).all() == bool(origin[i]) for i in range(1000))  # no mixing inside a sample
    # b is small: its samples come from several epochs of it.
    assert ds.datasets[1].num_epochs() > 1
    again = GPTDataset([a, b], seq_len=16, num_samples=1000, seed=9, weights=[7, 3], cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(_samples(ds), _samples(again))


def test_blend_defaults_to_token_counts(tmp_path):
    a = _synthetic(tmp_path / "a", 0, n_docs=30)
    b = _synthetic(tmp_path / "b", 10_000, n_docs=10)
    ds = GPTDataset([a, b], seq_len=8, num_samples=400, seed=0)
    np.testing.assert_allclose(ds.weights, [0.75, 0.25])
    assert int((np.asarray(ds.dataset_index) == 1).sum()) == 100


def test_bad_arguments(tmp_path, dataset_prefix):
    with pytest.raises(ValueError):
        GPTDataset(dataset_prefix, seq_len=8, num_samples=0)
    with pytest.raises(ValueError):
        GPTDataset([dataset_prefix, dataset_prefix], seq_len=8, num_samples=10, weights=[1.0])
    with pytest.raises(ValueError):
        GPTDataset([dataset_prefix, dataset_prefix], seq_len=8, num_samples=10, weights=[1.0, 0.0])
    with pytest.raises(FileNotFoundError):
        GPTDataset(tmp_path / "nothing", seq_len=8, num_samples=10)


def test_pickles_for_loader_workers(tmp_path, dataset_prefix):
    import pickle

    ds = GPTDataset(dataset_prefix, seq_len=16, num_samples=50, seed=1, cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(_samples(pickle.loads(pickle.dumps(ds))), _samples(ds))
