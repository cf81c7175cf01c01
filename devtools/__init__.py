"""Aerie's development scaffolding, apart from the product (issue #32).

- `harness/`: drives a real Aerie from outside (`aerie up` and the CLI as subprocesses, tiny-trainer
  job specs, the chaos schedule); used by the end-to-end tests and the benches.
- `devstack`: the dev stack's loopback S3 server (moto, a separate process) that `aerie up` and the
  tests start when no endpoint is configured (`python -m devtools.devstack {up,down,status,env}`).
- `s3proxy`: a per-connection throttling TCP proxy (S3-like bandwidth caps for benchmarks and tests).
- `goodput_simulate`: a seeded discrete-event model of a long run under failures (the checkpoint
  advice's test and bench/goodput_at_scale.py).

The product never imports this package, except `aerie up`, lazily, for the dev stack. Its
third-party needs come with an extra: `pip install 'aerie[stack]'` (moto's server: enough for
`aerie up` and `make demo`) or `pip install 'aerie[dev]'` (that and the test tools).
"""
