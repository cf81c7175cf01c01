"""`aerie data preprocess`: the function, the pool, and the typer command with its errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from trainer.data import IndexedDataset, load_tokenizer, preprocess
from trainer.data.cli import data_app
from trainer.data.preprocess_data import PreprocessError


def test_preprocess_writes_tokens_per_document(tmp_path, corpus, corpus_texts, tokenizer_path, dataset_prefix):
    tok = load_tokenizer(tokenizer_path)
    ds = IndexedDataset(dataset_prefix)
    assert dataset_prefix.endswith("corpus_text_document")
    assert ds.dtype is np.uint16  # vocab 1024 < 65500
    assert ds.num_documents == len(corpus_texts) == len(ds)
    for i, text in enumerate(corpus_texts):
        assert ds[i].tolist() == tok.encode(text) + [tok.eod_id]

    stats = preprocess(corpus, "text", tokenizer_path, tmp_path / "noeod", workers=1, append_eod=False, progress=False)
    assert stats["docs"] == len(corpus_texts)
    assert stats["tokens"] == ds.num_tokens - len(corpus_texts)
    assert IndexedDataset(stats["output_prefix"])[0].tolist() == tok.encode(corpus_texts[0])


def test_workers_write_identical_files(tmp_path, corpus, tokenizer_path, dataset_prefix):
    stats = preprocess(
        corpus, "text", tokenizer_path, tmp_path / "pool", workers=2, append_eod=True, chunksize=4, progress=False
    )
    assert stats["workers"] == 2 and stats["tokens_per_s"] > 0
    for ext in (".bin", ".idx"):
        with open(dataset_prefix + ext, "rb") as a, open(stats["output_prefix"] + ext, "rb") as b:
            assert a.read() == b.read()


def test_empty_documents_and_other_keys(tmp_path, tokenizer_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(["hello", "", "world"])) + "\n\n")
    stats = preprocess(src, "body", tokenizer_path, tmp_path / "o", workers=2, append_eod=True, progress=False)
    ds = IndexedDataset(tmp_path / "o_body_document")
    assert stats["docs"] == 3
    assert ds.document_indices.tolist() == [0, 1, 1, 2]  # the empty document holds no sequence
    assert len(ds) == 2


def _invoke(*args):
    return CliRunner().invoke(data_app, ["preprocess", *args, "--no-progress"])


def test_cli(tmp_path, corpus, tokenizer_path, dataset_prefix):
    result = _invoke(
        "--input",
        str(corpus),
        "--tokenizer",
        str(tokenizer_path),
        "--output-prefix",
        str(tmp_path / "cli"),
        "--append-eod",
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["docs"] == 50 and stats["dtype"] == "uint16"
    assert (tmp_path / "cli_text_document.idx").read_bytes() == open(dataset_prefix + ".idx", "rb").read()


def _assert_usage_error(result, *fragments):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    flat = " ".join(result.output.replace("│", " ").split())  # undo the error box's wrapping
    for fragment in fragments:
        assert fragment in flat, result.output


def test_cli_bad_input(tmp_path, corpus, tokenizer_path):
    out = str(tmp_path / "o")
    _assert_usage_error(
        _invoke("--input", str(tmp_path / "nope.jsonl"), "--tokenizer", str(tokenizer_path), "--output-prefix", out),
        "--input",
        "not found",
    )
    _assert_usage_error(
        _invoke(
            "--input", str(corpus), "--json-key", "content", "--tokenizer", str(tokenizer_path), "--output-prefix", out
        ),
        "--json-key",
        "'content'",
    )
    _assert_usage_error(
        _invoke("--input", str(corpus), "--tokenizer", str(tmp_path / "no-tokenizer.json"), "--output-prefix", out),
        "--tokenizer",
    )
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"text": "fine"}\n{"text": "fine too"}\n{"txt": "typo"}\n')
    _assert_usage_error(
        _invoke("--input", str(bad_line), "--tokenizer", str(tokenizer_path), "--output-prefix", out, "--workers", "2"),
        "line 3",
        "'text'",
    )
    not_json = tmp_path / "not.jsonl"
    not_json.write_text("plain text\n")
    _assert_usage_error(
        _invoke("--input", str(not_json), "--tokenizer", str(tokenizer_path), "--output-prefix", out),
        "not valid JSON",
    )
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    _assert_usage_error(
        _invoke("--input", str(latin1), "--tokenizer", str(tokenizer_path), "--output-prefix", out),
        "line 2",
        "not UTF-8",
    )
    assert not (tmp_path / "o_text_document.bin").exists()  # no half-written output left
    (tmp_path / "a-file").write_text("")
    _assert_usage_error(
        _invoke(
            "--input",
            str(corpus),
            "--tokenizer",
            str(tokenizer_path),
            "--output-prefix",
            str(tmp_path / "a-file" / "x"),
        ),
        "--output-prefix",
    )
    _assert_usage_error(
        _invoke("--input", str(corpus), "--tokenizer", str(tokenizer_path), "--output-prefix", out, "--workers", "0"),
        "--workers",
    )


def test_function_errors_name_the_option(tmp_path, corpus, tokenizer_path):
    with pytest.raises(PreprocessError) as e:
        preprocess(corpus, "nokey", tokenizer_path, tmp_path / "o")
    assert e.value.param == "--json-key"


def test_data_layer_imports_without_torch():
    code = (
        "import sys, trainer.data, trainer.data.cli, trainer.data.preprocess_data, trainer.data.gpt_dataset;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_mount_needs_neither_numpy_nor_tokenizers():
    """orchestrator/cli/ imports data_app; the orchestrator's core install lacks the train extra."""
    code = (
        "import sys, trainer.data.cli;"
        "heavy = {'numpy', 'tokenizers', 'torch'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mounts_as_aerie_data():
    """orchestrator/cli/ mounts `data_app` as `aerie data`; check that shape works."""
    import typer

    app = typer.Typer()

    @app.command()
    def version() -> None:
        pass

    app.add_typer(data_app, name="data")
    result = CliRunner().invoke(app, ["data", "preprocess", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--input", "--json-key", "--tokenizer", "--output-prefix", "--workers", "--append-eod"):
        assert option in result.output
