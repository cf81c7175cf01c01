"""Browser fixtures: Debian's Chromium (/usr/bin/chromium) driven by Playwright's Python package,
and one real local job with an injected fault that every browser test watches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools.harness.control_plane import ControlPlane
from devtools.harness.jobs import trainer_spec
from tests.helpers.wait import wait_for

CHROMIUM = "/usr/bin/chromium"
JOB = "dash"
FAULT_STEP = 40


def launch_chromium(playwright):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install chromium` (make test does it)")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """A real `aerie up` running one job: 1 node x 2 ranks of the tiny trainer, checkpoints every 10
    steps to a local directory, rank 1 hung (busy) at step FAULT_STEP, one restart allowed."""
    root = tmp_path_factory.mktemp("dashboard")
    home = root / "home"
    home.mkdir()
    cp = ControlPlane(home, extra_env={"AERIE_WEB_HEALTH_EVERY_S": "2"}).start()
    spec = trainer_spec(
        root / "spec.json",
        JOB,
        steps=90,
        nodes=1,
        procs=2,
        faults=[{"kind": "busy_hang", "step": FAULT_STEP, "rank": 1}],
        checkpoint_uri=f"file://{root / 'ckpt'}",
        every_steps=10,
        max_restarts=1,
    )
    cp.cli("submit", str(spec), check=True)
    yield cp
    cp.stop()
    cp.cleanup_nodes()


@pytest.fixture(scope="module")
def page(plane):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(30_000)
        yield context.new_page()
        browser.close()


__all__ = ["FAULT_STEP", "JOB", "Path", "launch_chromium", "wait_for"]
