"""While a human-eval sample runs for a long time, the control plane goes on: another job launches
and finishes, and a third job's lost node is detected on time (and chain_restart acts on it).

A real `aerie up` with its in-process handlers and three real jobs on the local backend.
`eval_dispatch` really runs, on the dispatcher's slow-handler worker, for `EVAL_S` seconds: its
sampler is `tests/helpers/slow_sampler.py` (through `AERIE_EVAL_SAMPLER_COMMAND`), which speaks
the real sampler's protocol and answers after `EVAL_S`, as sampling a big checkpoint would; the
answers are then posted to a local stand-in for Slack's Web API. The issue's figure is a 60 s
eval; the test uses 25 s by default to keep the suite short (`AERIE_TEST_EVAL_S=60` runs the
acceptance figure): everything asserted happens inside the eval's running window, which the
sampler records.

Before the eval moved off the controller's thread, the reconcile loop stopped for the whole
sample: job L would launch, and job X's node be found lost, only after the eval ended.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from devtools.harness.control_plane import REPO, ControlPlane, write_spec
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.slow

EVAL_S = float(os.environ.get("AERIE_TEST_EVAL_S", "25"))
HEARTBEAT_S = 1.0
LOST_AFTER_S = 3 * HEARTBEAT_S  # the control plane's lost_after_heartbeats (3) x heartbeat_s
CHANNEL = "#eval-slow"
PROMPTS = ["def main(", "class Parser:"]

# A rank that commits a checkpoint (as the metrics stream reports one) and ends.
COMMIT = [
    "python",
    "-c",
    "import json, os, time\n"
    "path = os.path.join(os.environ['AERIE_METRICS_PATH'], 'rank-00000.jsonl')\n"
    "with open(path, 'a') as f:\n"
    "    f.write(json.dumps({'t': time.time(), 'rank': 0, 'step': 1, 'loss': 2.0, 'event': None}) + '\\n')\n"
    "    f.write(json.dumps({'t': time.time(), 'rank': 0, 'step': 1, 'event': 'checkpoint_committed',\n"
    "                        'uri': os.environ['CKPT_URI']}) + '\\n')\n"
    "time.sleep(2)\n",
]


@pytest.fixture
def cp(tmp_path, slack_standin):
    home = tmp_path / "home"
    home.mkdir()
    record = tmp_path / "sampler.jsonl"
    sampler = [sys.executable, str(REPO / "tests/helpers/slow_sampler.py"), "--seconds", str(EVAL_S)]
    plane = ControlPlane(
        home,
        extra_env={
            **slack_standin.env(),
            "AERIE_EVAL_SAMPLER_COMMAND": json.dumps([*sampler, "--record", str(record)]),
        },
    ).start()
    plane.record = record  # type: ignore[attr-defined]
    yield plane
    plane.stop()
    plane.cleanup_nodes()


def sampler_events(record: Path) -> dict[str, float]:
    if not record.exists():
        return {}
    return {e["event"]: e["t"] for e in map(json.loads, record.read_text().splitlines())}


def submit(cp: ControlPlane, tmp_path: Path, name: str, entrypoint: list[str], **fields) -> None:
    """Submit a one-node, one-rank job (its spec file under tmp_path)."""
    spec = write_spec(
        tmp_path / f"{name}.json",
        name=name,
        entrypoint=entrypoint,
        resources={"instance_count": 1, "procs_per_node": 1},
        **fields,
    )
    cp.cli("submit", str(spec), check=True)


def test_a_long_eval_holds_up_neither_launches_nor_lost_node_detection(cp, slack_standin, tmp_path):
    # Job X: a node that will be lost. Running before the eval starts.
    sleeps = ["python", "-c", "import time; time.sleep(300)"]
    submit(cp, tmp_path, "loses-a-node", sleeps, retry={"max_restarts": 0}, health={"heartbeat_s": HEARTBEAT_S})
    wait_for(
        lambda: any(n["last_heartbeat_at"] for a in cp.job("loses-a-node")["attempt_list"] for n in a["nodes"]),
        60,
        "job X's first heartbeat",
    )

    # Job E: commits a checkpoint, whose eval then runs for EVAL_S seconds.
    ckpt = {"CKPT_URI": str(tmp_path / "ckpt" / "step_00000001")}
    submit(cp, tmp_path, "evaluated", COMMIT, env=ckpt, eval={"prompts": PROMPTS, "slack_channel": CHANNEL})
    eval_start = wait_for(lambda: sampler_events(cp.record).get("start"), 60, "the eval sampler to start")

    # While it runs: job L is submitted and must launch and finish ...
    submitted = time.time()
    submit(cp, tmp_path, "launches", ["python", "-c", "print('launched')"])
    # ... and job X's agent freezes (SIGSTOP): no more heartbeats from its node.
    x = cp.job("loses-a-node")
    agent_pid = int((cp.home / "jobs" / x["id"] / "attempt-1" / "algo-1" / "agent" / "agent.pid").read_text())
    frozen_at = time.time()
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        launched = cp.wait_state("launches", {"Completed", "Failed"}, timeout_s=EVAL_S)
        lost = cp.wait_state("loses-a-node", {"Failed"}, timeout_s=EVAL_S)
    finally:
        os.kill(agent_pid, signal.SIGCONT)  # let cleanup's SIGKILL find a plain process
    during = sampler_events(cp.record)
    assert "end" not in during, f"the eval ended before the checks were done: raise AERIE_TEST_EVAL_S ({EVAL_S})"

    assert launched["state"] == "Completed"
    [attempt_l] = launched["attempt_list"]
    assert attempt_l["started_at"] - submitted < 5, "job L waited to be launched"
    assert attempt_l["started_at"] > eval_start

    [attempt_x] = lost["attempt_list"]
    assert attempt_x["reason"]["kind"] == "node.lost" and attempt_x["reason"]["host"] == "algo-1"
    # On time: the limit, plus at most one heartbeat interval, a heartbeat flush (0.5 s) and a
    # reconcile pass (0.3 s), and slack for a busy 2-core machine.
    detected_after = attempt_x["ended_at"] - frozen_at
    assert detected_after <= LOST_AFTER_S + HEARTBEAT_S + 3, detected_after
    # chain_restart (a fast handler) decided on job X while the eval was still running.
    assert lost["reason"]["retry_exhausted"] is True

    # The eval itself was real and finishes: one message per prompt, its event delivered once.
    wait_for(lambda: len(slack_standin.messages(CHANNEL)) == len(PROMPTS), EVAL_S + 60, "the eval's Slack messages")
    assert sampler_events(cp.record)["end"] - eval_start >= EVAL_S

    def checkpoint_event_status() -> str:
        rows = cp.get("/v1/jobs/evaluated/events")
        [row] = [r for r in rows if r["event"]["detail-type"] == "Aerie Checkpoint Committed"]
        return row["status"]

    wait_for(lambda: checkpoint_event_status() == "delivered", 30, "the checkpoint event marked delivered")
    assert len(slack_standin.calls_of("chat.postMessage")) == len(PROMPTS)
