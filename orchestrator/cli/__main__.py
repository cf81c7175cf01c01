"""`python -m orchestrator.cli ...`: the same `aerie` command line (the demo, the dev harness and
benchmarks run it this way, with the interpreter they were started with)."""

from orchestrator.cli import app

if __name__ == "__main__":
    app()
