"""Tokenizers loaded and trained with the `tokenizers` library (no vocabulary download).

`load_tokenizer` accepts what Megatron/NeoX users have on disk: a Hugging Face `tokenizer.json`,
or a GPT-2 style `vocab.json` + `merges.txt` pair. `train_bpe` builds a byte-level BPE (as GPT-2
and the Pythia/NeoX tokenizer are) with `<|endoftext|>` = 0 and `<|padding|>` = 1, like NeoX's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|padding|>"
# Fallbacks for tokenizers that name their end-of-document token differently (LLaMA, T5 ...).
_EOD_CANDIDATES = (EOD_TOKEN, "</s>", "<|end_of_text|>", "<eos>")


class Tokenizer:
    """A thin wrapper with the four things the data pipeline needs; picklable via its path."""

    def __init__(self, hf: _HFTokenizer, source: str | Path | tuple[str, str] | None = None) -> None:
        self.hf = hf
        self.source = source
        self.eod_id: int | None = next((i for i in (hf.token_to_id(t) for t in _EOD_CANDIDATES) if i is not None), None)
        self.pad_id: int | None = hf.token_to_id(PAD_TOKEN)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: str | Path) -> Path:
        """Save as a Hugging Face tokenizer.json."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(path))
        return path

    def save_vocab_merges(self, directory: str | Path) -> tuple[Path, Path]:
        """Save the GPT-2 style pair `vocab.json` + `merges.txt` (BPE models only)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.hf.model.save(str(directory))
        return directory / "vocab.json", directory / "merges.txt"

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, eod_id={self.eod_id}, source={self.source!r})"


def _byte_level(hf: _HFTokenizer) -> _HFTokenizer:
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return hf


def _from_vocab_merges(vocab: Path, merges: Path) -> _HFTokenizer:
    for p in (vocab, merges):
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {p}")
    hf = _byte_level(_HFTokenizer(models.BPE.from_file(str(vocab), str(merges))))
    # GPT-2's vocab.json lists <|endoftext|> as an ordinary entry: mark it special so it is
    # never split and decodes as itself.
    with vocab.open(encoding="utf-8") as f:
        entries = json.load(f)
    specials = [t for t in (EOD_TOKEN, PAD_TOKEN) if t in entries]
    if specials:
        hf.add_special_tokens(specials)
    return hf


def load_tokenizer(path: str | Path | Sequence[str | Path]) -> Tokenizer:
    """Load a tokenizer from any of:

    - a `tokenizer.json` file (Hugging Face format),
    - a directory holding `tokenizer.json`, or `vocab.json` + `merges.txt`,
    - a `vocab.json` file with `merges.txt` beside it,
    - a pair `(vocab.json, merges.txt)`.
    """
    if isinstance(path, (list, tuple)):
        if len(path) != 2:
            raise ValueError(f"expected (vocab.json, merges.txt), got {path!r}")
        vocab, merges = (Path(p) for p in path)
        return Tokenizer(_from_vocab_merges(vocab, merges), (str(vocab), str(merges)))
    p = Path(path)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return Tokenizer(_HFTokenizer.from_file(str(p / "tokenizer.json")), p / "tokenizer.json")
        if (p / "vocab.json").is_file():
            return Tokenizer(_from_vocab_merges(p / "vocab.json", p / "merges.txt"), p)
        raise FileNotFoundError(f"no tokenizer.json or vocab.json + merges.txt in {p}")
    if not p.is_file():
        raise FileNotFoundError(f"tokenizer not found: {p}")
    if p.name == "vocab.json":
        return Tokenizer(_from_vocab_merges(p, p.with_name("merges.txt")), p)
    try:
        return Tokenizer(_HFTokenizer.from_file(str(p)), p)
    except Exception as e:  # the Rust error says little about what the file is
        raise ValueError(f"{p} is not a Hugging Face tokenizer.json: {e}") from e


def _iter_texts(texts_or_files: Iterable[str | Path], json_key: str) -> Iterator[str]:
    """Strings are texts unless they name an existing file; Paths are files (.jsonl: `json_key`)."""
    for item in texts_or_files:
        path = item if isinstance(item, Path) else None
        if path is None and isinstance(item, str) and len(item) < 4096 and "\n" not in item:
            candidate = Path(item)
            if candidate.is_file():
                path = candidate
        if path is None:
            yield str(item)
        elif path.suffix in (".jsonl", ".json"):
            with path.open(encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield json.loads(line)[json_key]
        else:
            yield path.read_text(encoding="utf-8")


def train_bpe(
    texts_or_files: Iterable[str | Path],
    vocab_size: int,
    out_path: str | Path,
    min_frequency: int = 2,
    json_key: str = "text",
) -> Tokenizer:
    """Train a byte-level BPE and save it as tokenizer.json at `out_path`.

    Items are raw texts, or paths of text files / JSONL files (the `json_key` field of each line).
    Every byte is in the base alphabet, so any text encodes without unknown tokens.
    """
    hf = _byte_level(_HFTokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOD_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(_iter_texts(texts_or_files, json_key), trainer=trainer)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    hf.save(str(out))
    return Tokenizer(hf, out)
