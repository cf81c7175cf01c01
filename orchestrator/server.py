"""Assemble a control plane from settings: store, backends, controller and API in one process."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import select

from orchestrator.api import create_app
from orchestrator.backends.base import Backend
from orchestrator.backends.local import LocalBackend
from orchestrator.controller import Controller
from orchestrator.events import Dispatcher, default_subscriptions
from orchestrator.leader import leader_lock_for
from orchestrator.settings import Settings
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Event, Job, Token, now

IN_PROCESS = "in-process handlers"


def ensure_admin_token(db: Database, path: Path) -> str:
    """The admin token: made at first start, kept in a 0600 file, stored only as a hash."""
    if path.exists():
        token = path.read_text().strip()
    else:
        token = None
    with db.session() as s:
        if token and repo.find_token(s, token) is not None:
            return token
        token = repo.mint_token(s, "admin", name="bootstrap admin", token=token or None)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token


def build_backends(settings: Settings) -> dict[str, Backend]:
    """`local` always; `slurm` where Slurm's commands are installed; `sagemaker` where AWS is configured."""
    from orchestrator.backends.sagemaker import SageMakerBackend
    from orchestrator.backends.slurm import SlurmBackend

    backends: dict[str, Backend] = {"local": LocalBackend(settings.jobs_dir)}
    if SlurmBackend.available():
        backends["slurm"] = SlurmBackend.from_env(settings.jobs_dir)
    if SageMakerBackend.available():
        backends["sagemaker"] = SageMakerBackend.from_env()
    return backends


def service_token(db: Database) -> str:
    """A fresh token for the in-process handlers; the previous process's ones are revoked."""
    with db.session() as s:
        for row in s.scalars(select(Token).where(Token.kind == "service", Token.name == IN_PROCESS,
                                                 Token.revoked_at.is_(None))):
            row.revoked_at = now()
        return repo.mint_token(s, "service", name=IN_PROCESS)


def fail_job_of_dead_event(db: Database):
    """A restart decision that can't be delivered must not leave its job waiting forever."""

    def on_dead(event: Event) -> None:
        if event.detail_type != repo.ATTEMPT_STATE_CHANGE or event.detail.get("state") != "Failed":
            return
        with db.session() as s:
            job = s.get(Job, event.job_id)
            if job is not None and job.state not in repo.JOB_TERMINAL:
                repo.set_job_state(s, job, "Failed", {"kind": "chain.dead_letter",
                                                      "message": f"restart handler failed: {event.last_error}"})

    return on_dead


def build_app(settings: Settings, with_controller: bool = True, chaining: bool = True) -> FastAPI:
    db = Database(settings.db_url)
    ensure_admin_token(db, settings.admin_token_path)
    backends = build_backends(settings)
    controller = None
    if with_controller:
        dispatcher = None
        if chaining:
            dispatcher = Dispatcher(db, default_subscriptions(), api_url=settings.api_url, token=service_token(db),
                                    on_dead_letter=fail_job_of_dead_event(db))
        lock = leader_lock_for(db.engine, settings.home_dir / "leader.lock")
        controller = Controller(db, settings, backends, chaining=chaining, dispatcher=dispatcher, leader_lock=lock)
    return create_app(db, backends, controller)
