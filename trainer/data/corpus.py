"""A text corpus that needs no download: the running Python's standard-library sources.

Tests, benches and the demo train their tokenizer and model on it. Files are visited in sorted
order so the same Python always yields the same corpus, byte for byte.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

# Third-party code installed next to the stdlib is not part of it.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def iter_stdlib_sources() -> Iterator[tuple[str, str]]:
    """(relative path, text) of every UTF-8 .py file of the stdlib, in sorted path order."""
    root = stdlib_dir()
    paths = sorted(
        (p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test fixtures are deliberately not UTF-8
        if text.strip():
            yield path.relative_to(root).as_posix(), text


def write_stdlib_corpus(out_jsonl: str | Path, max_docs: int | None = None, max_bytes: int | None = None) -> Path:
    """Write one `{"text": ...}` line per stdlib .py file to `out_jsonl`; return its path.

    `max_docs` caps the number of files, `max_bytes` the UTF-8 size of their texts (the file
    that would cross the cap is left out, so the result never exceeds it).
    """
    out = Path(out_jsonl)
    out.parent.mkdir(parents=True, exist_ok=True)
    docs = size = 0
    with out.open("w", encoding="utf-8") as f:
        for _, text in iter_stdlib_sources():
            if max_docs is not None and docs >= max_docs:
                break
            n = len(text.encode("utf-8"))
            if max_bytes is not None and size + n > max_bytes:
                if docs == 0:
                    continue  # keep looking for a file small enough to fit
                break
            f.write(json.dumps({"text": text}) + "\n")
            docs += 1
            size += n
    return out
