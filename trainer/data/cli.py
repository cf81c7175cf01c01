"""`aerie data ...` commands (mounted by orchestrator/cli/ as the `data` sub-app)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

data_app = typer.Typer(help="Prepare training data: tokenize JSONL into Megatron .bin/.idx.", no_args_is_help=True)


@data_app.callback()
def data() -> None:
    """Prepare training data (a callback keeps `data` a command group with one command)."""


@data_app.command("preprocess")
def preprocess_command(
    input: Path = typer.Option(..., "--input", help="JSONL file, one document per line."),
    json_key: str = typer.Option("text", "--json-key", help="Key of the text in each JSON line."),
    tokenizer: Path = typer.Option(
        ..., "--tokenizer", help="tokenizer.json, or a directory / vocab.json with merges.txt beside it."
    ),
    output_prefix: str = typer.Option(
        ...,
        "--output-prefix",
        help="Writes PREFIX_<key>_document.bin/.idx; an s3://bucket/path prefix streams them to S3 "
        "(parallel multipart upload, nothing staged on disk).",
    ),
    workers: int = typer.Option(1, "--workers", min=1, help="Tokenizer processes."),
    append_eod: bool = typer.Option(
        False, "--append-eod/--no-append-eod", help="End every document with <|endoftext|>."
    ),
    chunksize: int = typer.Option(32, "--chunksize", min=1, help="Documents per task sent to a worker."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    """Tokenize a JSONL corpus into Megatron-LM's indexed dataset format."""
    from trainer.data.preprocess_data import PreprocessError, preprocess

    try:
        stats = preprocess(input, json_key, tokenizer, output_prefix, workers, append_eod, chunksize, progress)
    except PreprocessError as e:
        raise typer.BadParameter(str(e), param_hint=e.param) from None
    typer.echo(json.dumps(stats))
