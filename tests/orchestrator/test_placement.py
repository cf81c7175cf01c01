"""The local backend's node pool: an attempt takes the first node slots chaining did not exclude."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.placement import PlacementError, node_slots, place
from orchestrator.spec import JobSpec


def test_the_first_slots_not_excluded_are_taken_in_order():
    assert place(2, 3) == ["algo-1", "algo-2"]
    assert place(2, 3, ["algo-2"]) == ["algo-1", "algo-3"]  # the spare takes the blamed node's place
    assert place(2, 3, ["algo-1"]) == ["algo-2", "algo-3"]
    assert place(1, 2, ["node7"]) == ["algo-1"]  # a name outside the pool changes nothing


def test_a_job_that_cannot_be_placed_fails_with_its_reason_instead_of_shrinking():
    with pytest.raises(PlacementError) as err:
        place(2, 3, ["algo-1", "algo-3"])
    assert err.value.failure_kind == "placement.failed"
    assert "cannot place 2 node(s)" in str(err.value) and "algo-1, algo-3" in str(err.value)
    assert "backend_options.node_slots" in str(err.value)


def test_node_slots_default_to_one_spare_and_are_checked_at_submit():
    assert node_slots({}, 2) == 3
    assert node_slots({"node_slots": 2}, 2) == 2  # no spare: asked for
    spec = {"name": "j", "entrypoint": ["python"], "resources": {"instance_count": 2}}
    assert JobSpec.from_dict({**spec, "backend_options": {"node_slots": 4}}).backend_options["node_slots"] == 4
    for bad, words in ((1, "between resources.instance_count (2)"), ("3", "must be an integer"), (True, "integer")):
        with pytest.raises(ValidationError, match=r"node_slots") as err:
            JobSpec.from_dict({**spec, "backend_options": {"node_slots": bad}})
        assert words in str(err.value)
    # The pool is the local backend's: other backends have their own machines.
    JobSpec.from_dict({**spec, "backend": "slurm", "backend_options": {"node_slots": 1}})


def test_an_attempt_left_without_enough_slots_fails_as_placement_failed_and_spawns_nothing(tmp_path, aerie_home):
    """The real controller and local backend: attempt 2 of a 2-node job with 2 slots, one excluded."""
    from orchestrator.backends.local import LocalBackend
    from orchestrator.controller import Controller
    from orchestrator.settings import Settings
    from orchestrator.store import Database, repo

    db = Database(f"sqlite:///{tmp_path / 'aerie.db'}")
    pool = {"resources": {"instance_count": 2}, "backend_options": {"node_slots": 2}}
    spec = JobSpec.from_dict({"name": "j", "entrypoint": ["python"], **pool})
    with db.session() as s:
        job = repo.create_job(s, spec.model_dump(mode="json"), "default")
        repo.set_job_state(s, job, "InProgress")
        repo.set_attempt_state(s, repo.create_attempt(s, job, 1), "Failed", {"kind": "silent.hang"})
        repo.create_attempt(s, job, 2, exclude_nodes=["algo-2"])
        job_id = job.id
    Controller(db, Settings(), {"local": LocalBackend(tmp_path / "jobs")}, chaining=True).reconcile_once()
    with db.session() as s:
        second = repo.get_job(s, "default", job_id).attempts[1]
        assert second.state == "Failed" and second.reason["kind"] == "placement.failed", second.reason
        assert "2 node slot(s) and 1 are excluded after blame (algo-2)" in second.reason["message"]
    assert not (tmp_path / "jobs" / job_id / "attempt-2").exists()  # nothing was started
    db.dispose()


def test_hot_spares_take_the_next_free_slots_and_swap_into_a_failed_node_s_slot():
    from orchestrator.placement import spares, swap

    assert node_slots({}, 2, 1) == 4  # the job, its spare, and one slot to spare
    assert spares(1, 4, ["algo-1", "algo-2"]) == ["algo-3"]
    assert spares(2, 5, ["algo-1", "algo-3"], ["algo-2"]) == ["algo-4", "algo-5"]
    assert spares(3, 4, ["algo-1", "algo-2"]) == ["algo-3", "algo-4"]  # fewer: the pool ran out
    assert swap(["algo-1", "algo-2"], {"algo-2": "algo-3"}) == ["algo-1", "algo-3"]  # the slot order stays
    with pytest.raises(ValueError, match="spare_nodes"):
        node_slots({"node_slots": 2}, 2, 1)
