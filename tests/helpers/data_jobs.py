"""Jobs that train on a dataset in S3 (issue 20's end-to-end tests, local and Slurm): the dataset
made by the real `aerie data preprocess --output-prefix s3://...`, a few small shard objects, a
training config that reads the `train` channel, and a submit-and-wait helper."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from aerie_s3.clients import boto3_client
from devtools.harness.control_plane import REPO, ControlPlane
from devtools.harness.jobs import FAST_HEALTH

STEPS = 6
SHARDS = {f"shards/part-{i}.txt": f"shard {i}\n".encode() for i in range(3)}


def prepare_dataset(cp: ControlPlane, bucket: str, work: Path) -> dict:
    """A tokenizer trained here and a corpus preprocessed by the CLI straight into the bucket,
    the shard objects, and a training config reading `train`: {"config", "uri", "objects"}."""
    from trainer.data import train_bpe, write_stdlib_corpus

    corpus = write_stdlib_corpus(work / "docs.jsonl", max_docs=40)
    tok = train_bpe([corpus], 512, work / "tokenizer.json")
    r = cp.cli(
        "data", "preprocess", "--input", str(corpus), "--tokenizer", str(tok.source), "--output-prefix",
        f"s3://{bucket}/datasets/stdlib/corpus", "--append-eod", "--no-progress", check=True,
    )  # fmt: skip
    assert json.loads(r.stdout.strip().splitlines()[-1])["output_prefix"].startswith("s3://")
    s3 = boto3_client()
    for key, body in SHARDS.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    # The example's config (data from the `train` channel), shortened.
    config = yaml.safe_load((REPO / "examples" / "configs" / "pythia-tiny-channel.yaml").read_text())
    config.update(seq_len=32, micro_batch_size=4, steps=STEPS, eval_every=0, print_every=1, warmup=2)
    assert config["data"]["channel"] == "train" and config["data"]["prefix"] == "corpus_text_document"
    path = work / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return {"config": path, "uri": f"s3://{bucket}/datasets/stdlib", "objects": objects(bucket, "datasets/")}


def objects(bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = boto3_client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def submit(cp: ControlPlane, tmp: Path, name: str, inputs: list[dict], config: Path, **extra) -> dict:
    """Submit a 2-node x 1-rank trainer job reading `inputs`; wait for its end."""
    spec = {
        "name": name,
        "entrypoint": ["python", "-m", "trainer.train"],
        "args": ["--config", str(config)],
        "inputs": inputs,
        "resources": {"instance_count": 2, "procs_per_node": 1},
        "health": FAST_HEALTH,
        "backend_options": {"workdir": str(REPO)},
        **extra,
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    cp.cli("submit", str(path), check=True)
    return cp.wait_state(name, {"Completed", "Failed", "Stopped"}, timeout_s=300)


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
