"""Stand-in for `python -m trainer.eval_sampler` that takes as long as sampling a big model would.

Run by `lambdas/eval_dispatch` through `AERIE_EVAL_SAMPLER_COMMAND`, it speaks the sampler's own
protocol (the request as JSON on stdin: checkpoint, spec, prompts, sampling; `{"answers": [...]}`
as the last line on stdout) and answers after `--seconds`, recording in `--record` (JSON lines)
when it started and ended, so a test can tell what happened while the eval was running.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--record", required=True)
    args = p.parse_args()
    request = json.loads(sys.stdin.read())
    with open(args.record, "a") as f:
        f.write(json.dumps({"event": "start", "t": time.time(), "checkpoint": request["checkpoint"]}) + "\n")
    time.sleep(args.seconds)
    with open(args.record, "a") as f:
        f.write(json.dumps({"event": "end", "t": time.time(), "checkpoint": request["checkpoint"]}) + "\n")
    print(json.dumps({"answers": [f"answer to {prompt!r}" for prompt in request["prompts"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
