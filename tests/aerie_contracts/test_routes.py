"""aerie_contracts.routes: every path a caller builds is one the API serves (checked against the
real app's routers), and the builders quote what they put in a path."""

from __future__ import annotations

import re

from aerie_contracts import routes
from orchestrator.server import build_app
from orchestrator.settings import Settings


def _served(app) -> set[tuple[str, str]]:
    """(method, path) of every route in the app's own OpenAPI document (what its routers serve)."""
    return {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops}


def test_every_route_a_caller_builds_is_served(aerie_home):
    served = _served(build_app(Settings(), with_controller=False))
    missing = [f"{m} {p}" for m, p in routes.ROUTES if (m, p) not in served]
    assert not missing, "callers build routes the API does not serve:\n" + "\n".join(missing)


def test_each_builder_yields_one_of_the_listed_routes():
    """Every public builder, called with sample arguments, matches a template of ROUTES."""
    templates = [re.compile("^" + re.sub(r"\{[a-z_]+\}", "[^/]+", p) + "$") for _, p in routes.ROUTES]
    node = routes.node("a-1", "algo-1")
    built = [
        routes.jobs(),
        routes.job("j"),
        routes.job_stop("j"),
        routes.job_fail("j"),
        routes.job_chaos("j"),
        routes.job_events("j"),
        routes.job_goodput("j"),
        routes.job_logs("j"),
        routes.job_attempts("j"),
        routes.attempt_blames("j", 2),
        routes.job_checkpoints("j"),
        routes.job_checkpoint_states("j"),
        routes.job_eval_samples("j"),
        routes.job_ratings("j"),
        routes.eval_sample_claim("s"),
        routes.eval_sample_posted("s"),
        routes.eval_sample_ratings("s"),
        routes.tokens(),
        routes.token(3),
        routes.attempt("a-1"),
        routes.attempt_checkpoints("a-1"),
        routes.attempt_checkpoints_bad("a-1"),
        *(node + call for call in routes.NODE_CALLS),
    ]
    unmatched = [b for b in built if not any(t.match(b) for t in templates)]
    assert not unmatched, unmatched


def test_the_builders_quote_their_parameters():
    assert routes.job("a b/c") == "/v1/jobs/a%20b%2Fc"
    assert routes.node("att/1", "host?x") == "/v1/attempts/att%2F1/nodes/host%3Fx"
