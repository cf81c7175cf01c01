"""Acceptance: our `.bin/.idx` and megatron-core's are interchangeable, and our GPTDataset draws
exactly the samples megatron-core's GPTDataset draws from the same files.

megatron-core (dev extra) imports on CPU; it needs torch, which this test may use freely.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from trainer.data import GPTDataset, IndexedDataset, IndexedDatasetBuilder, load_tokenizer
from trainer.data.cli import data_app
from trainer.data.gpt_dataset import build_blending_indices, build_sample_index


@pytest.fixture(scope="module")
def mcore():
    """megatron-core, imported by the tests that use it: importing it takes seconds, and every
    pytest process of `make test` (both workers and the serial phase) collects this module."""
    from megatron.core.datasets import helpers
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from megatron.core.datasets.utils import Split
    from megatron.core.tokenizers import MegatronTokenizerBase

    return SimpleNamespace(
        helpers=helpers,
        GPTDataset=GPTDataset,
        GPTDatasetConfig=GPTDatasetConfig,
        IndexedDataset=IndexedDataset,
        IndexedDatasetBuilder=IndexedDatasetBuilder,
        Split=Split,
        tokenizer=_tokenizer_class(MegatronTokenizerBase),
    )


def test_preprocess_cli_output_read_by_megatron(mcore, tmp_path, corpus, corpus_texts, tokenizer_path):
    result = CliRunner().invoke(
        data_app,
        [
            "preprocess",
            "--input",
            str(corpus),
            "--json-key",
            "text",
            "--tokenizer",
            str(tokenizer_path),
            "--output-prefix",
            str(tmp_path / "out"),
            "--workers",
            "2",
            "--append-eod",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    prefix = str(tmp_path / "out_text_document")
    assert json.loads(result.stdout.strip().splitlines()[-1])["output_prefix"] == prefix

    theirs = mcore.IndexedDataset(prefix)
    tok = load_tokenizer(tokenizer_path)
    assert theirs.index.dtype is np.uint16
    assert len(theirs) == len(corpus_texts)
    assert theirs.document_indices.tolist() == list(range(len(corpus_texts) + 1))
    for i, text in enumerate(corpus_texts):
        assert theirs[i].tolist() == tok.encode(text) + [tok.eod_id]
    assert theirs.get(3, offset=5, length=7).tolist() == (tok.encode(corpus_texts[3]) + [tok.eod_id])[5:12]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_builder_output_read_by_ours(mcore, tmp_path, dtype):
    rng = np.random.default_rng(1)
    vocab = 60_000 if dtype is np.uint16 else 150_000
    builder = mcore.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=dtype)
    sequences = []
    for _ in range(30):
        seq = rng.integers(0, vocab, size=rng.integers(1, 100))
        builder.add_item(torch.from_numpy(seq))  # megatron's add_item takes a tensor
        builder.end_document()
        sequences.append(seq)
    multi = [rng.integers(0, vocab, size=n) for n in (4, 9, 2)]
    builder.add_document(torch.from_numpy(np.concatenate(multi)), [len(s) for s in multi])
    sequences.extend(multi)
    builder.finalize(str(tmp_path / "m.idx"))

    ours = IndexedDataset(tmp_path / "m")
    assert ours.dtype is dtype
    assert len(ours) == len(sequences)
    assert ours.document_indices.tolist() == [*range(31), 33]
    for i, seq in enumerate(sequences):
        np.testing.assert_array_equal(ours[i], seq)

    # And our builder writes the very same bytes for the same content.
    again = IndexedDatasetBuilder(tmp_path / "o.bin", dtype)
    for seq in sequences[:30]:
        again.add_item(seq)
        again.end_document()
    again.add_document(np.concatenate(multi), [len(s) for s in multi])
    again.finalize(tmp_path / "o.idx")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"o{ext}").read_bytes() == (tmp_path / f"m{ext}").read_bytes()


def _tokenizer_class(base):
    class _Tokenizer(base):
        """The least a megatron GPTDataset asks of a tokenizer (it only reads eod/pad ids)."""

        vocab = {}
        vocab_size = 1024

        def __init__(self) -> None:
            self.unique_identifiers = {"class": "_Tokenizer"}

        def tokenize(self, text):
            return []

        def detokenize(self, ids):
            return ""

        def apply_chat_template(self, *args, **kwargs):
            return None

        @property
        def eod(self):
            return 0

        @property
        def pad(self):
            return 1

    return _Tokenizer


# (seq_len, num_samples): one epoch; two epochs with the last shuffled separately (< 80 % used);
# three epochs shuffled together.
@pytest.mark.parametrize("seq_len,fraction_of_epoch", [(64, 0.5), (32, 1.3), (100, 2.9)])
def test_gpt_dataset_matches_megatron(mcore, tmp_path, dataset_prefix, seq_len, fraction_of_epoch):
    samples_per_epoch = (IndexedDataset(dataset_prefix).num_tokens - 1) // seq_len
    num_samples = int(fraction_of_epoch * samples_per_epoch)
    config = mcore.GPTDatasetConfig(
        random_seed=17,
        sequence_length=seq_len,
        tokenizer=mcore.tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(tmp_path / "mcache"),
        split="100,0,0",
    )
    low = mcore.IndexedDataset(dataset_prefix)
    theirs = mcore.GPTDataset(
        low, dataset_prefix, np.arange(len(low), dtype=np.int32), num_samples, mcore.Split.train, config
    )
    ours = GPTDataset(dataset_prefix, seq_len, num_samples, seed=17)

    single = ours.datasets[0]
    np.testing.assert_array_equal(single.document_index, theirs.document_index)
    np.testing.assert_array_equal(single.sample_index, theirs.sample_index)
    np.testing.assert_array_equal(single.shuffle_index, theirs.shuffle_index)
    for i in [0, 1, 2, num_samples // 2, num_samples - 1]:
        sample = theirs[i]
        np.testing.assert_array_equal(ours[i][:-1], sample["tokens"].numpy())
        np.testing.assert_array_equal(ours[i][1:], sample["labels"].numpy())


def test_sample_index_matches_megatron_helper(mcore):
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 40, size=200).astype(np.int32)
    lengths[[0, 17, 199]] = [5, 0, 9]
    document_index = np.tile(np.arange(200, dtype=np.int32), 2)
    rng.shuffle(document_index)
    for seq_len in (2, 7, 64, 333):
        theirs = mcore.helpers.build_sample_idx(lengths, document_index, seq_len, 2, int(lengths.sum()), True, 1)
        np.testing.assert_array_equal(build_sample_index(lengths, document_index, seq_len), theirs)


def test_blending_indices_match_megatron_helper(mcore):
    weights = np.array([0.5, 0.3, 0.2])
    dataset_index = np.zeros(5000, dtype=np.int16)
    dataset_sample_index = np.zeros(5000, dtype=np.int64)
    mcore.helpers.build_blending_indices(dataset_index, dataset_sample_index, weights, 3, 5000, False)
    ours_index, ours_sample_index = build_blending_indices(weights, 5000)
    np.testing.assert_array_equal(ours_index, dataset_index)
    np.testing.assert_array_equal(ours_sample_index, dataset_sample_index)
