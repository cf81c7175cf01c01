"""JSONL documents -> Megatron `.bin/.idx`, tokenized by a pool of worker processes.

(Named after Megatron-LM's tools/preprocess_data.py; a module called `preprocess` would be
shadowed by the `trainer.data.preprocess` function exported beside it.)

Mirrors Megatron-LM's tools/preprocess_data.py: one document per line, the text under
`json_key`, one sequence per document (plus `<|endoftext|>` with `append_eod`), written to
`{output_prefix}_{json_key}_document.bin/.idx` with the smallest dtype the vocabulary fits in.
The main process reads lines and writes tokens in input order; workers parse and tokenize.

An `s3://` output prefix streams the tokens straight to S3 (`aerie_s3.upload.StreamingUpload`: a
parallel multipart upload, nothing staged on disk); the `.idx` is uploaded after the `.bin` has
completed, and a failure aborts the upload, so a dataset whose `.idx` exists is whole.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from trainer.data.indexed import IndexedDatasetBuilder, best_dtype
from trainer.data.tokenizer import Tokenizer, load_tokenizer


class PreprocessError(ValueError):
    """Bad input the user can fix; `param` names the option at fault (for the CLI)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def output_prefix_for(output_prefix: str | Path, json_key: str) -> str:
    return f"{output_prefix}_{json_key}_document"


# Per-process state of a pool worker (set by _init_worker).
_encoder: dict = {}


def _init_worker(tokenizer_path, json_key: str, append_eod: bool, dtype) -> None:
    tok = load_tokenizer(tokenizer_path)
    _encoder.update(tok=tok, key=json_key, eod=append_eod, dtype=dtype)


def _encode_line(numbered_line: tuple[int, str]) -> tuple[int, np.ndarray | None, str | None]:
    """(line number, tokens, error): errors travel back so the main process reports them."""
    lineno, line = numbered_line
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        return lineno, None, f"line {lineno} is not valid JSON: {e}"
    if not isinstance(doc, dict) or _encoder["key"] not in doc:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        return lineno, None, f"line {lineno} has no key {_encoder['key']!r} (has {keys})"
    text = doc[_encoder["key"]]
    if not isinstance(text, str):
        return lineno, None, f"line {lineno}: {_encoder['key']!r} is a {type(text).__name__}, not a string"
    ids = _encoder["tok"].encode(text)
    if ids and _encoder["eod"]:
        ids.append(_encoder["tok"].eod_id)
    return lineno, np.asarray(ids, dtype=_encoder["dtype"]), None


def _read_lines(path: Path, progress) -> Iterator[tuple[int, str]]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            progress.update(len(raw))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PreprocessError(f"{path} line {lineno} is not UTF-8: {e}", "--input") from None
            if line.strip():
                yield lineno, line


def _check_first_line(path: Path, json_key: str) -> None:
    """Fail fast, before any process starts, on the commonest mistake: the wrong key."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise PreprocessError(f"{path} line {lineno} is not valid JSON: {e}", "--input") from None
            if not isinstance(doc, dict) or json_key not in doc:
                keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
                raise PreprocessError(f"{path} line {lineno} has no key {json_key!r} (keys: {keys})", "--json-key")
            return
    raise PreprocessError(f"{path} holds no documents", "--input")


def _check_bucket(uri: str) -> None:
    """Fail before tokenizing anything when the output bucket cannot be written."""
    from aerie_s3.clients import boto3_client
    from aerie_s3.listing import describe_error
    from aerie_s3.settings import parse_uri

    bucket, _ = parse_uri(uri)
    try:
        boto3_client().head_bucket(Bucket=bucket)
    except Exception as e:
        raise OSError(f"bucket {bucket}: {describe_error(e)}") from None


def preprocess(
    input: str | Path,
    json_key: str = "text",
    tokenizer: str | Path = "tokenizer.json",
    output_prefix: str | Path = "data",
    workers: int = 1,
    append_eod: bool = False,
    chunksize: int = 32,
    progress: bool = True,
) -> dict:
    """Tokenize `input` into `{output_prefix}_{json_key}_document.bin/.idx`; return statistics.

    `workers` processes tokenize in parallel (1 = in this process, no pool).
    """
    input_path = Path(input)
    if not input_path.is_file():
        raise PreprocessError(f"input file not found: {input_path}", "--input")
    if workers < 1:
        raise PreprocessError(f"workers must be at least 1, got {workers}", "--workers")
    try:
        tok: Tokenizer = load_tokenizer(tokenizer)
    except (FileNotFoundError, ValueError) as e:
        raise PreprocessError(str(e), "--tokenizer") from None
    if append_eod and tok.eod_id is None:
        raise PreprocessError(f"tokenizer {tokenizer} has no <|endoftext|> token for --append-eod", "--tokenizer")
    _check_first_line(input_path, json_key)

    dtype = best_dtype(tok.vocab_size)
    prefix = output_prefix_for(output_prefix, json_key)
    to_s3 = str(prefix).startswith("s3://")
    try:
        if to_s3:
            from aerie_s3.upload import StreamingUpload

            _check_bucket(str(prefix))
            builder = IndexedDatasetBuilder(StreamingUpload(f"{prefix}.bin"), dtype)
        else:
            Path(prefix).parent.mkdir(parents=True, exist_ok=True)
            builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype)
    except (OSError, ValueError) as e:
        raise PreprocessError(f"cannot write {prefix}.bin: {e}", "--output-prefix") from None
    tokenizer_arg = tok.source if tok.source is not None else tokenizer

    from tqdm import tqdm  # only needed here; keeps `import trainer.data` light

    bar = tqdm(
        total=input_path.stat().st_size,
        unit="B",
        unit_scale=True,
        desc=f"tokenize {input_path.name}",
        file=sys.stderr,
        disable=not progress,
        mininterval=0.5,
    )
    docs = tokens = 0
    start = time.perf_counter()
    pool = None
    try:
        lines = _read_lines(input_path, bar)
        if workers == 1:
            _init_worker(tokenizer_arg, json_key, append_eod, dtype)
            results = map(_encode_line, lines)
        else:
            # forkserver: workers start from a clean process, not a copy of a caller that may
            # hold threads (torch, tokenizers' own thread pool) that fork would break.
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["trainer.data.preprocess_data"])
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer_arg, json_key, append_eod, dtype))
            results = pool.imap(_encode_line, lines, chunksize=chunksize)
        for _lineno, ids, error in results:
            if error is not None:
                raise PreprocessError(f"{input_path} {error}", "--input")
            # Megatron: an empty document is recorded with no sequence at all.
            builder.add_document(ids, [len(ids)] if len(ids) else [])
            docs += 1
            tokens += len(ids)
    except OSError as e:  # the output (a disk, an upload) failed
        builder.abort()
        raise PreprocessError(f"cannot write {prefix}.bin: {e}", "--output-prefix") from None
    except BaseException:
        builder.abort()  # no half-written dataset left behind (an upload is aborted)
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        bar.close()
    try:
        if to_s3:
            with StreamingUpload(f"{prefix}.idx") as idx:
                builder.finalize(idx)
        else:
            builder.finalize(f"{prefix}.idx")
    except OSError as e:
        raise PreprocessError(f"cannot write {prefix}: {e}", "--output-prefix") from None
    seconds = time.perf_counter() - start
    return {
        "output_prefix": prefix,
        "docs": docs,
        "tokens": tokens,
        "bytes": input_path.stat().st_size,
        "output_bytes": tokens * np.dtype(dtype).itemsize,
        "dtype": np.dtype(dtype).name,
        "vocab_size": tok.vocab_size,
        "workers": workers,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else float("inf"),
    }
