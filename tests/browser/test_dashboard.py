"""The dashboard in a real browser (Chromium via Playwright) against a real control plane running
a real local job: sign in, watch the loss curve grow, see the injected hang's verdict and the
restarted attempt, click through to the checkpoints. The tests run in order on one job."""

from __future__ import annotations

from tests.browser.conftest import FAULT_STEP, JOB, wait_for


def _points(page) -> int:
    return int(page.get_attribute("#chart-loss", "data-points") or 0)


def test_sign_in_open_the_running_job_and_watch_the_loss_curve_grow(plane, page):
    page.goto(plane.url + "/ui/jobs")
    assert "/ui/login" in page.url  # no session yet: the pages send us to the form
    page.fill("#token", plane.token)
    page.click("#sign-in")
    page.wait_for_url("**/ui/jobs")
    page.wait_for_selector(f"a.job-link:has-text('{JOB}')")
    page.click(f"a.job-link:has-text('{JOB}')")
    page.wait_for_selector("#chart-loss")
    assert page.text_content("#job-state h1").startswith(JOB)
    # The page polls: once training runs, the curve has points, then more of them.
    first = wait_for(lambda: _points(page), 240, "the first points of the loss curve")
    wait_for(lambda: _points(page) > first, 60, f"the loss curve to grow past {first} points")
    assert "InProgress" in page.text_content("#job-state")
    assert page.locator("#nodes tbody tr").count() >= 1


def test_the_hang_shows_a_verdict_and_the_restarted_attempt(plane, page):
    wait_for(lambda: page.locator("#attempts tr[data-attempt='2']").count(), 240, "attempt 2 on the page")
    verdicts = page.locator("#verdicts tr.verdict")
    wait_for(lambda: verdicts.count(), 30, "the verdict row")
    assert "silent.hang" in verdicts.first.text_content()
    first = page.text_content("#attempts tr[data-attempt='1']")
    assert "Failed" in first and "silent.hang" in first
    resumed = page.text_content("#attempts tr[data-attempt='2'] td:nth-child(4)").split()
    assert resumed[0] == "step" and 10 <= int(resumed[1]) <= FAULT_STEP, resumed  # the last good checkpoint
    # The resume point is marked on the loss chart.
    wait_for(lambda: page.locator("#chart-loss text.marker-label:has-text('resumed')").count(), 30, "the resume marker")
    # The goodput panel: a stacked bar over the job's timeline with productive steps and the hang's
    # detection delay in it, tiling at most the whole width, and the share of productive time.
    wait_for(lambda: page.locator("#goodput-bar .g-detection").count(), 30, "the detection delay in the goodput bar")
    assert page.locator("#goodput-bar .g-productive").count() >= 1
    wait_for(lambda: page.locator("#goodput-bar .g-redone").count(), 60, "steps redone after the resume point")
    widths = page.locator("#goodput-bar .g").evaluate_all("els => els.map(e => e.getBoundingClientRect().width)")
    full = page.locator("#goodput-bar").evaluate("e => e.clientWidth")
    assert 0.9 * full <= sum(widths) <= full + len(widths), (sum(widths), full)
    assert 0 < float(page.get_attribute("#goodput-ratio", "data-goodput") or 0) < 1
    assert "detection delay" in page.text_content("#goodput-legend")


def test_click_through_to_the_checkpoint_list(plane, page):
    page.click("#checkpoints-link")
    page.wait_for_url("**/checkpoints")
    rows = page.locator("#checkpoints tbody tr[data-step]")
    assert rows.count() >= 1
    assert "good" in rows.first.text_content()
    steps = [
        int(s)
        for s in page.locator("#checkpoints tbody tr[data-step]").evaluate_all("rows => rows.map(r => r.dataset.step)")
    ]
    assert steps == sorted(steps, reverse=True) and min(steps) >= 10
