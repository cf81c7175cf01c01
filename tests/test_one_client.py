"""Issue #32 acceptance 3: one client speaks to the API. No caller writes a `"/v1/` path of its
own (they ask `aerie_contracts.routes`), and there is one `ApiError` in the code base."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The callers: everything but the client itself and the API's own routers (orchestrator/api).
CALLERS = ("agent", "lambdas", "trainer", "recovery", "orchestrator/cli", "aerie_contracts", "aerie_report", "aerie_s3")


def _py(*roots: str):
    for root in roots:
        yield from sorted((REPO / root).rglob("*.py"))


def test_no_caller_writes_an_api_path_of_its_own():
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in _py(*CALLERS)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if '"/v1/' in line
    ]
    assert not found, "build the path with aerie_contracts.routes:\n" + "\n".join(found)


def test_one_api_error_class_in_the_code_base():
    roots = [p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")]
    found = [
        str(path.relative_to(REPO))
        for path in _py(*roots)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "ApiError"
    ]
    assert found == ["aerie_client/http.py"], found
