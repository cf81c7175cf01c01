"""The contracts module: complete tables, enums that behave as their strings, one health class."""

from __future__ import annotations

import dataclasses
import json

from aerie_contracts import env, failures
from aerie_contracts.failures import POLICIES, Blame, FailureKind, policy
from aerie_contracts.health import HealthSettings
from aerie_contracts.states import JobState
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


def test_no_contract_string_is_written_outside_the_contracts_module():
    """Every event detail-type, failure kind and `AERIE_*` name in the code comes from
    `aerie_contracts` (string literals in docstrings and messages aside). States are not checked:
    Aerie's job states are SageMaker's own TrainingJobStatus words, which its API speaks too."""
    import ast
    from pathlib import Path

    from aerie_contracts import DetailType, FailureKind, env

    repo = Path(__file__).resolve().parents[2]
    contract = {str(v): "AERIE_* name" for v in env.ALL}
    contract |= {k.value: "failure kind" for k in FailureKind} | {d.value: "detail-type" for d in DetailType}
    found = []
    for package in ("agent", "aerie_report", "aerie_s3", "bench", "infra", "lambdas", "orchestrator", "trainer"):
        for path in sorted((repo / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text())
            prose = set()
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                    prose.add(id(body[0].value))  # a docstring
                if isinstance(node, ast.JoinedStr):
                    prose.update(id(v) for v in ast.walk(node))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in contract and id(node) not in prose:
                    found.append(f"{path.relative_to(repo)}:{node.lineno}: {contract[node.value]} {node.value!r}")
    assert not found, "\n".join(found)
