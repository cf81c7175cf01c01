"""Write docs/img/job.png: the dashboard's job page (full page) for a real run with a hang.

Starts a control plane on a scratch home, runs the tiny trainer (1 node x 2 ranks, checkpoints
every 10 steps) with `busy_hang@40:rank=1`, waits for the restarted attempt to finish, signs in
with Chromium (/usr/bin/chromium, through Playwright) and screenshots the job page.

    .venv/bin/python docs/screenshot.py [OUT.png]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.harness.control_plane import ControlPlane  # noqa: E402
from devtools.harness.jobs import trainer_spec  # noqa: E402

NAME = "pythia-tiny-hang"


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="aerie-shot-"))
    (root / "home").mkdir()
    cp = ControlPlane(root / "home", extra_env={"AERIE_WEB_HEALTH_EVERY_S": "2"}).start()
    try:
        spec = trainer_spec(
            root / "spec.json",
            NAME,
            steps=160,
            nodes=1,
            procs=2,
            faults=[{"kind": "busy_hang", "step": 40, "rank": 1}],
            checkpoint_uri=f"file://{root / 'ckpt'}",
            every_steps=10,
            max_restarts=1,
        )
        cp.cli("submit", str(spec), check=True)
        job = cp.wait_state(NAME, {"Completed", "Failed", "Stopped"}, timeout_s=600)
        print(f"job {job['id']} {job['state']} after {len(job['attempt_list'])} attempts", flush=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(cp.url + "/ui/login")
            page.fill("#token", cp.token)
            page.click("#sign-in")
            page.wait_for_url("**/ui/jobs")
            page.goto(f"{cp.url}/ui/jobs/{job['id']}")
            deadline = time.time() + 30
            while int(page.get_attribute("#chart-loss", "data-points") or 0) == 0 and time.time() < deadline:
                time.sleep(0.3)
            time.sleep(1)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
            browser.close()
        print(f"wrote {out}")
    finally:
        cp.stop()
        cp.cleanup_nodes()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "img" / "job.png")
