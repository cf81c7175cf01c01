"""Acceptance 2 of issue #19, end to end: a rank busy-hangs while an asynchronous checkpoint upload
is in flight, the upload crawling through a throttled S3 (a token-bucket proxy in front of the
loopback server, `devtools/s3proxy.py`, capping each connection at 1 KB/s, so the upload
outlasts the hang limit many times over). The upload is no pause: the hang is caught at the step
limit (`hang_floor_s` 12 s here), not after `pause_max_s` (1,800 s) as when any open save
suspended detection, and the half-written checkpoint is never recorded, so never `last_good`.

Real control plane, agents, torchrun ranks, DCP async save through s3torchconnector; the control
plane itself reaches S3 directly, only the trainer goes through the proxy.
"""

from __future__ import annotations

import pytest

from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import step_records, trainer_spec
from devtools.s3proxy import ProxyProcess

pytestmark = pytest.mark.slow


def test_a_busy_hang_during_a_throttled_upload_is_caught_at_the_step_limit(tmp_path, s3_server, s3_bucket):
    proxy = ProxyProcess(s3_server.host, s3_server.port, 1_000, str(tmp_path / "proxy-stats.json"))
    home = tmp_path / "home"
    home.mkdir()
    cp = ControlPlane(home, extra_env=s3_server.env()).start()
    try:
        throttled = {"AERIE_S3_ENDPOINT": proxy.endpoint_url, "AWS_ENDPOINT_URL": proxy.endpoint_url}
        spec = trainer_spec(
            tmp_path / "spec.json",
            "upload-hang",
            steps=400,
            checkpoint_uri=f"s3://{s3_bucket}/ckpt",
            every_steps=10,
            faults=[{"kind": "busy_hang", "step": 16, "rank": 3}],
            env=throttled,
        )
        cp.cli("submit", str(spec), check=True)
        job = cp.wait_state("upload-hang", {"Completed", "Failed", "Stopped"}, timeout_s=180)
        attempt = job["attempt_list"][0]
        assert attempt["reason"]["kind"] == "silent.hang", attempt["reason"]
        hangs = [v for v in job["verdicts"] if v["kind"] == "silent.hang"]
        assert hangs and not [v for v in job["verdicts"] if v["kind"] == "checkpoint.stalled"], job["verdicts"]
        # The upload of step 10 was in flight when the hang was called.
        assert any(v["evidence"]["window"]["uploads"] for v in hangs), [v["evidence"]["window"] for v in hangs]
        last_step_t = max(r["t"] for r in step_records(home / "jobs" / job["id"] / "attempt-1", rank=None))
        detected = min(v["t"] for v in hangs) - last_step_t
        print(f"busy hang during the upload detected {detected:.1f}s after the last step")
        assert detected < 12 + 10, detected  # the step limit (+ sampling, heartbeats), not pause_max_s
        recorded = cp.get(f"/v1/jobs/{job['id']}/checkpoints")
        assert recorded == [], recorded  # the half-written save is never good
    finally:
        cp.stop()
        cp.cleanup_nodes()
        proxy.proc.kill()
