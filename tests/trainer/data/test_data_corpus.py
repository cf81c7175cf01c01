"""The stdlib corpus: deterministic JSONL of the running Python's own sources."""

from __future__ import annotations

import json

from trainer.data import write_stdlib_corpus


def test_corpus_is_deterministic_and_capped(tmp_path, corpus, corpus_texts):
    again = write_stdlib_corpus(tmp_path / "again.jsonl", max_docs=50)
    assert again.read_bytes() == corpus.read_bytes()
    assert len(corpus_texts) == 50
    assert all(text.strip() for text in corpus_texts)
    assert any("def " in text for text in corpus_texts)

    small = write_stdlib_corpus(tmp_path / "small.jsonl", max_bytes=200_000)
    lines = small.read_text(encoding="utf-8").splitlines()
    assert lines
    assert all(set(json.loads(line)) == {"text"} for line in lines)
    assert sum(len(json.loads(line)["text"].encode()) for line in lines) <= 200_000
    # A prefix of the same sorted order as the uncapped corpus.
    assert lines == corpus.read_text(encoding="utf-8").splitlines()[: len(lines)]
