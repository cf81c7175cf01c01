"""Preprocess throughput: tokens/s of `aerie data preprocess` with 1 and 2 workers.

Builds the stdlib corpus (`--max-mb` of text) and a byte-level BPE trained on it, then
tokenizes the corpus into .bin/.idx once per worker count and prints ONE JSON line:
{"bench": "preprocess", "tokens", "tokens_per_s_1w", "tokens_per_s_2w", "ratio_2w_vs_1w", ...}.
Progress bars go to stderr. Timings include starting the worker pool. The ideal ratio is 2.0 on
two idle cores; the main process's reading and writing is the serial part, and other processes
on the machine (see "loadavg_1m") take cores away from the 2-worker run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data import preprocess, train_bpe, write_stdlib_corpus


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mb", type=float, default=4.0, help="corpus size in MB of UTF-8 text")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2, help="runs per worker count; the best is kept")
    parser.add_argument("--chunksize", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="aerie-bench-preprocess-") as tmp:
        tmp = Path(tmp)
        corpus = write_stdlib_corpus(tmp / "corpus.jsonl", max_bytes=int(args.max_mb * 1e6))
        print(f"corpus: {corpus.stat().st_size / 1e6:.1f} MB; training tokenizer ...", file=sys.stderr)
        tok = train_bpe([corpus], args.vocab_size, tmp / "tokenizer.json")
        runs: dict[int, list[dict]] = {1: [], 2: []}
        for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
            for workers in (1, 2):
                cpu = _own_cpu_s()
                stats = preprocess(
                    corpus,
                    "text",
                    tok.source,
                    tmp / f"w{workers}",
                    workers,
                    append_eod=True,
                    chunksize=args.chunksize,
                    progress=True,
                )
                stats["main_cpu_s"] = _own_cpu_s() - cpu
                runs[workers].append(stats)
        results = {w: max(r, key=lambda s: s["tokens_per_s"]) for w, r in runs.items()}
        same_output = all(
            (tmp / f"w1_text_document{ext}").read_bytes() == (tmp / f"w2_text_document{ext}").read_bytes()
            for ext in (".bin", ".idx")
        )
    one, two = results[1], results[2]
    print(
        json.dumps(
            {
                "bench": "preprocess",
                "tokens": one["tokens"],
                "docs": one["docs"],
                "corpus_mb": round(one["bytes"] / 1e6, 2),
                "vocab_size": one["vocab_size"],
                "tokens_per_s_1w": round(one["tokens_per_s"]),
                "tokens_per_s_2w": round(two["tokens_per_s"]),
                "ratio_2w_vs_1w": round(two["tokens_per_s"] / one["tokens_per_s"], 3),
                "identical_output": same_output,
                # CPU the main process spends (reading, writing) per CPU of the whole 1-worker run: the
                # serial fraction that bounds the speed-up, independent of the machine's load.
                "serial_cpu_fraction_2w": round(two["main_cpu_s"] / one["main_cpu_s"], 3),
                "cpus": os.cpu_count(),
                "loadavg_1m": round(os.getloadavg()[0], 2),  # other work on the machine skews the ratio
            }
        )
    )


if __name__ == "__main__":
    main()
