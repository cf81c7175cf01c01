"""The contracts module: complete tables, enums that behave as their strings, one health class."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

from aerie_contracts import env, failures
from aerie_contracts.failures import POLICIES, Blame, FailureKind, policy
from aerie_contracts.health import HealthSettings
from aerie_contracts.states import AttemptState, JobState, NodeState
from orchestrator.spec import HealthConfig, JobSpec


def test_every_failure_kind_has_a_policy():
    assert set(POLICIES) == set(FailureKind)
    assert policy("no.such.kind") is None
    assert policy("silent.hang").retry and policy("silent.hang").blame is Blame.NODE
    assert policy("loss.nan").blame is Blame.NONE  # a NaN blames no node until replay says so
    assert all(not p.retry for p in POLICIES.values() if p.user_error)


def test_enums_are_their_strings_on_every_boundary():
    assert JobState.COMPLETED == "Completed"
    assert f"{JobState.COMPLETED}" == str(JobState.COMPLETED) == "Completed"
    assert json.dumps({"state": JobState.FAILED}) == '{"state": "Failed"}'
    assert failures.stopped_on_request(host="algo-1") == {
        "kind": "user.stop",
        "message": "stopped on request",
        "host": "algo-1",
    }


def test_environment_names_are_unique_documented_and_usable_as_strings():
    names = [v.name for v in env.ALL]
    assert len(names) == len(set(names))
    assert all(n.startswith("AERIE_") for n in names)
    assert all(v.meaning and v.set_by and v.read_by for v in env.ALL)
    assert {env.API: 1}["AERIE_API"] == 1
    assert env.API.get(environ={"AERIE_API": "http://x"}) == "http://x"


def test_the_spec_validates_the_agents_health_class():
    """One definition: the spec's model is generated from `HealthSettings`, bounds included."""
    spec_fields = set(HealthConfig.model_fields)
    assert spec_fields == {f.name for f in dataclasses.fields(HealthSettings)}
    assert HealthConfig().model_dump() == HealthSettings().to_dict()
    bad = {"name": "x", "entrypoint": ["python"], "health": {"hang_floor_s": 0}}
    try:
        JobSpec.from_dict(bad)
    except Exception as exc:  # pydantic's ValidationError names the field and the bound
        assert "hang_floor_s" in str(exc) and "greater than 0" in str(exc)
    else:
        raise AssertionError("hang_floor_s=0 was accepted")
    sent = JobSpec.from_dict({"name": "x", "entrypoint": ["python"], "health": {"hang_floor_s": 7}}).health
    assert HealthSettings.from_dict(json.loads(sent.model_dump_json())).hang_floor_s == 7.0


# The packages whose code must take contract strings from `aerie_contracts` (Alembic's migration
# scripts are frozen history: they keep the strings of their day).
CODE_PACKAGES = (
    "agent",
    "aerie_report",
    "aerie_s3",
    "bench",
    "devtools",
    "infra",
    "lambdas",
    "orchestrator",
    "trainer",
)


def _code_trees() -> list[tuple[str, ast.Module]]:
    repo = Path(__file__).resolve().parents[2]
    return [
        (str(path.relative_to(repo)), ast.parse(path.read_text()))
        for package in CODE_PACKAGES
        for path in sorted((repo / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]


def test_no_contract_string_is_written_outside_the_contracts_module():
    """Every event detail-type, failure kind and `AERIE_*` name in the code comes from
    `aerie_contracts` (string literals in docstrings and messages aside). States are checked where
    they are used as states (the next test): Aerie's job states are SageMaker's own
    TrainingJobStatus words, which its API also speaks as SageMaker's."""
    from aerie_contracts import DetailType, FailureKind, env

    contract = {str(v): "AERIE_* name" for v in env.ALL}
    contract |= {k.value: "failure kind" for k in FailureKind} | {d.value: "detail-type" for d in DetailType}
    found = []
    for path, tree in _code_trees():
        prose = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                prose.add(id(body[0].value))  # a docstring
            if isinstance(node, ast.JoinedStr):
                prose.update(id(v) for v in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in contract and id(node) not in prose:
                found.append(f"{path}:{node.lineno}: {contract[node.value]} {node.value!r}")
    assert not found, "\n".join(found)


STATE_NAMES = {s.value for s in (*JobState, *AttemptState, *NodeState)}


def _names_a_state(node: ast.expr) -> bool:
    """`x.state`, `x["state"]`, `x.get("state")`, `state` or `*_state`: an expression holding a state."""
    if isinstance(node, ast.Attribute):
        return node.attr == "state" or node.attr.endswith("_state")
    if isinstance(node, ast.Name):
        return node.id == "state" or node.id.endswith("_state")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "state"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "state"
    return False


def _state_literals(node: ast.expr | None) -> list[ast.Constant]:
    """The state names written out in a value: itself, the items of a tuple, list or set, either
    branch of a conditional expression."""
    if isinstance(node, ast.Constant) and node.value in STATE_NAMES:
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for e in node.elts for c in _state_literals(e)]
    if isinstance(node, ast.IfExp):
        return _state_literals(node.body) + _state_literals(node.orelse)
    return []


def _states_written_as_strings(tree: ast.Module) -> list[ast.Constant]:
    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):  # x.state == "Failed", job["state"] in ("Completed", ...)
            sides = [node.left, *node.comparators]
            if any(_names_a_state(s) for s in sides):
                found += [c for s in sides for c in _state_literals(s)]
        elif isinstance(node, ast.keyword) and node.arg and (node.arg == "state" or node.arg.endswith("_state")):
            found += _state_literals(node.value)  # Job(state="Submitted")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):  # row.state = "Running"
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_names_a_state(t) for t in targets):
                found += _state_literals(node.value)
        elif isinstance(node, ast.Dict):  # {"state": "Running"}
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "state":
                    found += _state_literals(value)
        elif isinstance(node, ast.Call):  # set_attempt_state(s, a, "Running"), wait_state(name, {...})
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name.endswith(("_state", "_states")):
                found += [c for a in node.args for c in _state_literals(a)]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            found += _state_literals(node.slice)  # a second definition of the states, as a type
    return found


def test_no_job_attempt_or_node_state_is_written_as_a_string_outside_the_contracts_module():
    """Job, attempt and node states are compared, assigned, sent and typed as `aerie_contracts.states`
    members, never as their spelled-out names. Checked where a string is used as a state (compared
    with, assigned to or passed as a `state`, the value of a "state" key, an argument of a
    `*_state` function, a `Literal` type): the same words elsewhere are SageMaker's statuses."""
    found = [
        f"{path}:{c.lineno}: state {c.value!r}"
        for path, tree in _code_trees()
        for c in _states_written_as_strings(tree)
    ]
    assert not found, "\n".join(found)


def test_the_state_literal_check_sees_each_way_of_writing_a_state():
    """The check above is an AST rule: each form it must catch, caught; SageMaker's words, not."""
    caught = [
        'if attempt.state == "Failed": pass',
        'ok = job["state"] in ("Completed", "Stopped")',
        'ok = detail.get("state") != "Failed"',
        'job = Job(state="Submitted")',
        'row.state = "Running"',
        'state = "Completed" if code == 0 else "Failed"',
        'emit({"state": "Submitted"})',
        'repo.set_attempt_state(s, attempt, "Running")',
        'cp.wait_state(name, {"Completed", "Failed"})',
        'State = Literal["Starting", "Running"]',
    ]
    for code in caught:
        assert _states_written_as_strings(ast.parse(code)), code
    sagemaker = [
        'if status == "InProgress": pass',
        'out = {"Status": "Completed"}',
        'steps.append(("Stopped", t, "The training job was stopped"))',
        'ENDED = {"Completed": AttemptState.COMPLETED}',
    ]
    for code in sagemaker:
        assert not _states_written_as_strings(ast.parse(code)), code
