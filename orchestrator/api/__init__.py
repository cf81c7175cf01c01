"""The REST API under /v1 (FastAPI): a router per resource, auth as a dependency."""

from orchestrator.api.app import create_app

__all__ = ["create_app"]
