"""The agent's line to the control plane: heartbeats, verdicts and the node's exit, over HTTP.

Heartbeats go through a one-slot queue drained by a thread, so a slow or dead API never delays
detection; only the newest summary matters. Verdicts and the exit are sent with a few retries,
and the exit is also written to a file the backend reads, so it is never lost with the API down.

Whatever is queued is sent for the attempt it was queued for, with that attempt's token, retries
included: after an in-place restart (`retarget`) a late batch of the attempt before must not be
filed under its successor (the goodput ledger would read its steps as the successor's).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Any

from aerie_client import ApiError, Client
from aerie_contracts import memckpt, routes

log = logging.getLogger("aerie.agent")

_Target = tuple[str, str]  # (the node's path under its attempt, that attempt's token)


class Reporter:
    def __init__(self, api: str, token: str, attempt: str, host: str, timeout_s: float = 5.0):
        self.enabled = bool(api and token and attempt)
        self.host = host
        self.base = routes.node(attempt, host)
        self._token = token
        # The heartbeat's answer said the attempt is over (terminal, or the job is stopping).
        self.attempt_over = False
        # The job's newest good memory checkpoint step, as the last heartbeat's answer said (None:
        # none, or a control plane that does not say): what the memory tier must never prune.
        self.memory_good_step: int | None = None
        self._client = Client(api or "http://127.0.0.1:9", token, timeout_s=timeout_s)
        # Every queue holds (target, item): the attempt's node path and token when it was queued.
        self._beats: queue.Queue[tuple[int, _Target, dict[str, Any]]] = queue.Queue(maxsize=1)
        # One heartbeat in flight at a time, and never an older one after a newer: the control plane
        # keeps the last summary it got, and a beat the thread was still sending when a phase beat
        # went out (`heartbeat_now`) would otherwise land after it and erase the phase.
        self._beat_lock = threading.Lock()
        self._beat_numbers = itertools.count(1)
        self._beat_sent = 0
        self._thread = threading.Thread(target=self._drain, name="heartbeats", daemon=True)
        # Verdicts and checkpoints: in order, retried, and never in the way of stopping a hung node
        # (the API may be unreachable through the very link that failed).
        self._reports: queue.Queue[tuple[_Target, str, dict[str, Any]]] = queue.Queue()
        self._sender = threading.Thread(target=self._send_reports, name="reports", daemon=True)
        # Metrics batches (the dashboard's curves): a queue of their own, so a backlog never delays
        # a verdict; bounded, the oldest batch is dropped when the API is unreachable for long.
        self._metrics: queue.Queue[tuple[_Target, list[dict[str, Any]]]] = queue.Queue(maxsize=256)
        self._metrics_sender = threading.Thread(target=self._send_metrics, name="metrics", daemon=True)
        if self.enabled:
            self._thread.start()
            self._sender.start()
            self._metrics_sender.start()

    def heartbeat(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            self._beats.get_nowait()  # drop the stale one: only the newest summary matters
        except queue.Empty:
            pass
        try:
            self._beats.put_nowait((next(self._beat_numbers), self._target(), summary))
        except queue.Full:
            pass

    def heartbeat_now(self, summary: dict[str, Any]) -> bool:
        """A heartbeat that must be there before what the node reports next (a phase change: the
        model upload, before the exit): sent at once, not through the one-slot queue, where a newer
        beat may replace it and whose thread may not have sent it yet when the agent exits. A beat
        the thread is sending meanwhile lands first; one it took but had not sent yet, never."""
        number = next(self._beat_numbers)
        with self._beat_lock:
            try:
                self._beats.get_nowait()  # an older summary must not follow this one
            except queue.Empty:
                pass
            sent = bool(self._post(routes.HEARTBEAT, summary, tries=3))
            self._beat_sent = max(self._beat_sent, number)
        return sent

    def _target(self) -> _Target:
        return (self.base, self._token)

    def _drain(self) -> None:
        while True:
            number, target, summary = self._beats.get()
            with self._beat_lock:
                if number < self._beat_sent:
                    continue  # a newer beat went out while this one waited
                answer = self._post(routes.HEARTBEAT, summary, tries=1, answer=True, target=target)
                self._beat_sent = number
            if not isinstance(answer, dict):
                continue
            if answer.get("stop") and target[0] == self.base:
                self.attempt_over = True  # not for an answer about the attempt before a retarget
            good = answer.get(memckpt.HEARTBEAT_GOOD_STEP)  # job-wide: any attempt's answer holds
            self.memory_good_step = good if isinstance(good, int) and not isinstance(good, bool) else None

    def next_attempt(self) -> dict[str, Any] | None:
        """What this node does now that its worker group ended (GET .../next), None if unknown."""
        try:
            return self._get(routes.NEXT)
        except ApiError:
            return None

    def _get(self, path: str) -> dict[str, Any] | None:
        """The answer to GET `path` below this node, None if there is none; raises `ApiError`."""
        if not self.enabled:
            return None
        try:
            answer = self._client.request("GET", self.base + path, token=self._token)
        except ApiError as exc:
            if exc.retryable:
                log.debug("control plane unreachable for %s: %s", path, exc)
            else:
                log.warning("control plane refused %s: %s", path, exc)
            raise
        return answer if isinstance(answer, dict) else None

    def preflight(self, result: dict[str, Any]) -> dict[str, Any] | None:
        """Post this node's pre-flight result (POST .../preflight); the answer is the attempt's
        decision so far (`aerie_contracts.preflight.Decision`), None if it could not be sent."""
        answer = self._post(routes.PREFLIGHT, result, tries=3, answer=True)
        return answer if isinstance(answer, dict) else None

    def preflight_decision(self) -> dict[str, Any] | None:
        """The attempt's pre-flight decision (GET .../preflight), None if unknown. A control plane
        without the route (404: older than pre-flight) cannot hold the node back: start."""
        try:
            return self._get(routes.PREFLIGHT)
        except ApiError as exc:
            if exc.status == 404 and exc.body == {"detail": "Not Found"}:  # no such route
                return {"action": "start", "why": "the control plane has no pre-flight decision"}
            return None

    def retarget(self, attempt: str, token: str) -> None:
        """Speak for another attempt (an in-place successor) from now on, with its own token."""
        self.base = routes.node(attempt, self.host)
        self._token = token
        self.attempt_over = False

    def verdict(self, body: dict[str, Any]) -> None:
        if self.enabled:
            self._reports.put((self._target(), routes.VERDICTS, body))

    def checkpoint(self, body: dict[str, Any]) -> None:
        if self.enabled:
            self._reports.put((self._target(), routes.CHECKPOINTS, body))

    def metrics(self, records: list[dict[str, Any]]) -> None:
        if not self.enabled or not records:
            return
        item = (self._target(), records)
        while True:
            try:
                self._metrics.put_nowait(item)
                return
            except queue.Full:
                try:
                    self._metrics.get_nowait()
                    self._metrics.task_done()
                except queue.Empty:
                    pass

    def _send_metrics(self) -> None:
        while True:
            target, records = self._metrics.get()
            try:
                self._post(routes.METRICS, {"records": records}, tries=3, target=target)
            finally:
                self._metrics.task_done()

    def _send_reports(self) -> None:
        while True:
            target, path, body = self._reports.get()
            try:
                self._post(path, body, tries=3, target=target)
            finally:
                self._reports.task_done()

    def exit(self, body: dict[str, Any], budget_s: float = 10.0) -> bool:
        """Best effort: the outcome is on disk already. Give queued reports `budget_s` to go first."""
        if not self.enabled:
            return False
        deadline = time.time() + budget_s
        while (self._reports.unfinished_tasks or self._metrics.unfinished_tasks) and time.time() < deadline:
            time.sleep(0.1)
        return self._post(routes.EXIT, body, tries=2)

    def _post(
        self, path: str, body: dict[str, Any], tries: int, answer: bool = False, target: _Target | None = None
    ) -> Any:
        """True if accepted (with `answer`: the response's JSON), False if not. Sent for `target`
        (the attempt it was queued for), else for the current attempt."""
        if not self.enabled:
            return False
        base, token = target or self._target()
        try:
            got = self._client.request("POST", base + path, json=body, tries=tries, token=token)
        except ApiError as exc:
            if exc.retryable:
                log.debug("control plane unreachable for %s: %s", path, exc)
            else:
                log.warning("control plane refused %s: %s", path, exc)
            return False
        return (True if got is None else got) if answer else True
