"""Fenced commits: only the job's current attempt can make a checkpoint count.

A node that was partitioned or paused (SIGSTOP, a hung hypervisor) comes back as a zombie of an
attempt the control plane already gave up on; its ranks may finish an upload and commit. The
layout keeps its objects apart (`step_N/attempt_E/`, see `aerie_contracts.checkpoints`), and the
commit goes through the control plane, which knows which attempt is current:

1. ask (`GET /v1/attempts/{id}`, `routes.attempt`): a superseded attempt stops here and writes no manifest;
2. write `manifest.json` (S3 has no transaction spanning "still current?" and this PUT);
3. record (`POST /v1/attempts/{id}/checkpoints`): the store checks, in the same transaction that
   inserts the row, that the attempt is still current, and refuses otherwise (409). This record,
   not the manifest, is what `last_good` consults, so a zombie that slipped between 1 and 2 is
   still never resumed from; it also marks its own manifest BAD when refused, for S3-only readers.

Outside Aerie (no `AERIE_API`/`AERIE_AGENT_TOKEN`/`AERIE_ATTEMPT`) there is no gate: the manifest
alone is the commit, as before. Torch-free; it speaks through the shared API client (`aerie_client`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from aerie_checkpoint import manifest
from aerie_client import ApiError, Client, backoff_s
from aerie_contracts import env, routes

log = logging.getLogger(__name__)


class Superseded(RuntimeError):
    """The control plane says this attempt is no longer its job's current one."""


@dataclass
class CommitGate:
    """This attempt's line to the control plane for checkpoint commits (agent token auth)."""

    api: str
    token: str
    attempt_id: str
    attempt: int | None = None
    timeout_s: float = 10.0
    record_budget_s: float = 30.0  # how long a commit keeps trying to reach the API to record it

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> CommitGate | None:
        api, token = env.API.get(environ=environ), env.AGENT_TOKEN.get(environ=environ)
        attempt_id = env.ATTEMPT.get(environ=environ)
        if not (api and token and attempt_id):
            return None
        number = env.ATTEMPT_NUMBER.get(environ=environ)
        return cls(api.rstrip("/"), token, attempt_id, int(number) if number and number.isdigit() else None)

    @property
    def _base(self) -> str:
        return routes.attempt(self.attempt_id)

    @cached_property
    def _client(self) -> Client:
        return Client(self.api, self.token, timeout_s=self.timeout_s)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """(status, decoded body); raises OSError when the API cannot be reached."""
        try:
            return 200, self._client.request(method, path, json=body)
        except ApiError as exc:
            if exc.status == 0:
                raise OSError(str(exc)) from None
            return exc.status, exc.body

    @staticmethod
    def _detail(body: Any) -> str:
        return str(body.get("detail") if isinstance(body, dict) else body)[:300]

    def check(self) -> None:
        """Raise `Superseded` if the control plane says this attempt is over. When it cannot be
        asked, go on: the record (step 3) decides, so nothing is lost by trying."""
        try:
            status, body = self._call("GET", self._base)
        except OSError as exc:
            log.warning("cannot ask the control plane whether %s is current (%s); committing", self.attempt_id, exc)
            return
        if status == 200 and isinstance(body, dict) and body.get("current") is False:
            raise Superseded(f"attempt {self.attempt_id} is {body.get('state')}, no longer its job's current attempt")
        if status != 200:
            log.warning("control plane answered %s to %s's check: %s", status, self.attempt_id, self._detail(body))

    def record(self, step: int, uri: str, meta: dict[str, Any]) -> bool:
        """Have the control plane record a committed checkpoint. True once recorded; raises
        `Superseded` when refused; False when it could not be reached within the budget (the
        agent forwards the `checkpoint_committed` line later, through the same check)."""
        deadline, tries = time.monotonic() + self.record_budget_s, 0
        body = {"step": int(step), "uri": uri, "meta": meta}
        while True:
            try:
                status, answer = self._call("POST", routes.attempt_checkpoints(self.attempt_id), body)
                if status < 300:
                    return True
                if status == 409:
                    raise Superseded(self._detail(answer))
                if 400 <= status < 500 and status != 429:
                    log.error("control plane refused to record %s: %s %s", uri, status, self._detail(answer))
                    return False
            except OSError as exc:
                log.warning("control plane unreachable recording %s: %s", uri, exc)
            # The shared retry policy's pauses, within this commit's own budget.
            delay = backoff_s(tries)
            tries += 1
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)

    def mark_bad(self, uri: str, reason: str) -> bool:
        """Tell the control plane a checkpoint is not to be resumed from (best effort)."""
        try:
            status, answer = self._call(
                "POST", routes.attempt_checkpoints_bad(self.attempt_id), {"uri": uri, "reason": reason[:1000]}
            )
        except OSError as exc:
            log.warning("cannot tell the control plane that %s is bad: %s", uri, exc)
            return False
        if status >= 300:
            log.warning("control plane refused to mark %s bad: %s %s", uri, status, self._detail(answer))
        return status < 300

    def recorded(self) -> dict[str, str] | None:
        """The control plane's record of the job's checkpoints ({uri: state}); None if unreachable."""
        try:
            status, rows = self._call("GET", routes.attempt_checkpoints(self.attempt_id))
        except OSError as exc:
            log.warning("cannot read the control plane's checkpoint record: %s", exc)
            return None
        if status != 200 or not isinstance(rows, list):
            log.warning("control plane answered %s for the checkpoint record: %s", status, self._detail(rows))
            return None
        return {str(r["uri"]).rstrip("/"): r["state"] for r in rows}


def commit(uri: str, gate: CommitGate | None, *, step: int, **fields: Any) -> dict[str, Any]:
    """Commit a finished save: ask, write the manifest, record it (see the module's docstring).

    Raises `Superseded` when the attempt is no longer current: then nothing counts (no manifest,
    or one marked BAD). `fields` go to `manifest.commit`. Returns the manifest.
    """
    if gate is not None:
        gate.check()
    written = manifest.commit(uri, step=step, **fields)
    if gate is None:
        return written
    meta = {"size_bytes": written["total_bytes"], "attempt": written.get("attempt"), "tokens": written["tokens"]}
    try:
        recorded = gate.record(step, uri, meta)
    except Superseded as exc:
        try:
            manifest.mark_bad(uri, f"fenced: {exc}")
        except Exception as mark_exc:  # the record already refused it; the marker only helps S3-only readers
            log.warning("could not mark the fenced checkpoint %s bad: %s", uri, mark_exc)
        raise
    if not recorded:
        log.warning("checkpoint %s committed but not yet recorded by the control plane", uri)
    return written
