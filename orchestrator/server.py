"""Assemble a control plane from settings: store, backends, controller and API in one process."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from aerie_contracts import failures
from aerie_contracts.events import DetailType
from aerie_contracts.failures import FailureKind
from aerie_contracts.states import JOB_TERMINAL, AttemptState, JobState
from orchestrator import web
from orchestrator.api import create_app
from orchestrator.backends.base import Backend
from orchestrator.backends.local import LocalBackend
from orchestrator.controller import Controller
from orchestrator.eventbus import EventBridgePublisher
from orchestrator.events import Dispatcher, default_subscriptions
from orchestrator.leader import leader_lock_for
from orchestrator.sagemaker_api.call import EndpointSettings
from orchestrator.sagemaker_api.sigv4 import load_server_key
from orchestrator.settings import Settings
from orchestrator.store import repo
from orchestrator.store.db import Database
from orchestrator.store.models import Event, Job, Token, now

IN_PROCESS = "in-process handlers"
DEPLOYED = "deployed handlers (AERIE_SERVICE_TOKEN)"


def ensure_admin_token(db: Database, path: Path) -> str:
    """The admin token: made at first start, kept in a 0600 file, stored only as a hash."""
    token = path.read_text().strip() if path.exists() else None
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
        for row in s.scalars(
            select(Token).where(Token.kind == "service", Token.name == IN_PROCESS, Token.revoked_at.is_(None))
        ):
            row.revoked_at = now()
        return repo.mint_token(s, "service", name=IN_PROCESS)


def adopt_service_token(db: Database, token: str) -> None:
    """Accept the deployment's service token (`AERIE_SERVICE_TOKEN`, from Secrets Manager): the
    deployed handlers call the API with it. Stored hashed like every token; a token revoked
    through the API stays revoked."""
    with db.session() as s:
        if s.scalars(select(Token).where(Token.token_hash == repo.hash_token(token))).first() is not None:
            return
    try:
        with db.session() as s:
            repo.mint_token(s, "service", name=DEPLOYED, token=token)
    except IntegrityError:
        pass  # another control plane sharing the store stored it first


def fail_job_of_dead_event(db: Database):
    """A restart decision that can't be delivered must not leave its job waiting forever."""

    def on_dead(event: Event) -> None:
        if event.detail_type != DetailType.ATTEMPT_STATE_CHANGE or event.detail.get("state") != AttemptState.FAILED:
            return
        with db.session() as s:
            job = s.get(Job, event.job_id)
            if job is not None and job.state not in JOB_TERMINAL:
                repo.set_job_state(
                    s,
                    job,
                    JobState.FAILED,
                    failures.reason(
                        FailureKind.CHAIN_DEAD_LETTER, f"restart decision not delivered: {event.last_error}"
                    ),
                )

    return on_dead


def build_dispatcher(db: Database, settings: Settings) -> Dispatcher:
    """In-process handlers by default; with `AERIE_EVENT_BUS`, publication to that EventBridge bus
    instead, where the deployed Lambda functions are the handlers (running both would restart
    every failed attempt from two places). Publication gets more tries than an in-process
    handler (10, about four minutes with backoff capped at 60 s): an AWS hiccup must not end a job."""
    if settings.event_bus:
        return Dispatcher(
            db,
            [],
            publisher=EventBridgePublisher(settings.event_bus),
            max_deliveries=10,
            on_dead_letter=fail_job_of_dead_event(db),
        )
    return Dispatcher(
        db,
        default_subscriptions(),
        api_url=settings.api_url,
        token=service_token(db),
        on_dead_letter=fail_job_of_dead_event(db),
    )


def endpoint_settings(settings: Settings) -> EndpointSettings:
    """The SageMaker-compatible endpoint's settings, with its SigV4 key loaded (or made)."""
    key = settings.sigv4_key.get_secret_value() if settings.sigv4_key else None
    return EndpointSettings(
        server_key=load_server_key(key, settings.sigv4_key_path),
        default_backend=settings.default_backend,
        max_instances=settings.sagemaker_max_instances,
    )


def build_app(settings: Settings, with_controller: bool = True, chaining: bool = True) -> FastAPI:
    db = Database(settings.db_url)
    ensure_admin_token(db, settings.admin_token_path)
    if settings.service_token is not None and settings.service_token.get_secret_value():
        adopt_service_token(db, settings.service_token.get_secret_value())
    backends = build_backends(settings)
    controller = None
    if with_controller:
        dispatcher = build_dispatcher(db, settings) if chaining else None
        lock = leader_lock_for(db.engine, settings.home_dir / "leader.lock")
        controller = Controller(db, settings, backends, chaining=chaining, dispatcher=dispatcher, leader_lock=lock)
    app = create_app(db, backends, controller, sagemaker=endpoint_settings(settings))
    web.mount(app)  # the dashboard: /ui (pages for browsers, not in the OpenAPI document), above the API
    if settings.metrics_token is not None and settings.metrics_token.get_secret_value():
        app.state.metrics_token = settings.metrics_token.get_secret_value()
    return app
