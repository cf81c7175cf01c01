"""The agent's reporter sends what it queued for the attempt it queued it for: a batch of step
points retried after an in-place restart (`retarget`) still goes to the attempt before, with that
attempt's token (else the goodput ledger reads its steps as the successor's)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aerie_contracts import sagemaker_api as contract
from agent.report import Reporter
from tests.helpers.wait import wait_for


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict]] = []
    fail_first_metrics = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        type(self).seen.append((self.path, self.headers.get("Authorization", ""), body))
        status = 200
        if self.path.endswith("/metrics") and type(self).fail_first_metrics:
            type(self).fail_first_metrics = False
            time.sleep(0.2)  # the agent restarts in place meanwhile
            status = 503
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def test_a_retried_batch_goes_to_the_attempt_it_was_queued_for():
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rep = Reporter(f"http://127.0.0.1:{server.server_port}", "tok-1", "job-a1", "algo-1")
        rep.metrics([{"step": 29, "t": 1.0}])
        rep.checkpoint({"step": 28, "uri": "mem://j/step_00000028/attempt_0001"})
        wait_for(what="the first try", check=lambda: _Recorder.seen, timeout_s=10, every_s=0.01)
        rep.retarget("job-a2", "tok-2")  # in place: attempt 2 from now on
        rep.metrics([{"step": 30, "t": 2.0}])
        rep.heartbeat({"t": 2.0})
        wait_for(what="every post", check=lambda: len(_Recorder.seen) >= 5, timeout_s=10, every_s=0.01)
    finally:
        server.shutdown()
    sent = [(path.rsplit("/", 1)[-1], path.split("/")[3], auth, body) for path, auth, body in _Recorder.seen]
    metrics = [(attempt, auth, body["records"][0]["step"]) for what, attempt, auth, body in sent if what == "metrics"]
    assert metrics.count(("job-a1", "Bearer tok-1", 29)) == 2  # the first try and its retry
    assert ("job-a2", "Bearer tok-2", 30) in metrics and len(metrics) == 3
    [ckpt] = [(attempt, auth) for what, attempt, auth, _ in sent if what == "checkpoints"]
    assert ckpt == ("job-a1", "Bearer tok-1")
    [beat] = [(attempt, auth) for what, attempt, auth, _ in sent if what == "heartbeat"]
    assert beat == ("job-a2", "Bearer tok-2")


class _Answering(BaseHTTPRequestHandler):
    answer = b'{"ok":true,"stop":false,"memory_good_step":10}'

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(type(self).answer)

    def log_message(self, *args) -> None:
        pass


def test_the_heartbeats_answer_says_which_memory_checkpoint_the_node_must_keep():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rep = Reporter(f"http://127.0.0.1:{server.server_port}", "tok-1", "job-a1", "algo-1")
        assert rep.memory_good_step is None
        rep.heartbeat({"t": 1.0})
        wait_for(what="the answer's good step", check=lambda: rep.memory_good_step == 10, timeout_s=10, every_s=0.01)
        _Answering.answer = b'{"ok":true,"stop":false,"memory_good_step":null}'  # none good any more
        rep.heartbeat({"t": 2.0})
        wait_for(what="no good step", check=lambda: rep.memory_good_step is None, timeout_s=10, every_s=0.01)
    finally:
        server.shutdown()


def test_a_phase_heartbeat_has_arrived_when_it_returns():
    """The model upload's `phase: uploading` beat goes out at once, not through the one-slot queue
    (whose thread may not have sent it when the agent reports its exit and ends): SageMaker's
    Uploading transition depends on it being stored before the job completes."""
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rep = Reporter(f"http://127.0.0.1:{server.server_port}", "tok-1", "job-a1", "algo-1")
        beat = {"t": 3.0, contract.PHASE: contract.PHASE_UPLOADING}
        assert rep.heartbeat_now(beat)
        assert [(p.rsplit("/", 1)[-1], b) for p, _, b in _Recorder.seen] == [("heartbeat", beat)]
    finally:
        server.shutdown()


class _SlowFirstBeat(BaseHTTPRequestHandler):
    """Records each heartbeat when its answer is sent; the first one is slow (a loaded API)."""

    stored: list[dict] = []
    first = True
    arrived = threading.Event()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if type(self).first:
            type(self).first = False
            type(self).arrived.set()
            time.sleep(0.5)
        type(self).stored.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def test_a_beat_in_flight_never_lands_after_the_phase_beat():
    """The control plane keeps the last summary it got: a periodic beat the thread was still
    sending when the upload's phase beat went out must land before it, not after (it erased the
    Uploading transition of a SageMaker job on a loaded CI host)."""
    _SlowFirstBeat.stored, _SlowFirstBeat.first = [], True
    _SlowFirstBeat.arrived.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowFirstBeat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rep = Reporter(f"http://127.0.0.1:{server.server_port}", "tok-1", "job-a1", "algo-1")
        rep.heartbeat({"t": 1.0})
        assert _SlowFirstBeat.arrived.wait(10)  # the thread is sending it
        phase = {"t": 2.0, contract.PHASE: contract.PHASE_UPLOADING}
        assert rep.heartbeat_now(phase)
        rep.heartbeat({"t": 3.0, contract.PHASE: contract.PHASE_UPLOADING})
        wait_for(what="three beats", check=lambda: len(_SlowFirstBeat.stored) >= 3, timeout_s=10, every_s=0.01)
    finally:
        server.shutdown()
    assert [b["t"] for b in _SlowFirstBeat.stored] == [1.0, 2.0, 3.0]
