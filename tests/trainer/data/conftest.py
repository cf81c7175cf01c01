"""Shared, session-scoped data for the trainer.data tests: a small stdlib corpus, a BPE trained
on it, and that corpus preprocessed into a Megatron dataset (all built once, in seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.data import preprocess, train_bpe, write_stdlib_corpus

VOCAB_SIZE = 1024


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trainer-data")


@pytest.fixture(scope="session")
def corpus(data_dir) -> Path:
    return write_stdlib_corpus(data_dir / "corpus.jsonl", max_docs=50)


@pytest.fixture(scope="session")
def corpus_texts(corpus) -> list[str]:
    return [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def tokenizer_path(data_dir, corpus) -> Path:
    """A byte-level BPE trained on the corpus, saved as tokenizer.json."""
    tok = train_bpe([corpus], VOCAB_SIZE, data_dir / "tok" / "tokenizer.json")
    return Path(tok.source)


@pytest.fixture(scope="session")
def dataset_prefix(data_dir, corpus, tokenizer_path) -> str:
    """The corpus preprocessed with --append-eod: `<data_dir>/ds/corpus_text_document`."""
    stats = preprocess(
        corpus, "text", tokenizer_path, data_dir / "ds" / "corpus", workers=1, append_eod=True, progress=False
    )
    return stats["output_prefix"]
