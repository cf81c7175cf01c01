"""A tiny entrypoint that checks the container contract from inside a rank, then exits.

Every rank: reads resourceconfig.json (SageMaker's full layout) and hyperparameters.json, checks
them against the SM_* variables the agent derived from them, the agent's directory and the torchrun
variables, writes a few metrics lines, prints what it saw, and exits with `--exit-code`.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()

    root = Path(os.environ["AERIE_ML_ROOT"])
    resource = json.loads((root / "input/config/resourceconfig.json").read_text())
    hps = json.loads((root / "input/config/hyperparameters.json").read_text())
    hosts = json.loads(os.environ["SM_HOSTS"])
    host = os.environ["SM_CURRENT_HOST"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    problems = []
    layout = ("current_host", "current_instance_type", "current_group_name", "hosts", "instance_groups")
    missing = [k for k in (*layout, "network_interface_name") if k not in resource]
    if missing:
        problems.append(f"resourceconfig.json lacks SageMaker's {missing}")
    if os.environ.get("AERIE_NODE_DIR") != str(root / "agent"):
        problems.append(f"AERIE_NODE_DIR {os.environ.get('AERIE_NODE_DIR')!r} is not {root / 'agent'}")
    if resource["hosts"] != hosts:
        problems.append(f"resourceconfig hosts {resource['hosts']} != SM_HOSTS {hosts}")
    if resource["current_host"] != host:
        problems.append(f"resourceconfig current_host {resource['current_host']} != SM_CURRENT_HOST {host}")
    if world != len(hosts) * local_world:
        problems.append(f"WORLD_SIZE {world} != {len(hosts)} hosts x {local_world}")
    if rank != hosts.index(host) * local_world + local_rank:
        problems.append(f"RANK {rank} is not node {hosts.index(host)} x {local_world} + {local_rank}")
    if hps != json.loads(os.environ["SM_HPS"]):
        problems.append("hyperparameters.json differs from SM_HPS")
    metrics = Path(os.environ["AERIE_METRICS_PATH"]) / f"rank-{rank:05d}.jsonl"
    with open(metrics, "a") as f:
        for step in range(1, args.steps + 1):
            time.sleep(args.sleep)
            f.write(
                json.dumps(
                    {
                        "t": time.time(),
                        "rank": rank,
                        "step": step,
                        "loss": 1.0 / step,
                        "grad_norm": 1.0,
                        "lr": 1e-3,
                        "tokens": step * 64,
                        "step_s": args.sleep,
                        "event": None,
                    }
                )
                + "\n"
            )
            f.flush()
    print(f"contract ok={not problems} host={host} rank={rank} world={world} hosts={hosts} hps={hps}", flush=True)
    for problem in problems:
        print(f"CONTRACT PROBLEM: {problem}", flush=True)
    if problems:
        return 10
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
