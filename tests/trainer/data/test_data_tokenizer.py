"""Tokenizers: train a byte-level BPE, load it as tokenizer.json and as vocab.json + merges.txt."""

from __future__ import annotations

import json

import pytest

from trainer.data import load_tokenizer, train_bpe

SAMPLES = [
    "def add(a, b):\n    return a + b\n",
    "Ünïcödé text — with emoji 🐍 and tabs\t!",
    "import os\nprint(os.getcwd())<|endoftext|>next document",
]


def test_train_and_round_trip(tokenizer_path):
    tok = load_tokenizer(tokenizer_path)
    assert tok.vocab_size == 1024
    assert tok.eod_id == 0 and tok.pad_id == 1  # NeoX's layout: <|endoftext|> 0, <|padding|> 1
    for text in SAMPLES:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    # BPE learned something from the corpus: code compresses well below a token per byte.
    code = SAMPLES[0] * 20
    assert len(tok.encode(code)) < len(code.encode()) / 2
    # The end-of-document marker in text is one token, never split.
    assert tok.encode("a<|endoftext|>b").count(tok.eod_id) == 1


def test_train_from_raw_texts(tmp_path):
    texts = [f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(200)]
    tok = train_bpe(texts, 300, tmp_path / "t" / "tokenizer.json")
    assert (tmp_path / "t" / "tokenizer.json").is_file()
    assert 256 < tok.vocab_size <= 300
    assert tok.decode(tok.encode("the lazy fox")) == "the lazy fox"
    assert len(tok.encode("the quick brown fox")) < len("the quick brown fox")


def test_load_every_format_gives_the_same_ids(tmp_path, tokenizer_path):
    original = load_tokenizer(tokenizer_path)
    vocab, merges = original.save_vocab_merges(tmp_path / "gpt2")
    json.loads(vocab.read_text())  # a plain GPT-2 style vocab.json
    assert len(merges.read_text().splitlines()) > 500  # one merge per line

    loaded = [
        load_tokenizer(str(tokenizer_path)),  # tokenizer.json file
        load_tokenizer(tokenizer_path.parent),  # directory holding tokenizer.json
        load_tokenizer(tmp_path / "gpt2"),  # directory holding vocab.json + merges.txt
        load_tokenizer(vocab),  # vocab.json with merges.txt beside it
        load_tokenizer((vocab, merges)),  # explicit pair
    ]
    for tok in loaded:
        assert tok.vocab_size == original.vocab_size
        assert tok.eod_id == original.eod_id
        for text in SAMPLES:
            assert tok.encode(text) == original.encode(text)
            assert tok.decode(tok.encode(text)) == text


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "junk.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError):
        load_tokenizer(tmp_path / "junk.json")
    (tmp_path / "lonely").mkdir()
    (tmp_path / "lonely" / "vocab.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"merges\.txt"):
        load_tokenizer(tmp_path / "lonely")
