"""The GPU probe watches the GPUs the ranks own, not every GPU on the host.

No NVIDIA GPU here: `pynvml` is the stand-in of tests/helpers/nvml_standin.py (nvidia-ml-py's API
and errors). The rank processes are real (sleepers whose pids sit in `ranks/rank-N.pid`), the
metrics stream is a real file, and verdicts come from the live `Monitor` -> detectors path.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent.devices import visible
from agent.monitor import Monitor
from tests.helpers.nvml_standin import Gpu, eight_gpus, module

HEALTH = {"startup_grace_s": 0, "gpu_idle_s": 5, "sample_s": 1, "hang_floor_s": 600, "gpus": "owned"}
BUSY, IDLE = [90.0] * 4, [0.0] * 4


@pytest.fixture
def ranks(tmp_path):
    """Four real rank processes (0-3) recorded where the agent reads them."""
    (tmp_path / "node" / "ranks").mkdir(parents=True)
    (tmp_path / "metrics").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(4)]
    for r, p in enumerate(procs):
        (tmp_path / "node" / "ranks" / f"rank-{r}.pid").write_text(str(p.pid))
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    return monkeypatch


def run_monitor(tmp_path, monkeypatch, devices: list[Gpu], **health) -> tuple[Monitor, list]:
    """Twelve one-second ticks of a training node whose four ranks all complete steps."""
    monkeypatch.setitem(sys.modules, "pynvml", module(devices))
    mon = Monitor(
        node_dir=tmp_path / "node",
        metrics_dir=tmp_path / "metrics",
        health={**HEALTH, **health},
        interfaces=["lo"],
        started_at=1000.0,
        accelerator="nvml",
    )
    verdicts = []
    for k in range(12):
        now = 1000.0 + k
        for r in range(4):
            with open(tmp_path / "metrics" / f"rank-{r:05d}.jsonl", "a") as f:
                f.write(json.dumps({"t": now, "rank": r, "step": k + 1, "loss": 2.0, "step_s": 1.0, "event": None}))
                f.write("\n")
        verdicts += mon.tick(now)
    return mon, verdicts


def test_eight_gpus_four_visible_raise_no_gpu_idle_for_the_other_four(tmp_path, ranks, clean_env):
    """Acceptance 4: CUDA_VISIBLE_DEVICES=0,1,2,3 on an 8-GPU host; GPUs 4-7 idle, not ours."""
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    mon, verdicts = run_monitor(tmp_path, clean_env, eight_gpus(BUSY + IDLE))
    assert [v.kind for v in verdicts] == []
    assert mon.accel.watched == [0, 1, 2, 3]
    assert sorted(int(k) for k in mon.obs.accel) == [0, 1, 2, 3]
    assert [a["index"] for a in mon.summary()["accelerators"]] == [0, 1, 2, 3]


def test_the_detector_still_sees_an_owned_gpu_go_idle(tmp_path, ranks, clean_env):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    _, verdicts = run_monitor(tmp_path, clean_env, eight_gpus([90.0, 90.0, 0.0, 90.0] + IDLE))
    assert [(v.kind, v.evidence["index"]) for v in verdicts] == [("silent.gpu_idle", "2")]


def test_health_gpus_all_watches_every_gpu(tmp_path, ranks, clean_env):
    """The spec's opt-out: `health.gpus: all` samples the whole host (and so flags GPU 4 here)."""
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    mon, verdicts = run_monitor(tmp_path, clean_env, eight_gpus(BUSY + IDLE), gpus="all")
    assert mon.accel.watched == list(range(8))
    assert [(v.kind, v.evidence["index"]) for v in verdicts] == [("silent.gpu_idle", "4")]


def test_the_ranks_actual_devices_come_from_the_nvml_process_list(tmp_path, ranks, clean_env):
    """No visible-device variable at all: the ranks' pids on GPUs 2, 3, 5, 6 decide."""
    util = [0.0, 0.0, 90.0, 90.0, 0.0, 90.0, 90.0, 0.0]
    on = {2: [ranks[0]], 3: [ranks[1]], 5: [ranks[2]], 6: [ranks[3], 4242]}
    mon, verdicts = run_monitor(tmp_path, clean_env, eight_gpus(util, on))
    assert verdicts == [] and mon.accel.watched == [2, 3, 5, 6]


def test_a_cuda_context_held_by_a_child_of_the_rank_counts(tmp_path, ranks, clean_env):
    """The recorded rank process may be a launcher whose child owns the CUDA context."""
    spawn = "import subprocess, time; c = subprocess.Popen(['sleep', '60']); print(c.pid, flush=True); c.wait()"
    parent = subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        (tmp_path / "node" / "ranks" / "rank-0.pid").write_text(str(parent.pid))
        mon, verdicts = run_monitor(tmp_path, clean_env, eight_gpus(BUSY + IDLE, {1: [child]}))
        assert verdicts == [] and mon.accel.watched == [1]
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_gpu_uuids_and_mig_devices_in_the_visible_list(tmp_path, ranks, clean_env):
    gpus = eight_gpus(BUSY + IDLE)
    gpus[1].mig = ["MIG-5d3b1a2c-0000-1111-2222-333344445555"]
    clean_env.setenv(
        "CUDA_VISIBLE_DEVICES", f"{gpus[0].uuid[:12]},MIG-5d3b1a2c-0000-1111-2222-333344445555,{gpus[3].uuid}"
    )
    mon, verdicts = run_monitor(tmp_path, clean_env, gpus)
    assert verdicts == [] and mon.accel.watched == [0, 1, 3]


@pytest.mark.parametrize(
    "env, tokens",
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": "0,1,-1,3"}, ("0", "1")),  # CUDA stops at the first invalid entry
        ({"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "all"}, ()),  # CUDA's own list wins
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, ()),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-abc,GPU-def"}, ("GPU-abc", "GPU-def")),
    ],
)
def test_visible_device_variables(env, tokens):
    assert visible(env).tokens == tokens


def test_nvidia_visible_devices_inside_a_container_are_already_applied():
    """The runtime mounted GPUs 4 and 5; NVML inside the container sees them as 0 and 1."""
    seen = [(0, "GPU-e", ()), (1, "GPU-f", ())]
    assert visible({"NVIDIA_VISIBLE_DEVICES": "4,5"}).pick(seen) == [0, 1]
    host = [(i, f"GPU-{i}", ()) for i in range(8)]  # bare metal: NVML sees the whole host
    assert visible({"NVIDIA_VISIBLE_DEVICES": "4,5"}).pick(host) == [4, 5]
