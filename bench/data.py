"""Training data from S3 (issue 20, acceptance 5): File-mode download and FastFile training speed.

One run, on the loopback moto server (a separate process) behind `devtools/s3proxy.py`, a TCP
proxy with a token bucket per accepted connection, so each connection is capped the way S3 caps
one (~80-100 MB/s on AWS) and what is measured is the client's parallelism, not moto's speed.

  (a) File mode: a multi-object channel (`--size-mb` in `--objects` objects) downloaded by the
      agent's own code (`agent.channels.receive`: listing, HEADs for checksums, `--connections`
      CRT ranged GETs across objects, CRC32 verification, the host cache, hard links into the
      channel), vs a sequential loop of boto3 `download_file` (its default TransferConfig) over
      the same objects, through the same proxy. Goal: >= 0.8 x min(connections x cap, link),
      where link is the same download through the proxy without a cap (what the path itself can
      carry on this machine: moto, the proxy and the page cache share its cores) and connections
      the larger of those asked for and the peak the proxy saw during that transfer (the agent's
      run also opens a listing connection and checksum HEADs, which carry no transfer bytes and
      linger in the proxy's count while moto closes them; its own peak is reported as well).
  (b) FastFile vs File: the tiny model (`python -m trainer.train`, one rank) trained on a
      `--train-mb` Megatron dataset read from the channel directory (File) and streamed from S3
      through the proxy with the read-ahead (FastFile). Throughput = tokens / time of the steps
      after `--warmup`. Goal: FastFile >= 0.9 x File. Both runs must log the same losses.

Loopback moto cannot serve connections x 85 MB/s, so by default the cap is scaled down to keep
`connections x cap` at half of what moto measured uncapped ("link"); the ratios carry over.
Prints ONE JSON line.

    .venv/bin/python bench/data.py [--size-mb 1024] [--objects 64] [--connections 16] [--cap-mb auto]
        [--train-mb 64] [--steps 80] [--warmup 10] [--no-train]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from aerie_contracts import env as aerie_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aerie_contracts.container import NodeContract  # noqa: E402
from aerie_s3.clients import boto3_client  # noqa: E402
from aerie_s3.download import Transfer, download  # noqa: E402
from aerie_s3.listing import list_prefix  # noqa: E402
from aerie_s3.settings import S3Settings  # noqa: E402
from agent.channels import receive  # noqa: E402
from bench.s3stage import S3Stage  # noqa: E402
from devtools.devstack import S3Server  # noqa: E402
from devtools.s3proxy import ProxyProcess  # noqa: E402

S3_CAP_MB = 85.0
MB = 1e6


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Phase:
    """Proxy counters over one phase: seconds, peak concurrent connections."""

    def __init__(self, proxy: ProxyProcess):
        self.proxy = proxy

    def __enter__(self):
        self.proxy.reset_peak()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.peak = self.proxy.stats().peak_active


def proxied_env(server: S3Server, proxy: ProxyProcess) -> dict[str, str]:
    return {
        **os.environ,
        **server.env(),
        aerie_env.S3_ENDPOINT: proxy.endpoint_url,
        "AWS_ENDPOINT_URL": proxy.endpoint_url,
    }


def upload_channel(server: S3Server, prefix: str, size: int, objects: int) -> int:
    client = server.client()
    per = size // objects
    for i in range(objects):
        client.put_object(Bucket=server.bucket, Key=f"{prefix}/part-{i:05d}.bin", Body=os.urandom(per))
    return per * objects


def agent_download(env: dict[str, str], uri: str, work: Path, tag: str) -> tuple[float, dict]:
    """The File-mode channel as a node's agent receives it (fresh cache: everything downloads)."""
    contract = NodeContract(
        ml_root=work / tag / "algo-1", hosts=("algo-1",), current_host="algo-1", channels={"train": uri}
    )
    contract.write()
    node_env = {**env, **contract.env(), aerie_env.CHANNEL_CACHE: str(work / tag / "cache")}
    t0 = time.perf_counter()
    record = receive(contract.ml_root, node_env, contract.hosts, contract.current_host)
    return time.perf_counter() - t0, record


def bench_download(args, server, proxy, cap: float, link: float, transfer_peak: int, work: Path) -> dict:
    uri = f"s3://{server.bucket}/channel/"
    env = {**proxied_env(server, proxy), aerie_env.S3_CONNECTIONS: str(args.connections)}
    total = sum(o.size for o in list_prefix(uri, S3Settings.from_env(env)))
    with Phase(proxy) as a:
        _, record = agent_download(env, uri, work, "aerie")
    assert record["bytes"] == total, record
    aerie = total / a.seconds
    log(f"(a) agent File-mode download: {a.seconds:.1f} s, {aerie / MB:.1f} MB/s, peak {a.peak} connections")
    shutil.rmtree(work / "aerie", ignore_errors=True)

    client = boto3_client(S3Settings.from_env(env))
    out = work / "baseline"
    out.mkdir()
    with Phase(proxy) as b:
        for obj in list_prefix(uri, S3Settings.from_env(env)):
            client.download_file(obj.bucket, obj.key, str(out / Path(obj.key).name))
    baseline = total / b.seconds
    log(f"(a) sequential download_file loop: {b.seconds:.1f} s, {baseline / MB:.1f} MB/s, peak {b.peak} connections")
    shutil.rmtree(out, ignore_errors=True)

    conns = max(transfer_peak, args.connections)
    bound = min(conns * cap, link)
    return {
        "channel_MB": round(total / MB, 1),
        "objects": args.objects,
        "connections": args.connections,
        "aerie_MBps": round(aerie / MB, 2),
        "aerie_peak_connections": a.peak,
        "transfer_peak_connections": transfer_peak,
        "aerie_verified": record["channels"]["train"]["verified"],
        "baseline_download_file_loop_MBps": round(baseline / MB, 2),
        "baseline_peak_connections": b.peak,
        "ratio_vs_baseline": round(aerie / baseline, 2),
        "connections_in_bound": conns,
        "bound_MBps": round(bound / MB, 2),
        "aerie_vs_bound": round(aerie / bound, 3),
        "goal": "File-mode download >= 0.8 x min(connections x cap, link)",
        "goal_ratio_min": 0.8,
        "ok": aerie / bound >= 0.8,
    }


def make_dataset(prefix: Path, size: int, seed: int = 0) -> None:
    """Random documents of a 512-token vocabulary, as `aerie data preprocess` would write them."""
    import numpy as np

    from trainer.data.indexed import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", np.uint16)
    written = 0
    while written < size:
        doc = rng.integers(0, 512, int(rng.integers(200, 4000)), dtype=np.uint16)
        builder.add_document(doc, [len(doc)])
        written += doc.nbytes
    builder.finalize(f"{prefix}.idx")


def train(args, mode: str, root: Path, env: dict[str, str], uri: str, local_dir: Path) -> dict:
    """One rank of `trainer.train` on the `train` channel in `mode`; its step times and losses."""
    ml = root / mode
    (ml / "input" / "config").mkdir(parents=True)
    (ml / "input" / "config" / "inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": mode}}))
    metrics = ml / "output" / "metrics"
    config = {
        "model": {"preset": "pythia-tiny"},
        "data": {"channel": "train", "prefix": "bench_text_document", "cache_dir": str(root / f"index-{mode}")},
        "seq_len": 128, "micro_batch_size": 8, "steps": args.steps, "eval_every": 0, "print_every": 0,
        "warmup": 5, "instance_type": "c7i.xlarge", "checkpoint": {"every_steps": 0},
    }  # fmt: skip
    (ml / "train.yaml").write_text(json.dumps(config))
    run_env = {
        **env,
        aerie_env.ML_ROOT: str(ml),
        aerie_env.METRICS_PATH: str(metrics),
        aerie_env.CHECKPOINT_URI: "",
        "SM_CHANNEL_TRAIN": str(local_dir) if mode == "File" else str(ml / "input" / "data" / "train"),
        "SM_CHANNEL_TRAIN_S3_URI": uri,
        "SM_HPS": "{}",
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": str(args.threads),
    }  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "trainer.train", "--config", str(ml / "train.yaml")],
        env=run_env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, timeout=1800,
    )  # fmt: skip
    records = [json.loads(line) for line in (metrics / "rank-00000.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("event") is None and r.get("step") is not None]
    timed = [r for r in steps if r["step"] > args.warmup]
    tokens = 8 * 128 * len(timed)
    return {
        "tokens_per_s": tokens / sum(r["step_s"] for r in timed),
        "median_step_s": statistics.median(r["step_s"] for r in timed),
        "losses": [r["loss"] for r in steps],
    }


def bench_fastfile(args, server: S3Server, proxy: ProxyProcess, work: Path) -> dict:
    local = work / "dataset"
    local.mkdir()
    make_dataset(local / "bench_text_document", int(args.train_mb * MB))
    client = server.client()
    for ext in (".bin", ".idx"):
        client.upload_file(str(local / f"bench_text_document{ext}"), server.bucket, f"train/bench_text_document{ext}")
    env = {
        **os.environ,
        **server.env(),
        aerie_env.S3_ENDPOINT: proxy.endpoint_url,
        "AWS_ENDPOINT_URL": proxy.endpoint_url,
    }
    uri = f"s3://{server.bucket}/train/"
    runs = {}
    for mode in ("File", "FastFile"):
        with Phase(proxy) as p:
            runs[mode] = train(args, mode, work / "train", env, uri, local)
        runs[mode]["wall_s"] = p.seconds
        run = runs[mode]
        log(f"(b) {mode}: {run['tokens_per_s']:,.0f} tokens/s (median step {run['median_step_s'] * 1e3:.1f} ms)")
    ratio = runs["FastFile"]["tokens_per_s"] / runs["File"]["tokens_per_s"]
    return {
        "dataset_MB": args.train_mb,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "file_tokens_per_s": round(runs["File"]["tokens_per_s"], 1),
        "fastfile_tokens_per_s": round(runs["FastFile"]["tokens_per_s"], 1),
        "file_median_step_ms": round(runs["File"]["median_step_s"] * 1e3, 2),
        "fastfile_median_step_ms": round(runs["FastFile"]["median_step_s"] * 1e3, 2),
        "ratio": round(ratio, 3),
        "same_losses": runs["File"]["losses"] == runs["FastFile"]["losses"],
        "goal": "FastFile training throughput >= 0.9 x File mode (tiny model)",
        "goal_ratio_min": 0.9,
        "ok": ratio >= 0.9,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=1024.0, help="File-mode channel size")
    p.add_argument("--objects", type=int, default=64, help="objects in the channel")
    p.add_argument("--connections", type=int, default=16, help="ranged GETs in flight (AERIE_S3_CONNECTIONS)")
    p.add_argument("--cap-mb", default="auto", help="per-connection cap, MB/s, or 'auto' (scaled, see above)")
    p.add_argument("--train-mb", type=float, default=64.0, help="FastFile/File training dataset size")
    p.add_argument("--steps", type=int, default=80, help="training steps per run")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the throughput")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the training runs")
    p.add_argument("--no-train", action="store_true", help="skip (b)")
    args = p.parse_args()

    stage = S3Stage("aerie-bench-data-")
    work, server = stage.work, stage.server
    try:
        os.environ.update(server.env())
        total = upload_channel(server, "channel", int(args.size_mb * MB), args.objects)
        log(f"channel: {total / MB:.0f} MB in {args.objects} objects")
        # Link: the same download (the engine, same connections) through the proxy, uncapped.
        with ProxyProcess("127.0.0.1", server.port, None, str(work / "open-proxy.json")) as open_proxy:
            env = {**proxied_env(server, open_proxy), aerie_env.S3_CONNECTIONS: str(args.connections)}
            uncapped = S3Settings.from_env(env)
            objs = list_prefix(f"s3://{server.bucket}/channel/", uncapped)
            with Phase(open_proxy) as transfer:
                download([Transfer(o, work / "link" / o.key) for o in objs], settings=uncapped, verify=False)
            link = total / transfer.seconds
        shutil.rmtree(work / "link", ignore_errors=True)
        cap = min(S3_CAP_MB * MB, 0.5 * link / args.connections) if args.cap_mb == "auto" else float(args.cap_mb) * MB
        log(f"link (proxy, no cap), {args.connections} connections: {link / MB:.0f} MB/s; cap {cap / MB:.2f} MB/s")
        proxy = stage.throttle(cap)
        result = {
            "bench": "data",
            "method": "per-connection token-bucket TCP proxy (devtools/s3proxy.py) in front of moto on loopback",
            "cap_per_connection_MBps": round(cap / MB, 3),
            "cap_scaled_from_MBps": S3_CAP_MB if args.cap_mb == "auto" else None,
            "link_MBps": round(link / MB, 1),
            "file_mode_download": bench_download(args, server, proxy, cap, link, transfer.peak, work),
            "fastfile_training": {"skipped": True} if args.no_train else bench_fastfile(args, server, proxy, work),
        }
        print(json.dumps(result))
    finally:
        stage.close()


if __name__ == "__main__":
    main()
