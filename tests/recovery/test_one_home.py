"""Issue #32 acceptance 2: every place that decides the next attempt's mode, exclusion or budget is
in one package, `recovery/`.

An AST scan of the product packages finds the two things such a decision cannot do without:
reading a retry setting that governs it (`retry.max_restarts`, `in_place_restarts`,
`exclude_after_blames`, `exclude_bad_nodes`, `non_retryable_exit_codes`, as a dict key or an
attribute), and writing a restart mode into an attempt's cause (a dict display keyed by
`CAUSE_MODE` or `CAUSE_REPLACED_NODES`). Each is allowed in `recovery/` only, less the places
listed below that declare or translate a setting without deciding anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("aerie_contracts", "aerie_report", "aerie_s3", "agent", "lambdas", "orchestrator", "recovery", "trainer")
# The test scaffolding that builds specs (the harness) is not product: it lives in devtools/.
SETTINGS = frozenset(
    {"max_restarts", "in_place_restarts", "exclude_after_blames", "exclude_bad_nodes", "non_retryable_exit_codes"}
)
CAUSE_KEYS = frozenset({"CAUSE_MODE", "CAUSE_REPLACED_NODES"})
# (path, setting): read there without deciding anything.
NOT_DECISIONS = {
    # The spec declares the settings (pydantic fields: attributes, not reads).
    ("orchestrator/sagemaker_mapping.py", "max_restarts"): "translates retry.max_restarts <-> RetryStrategy",
    # The handle's own count of in-place attempts, for the next rendezvous port (not the setting).
    ("orchestrator/backends/in_place.py", "in_place_restarts"): "the handle's in-place count, for the port",
}


def _files():
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if "migrations" in path.parts or rel == "orchestrator/spec.py":
                continue
            yield rel, ast.parse(path.read_text())


def decision_sites() -> list[tuple[str, int, str]]:
    """(path, line, what) for every setting read and every cause written to, anywhere in the product."""
    found = []
    for rel, tree in _files():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in SETTINGS:
                found.append((rel, node.lineno, node.attr))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and first.value in SETTINGS:
                    found.append((rel, node.lineno, first.value))
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                if node.slice.value in SETTINGS:
                    found.append((rel, node.lineno, node.slice.value))
            elif isinstance(node, ast.Dict):
                for key in node.keys:
                    name = key.id if isinstance(key, ast.Name) else getattr(key, "attr", None)
                    if name in CAUSE_KEYS:
                        found.append((rel, node.lineno, name))
    return found


def test_the_next_attempts_mode_exclusion_and_budget_are_decided_in_one_package():
    sites = decision_sites()
    assert sites, "the scan found nothing: it no longer sees the recovery package's own reads"
    outside = [
        f"{path}:{line}: {what}"
        for path, line, what in sites
        if not path.startswith("recovery/") and (path, what) not in NOT_DECISIONS
    ]
    assert not outside, "decided outside recovery/:\n" + "\n".join(outside)
    packages = {path.split("/")[0] for path, _, what in sites if (path, what) not in NOT_DECISIONS}
    assert packages == {"recovery"}, packages


def test_the_scan_sees_a_decision_made_elsewhere(tmp_path, monkeypatch):
    """The scan is not vacuous: a handler that counts restarts itself is found."""
    (tmp_path / "lambdas").mkdir()
    (tmp_path / "lambdas" / "rogue.py").write_text(
        "def again(spec, n):\n    return n <= spec['retry'].get('max_restarts', 0)\n"
        "def cause(mode):\n    return {CAUSE_MODE: mode}\n"
    )
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    found = {(p, w) for p, _, w in decision_sites()}
    assert found == {("lambdas/rogue.py", "max_restarts"), ("lambdas/rogue.py", "CAUSE_MODE")}
