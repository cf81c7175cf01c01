"""The slurm backend's hot spares (issue #23) without a cluster: the allocation asks for them, the
nodes split the job's hosts alike, the handle learns them once the job runs, and an in-place
attempt gives a blamed node's slot to a spare without replenishing. The whole job on the real
one-host cluster: tests/integration/test_slurm_spares.py."""

from __future__ import annotations

from pathlib import Path

from agent.contract import write_json
from agent.slurm import split_hosts
from orchestrator.backends.base import LaunchRequest
from orchestrator.backends.slurm import SlurmBackend, SlurmOptions, _learned, launch_document, render_script
from orchestrator.spec import JobSpec


def _request(number: int = 1, retry: dict | None = None, **more) -> LaunchRequest:
    spec = JobSpec.model_validate(
        {
            "name": "spare",
            "entrypoint": ["python", "train.py"],
            "resources": {"instance_count": 2, "spare_nodes": 1},
            "backend": "slurm",
            "retry": retry or {"max_restarts": 2},
        }
    )
    return LaunchRequest(
        job_id="spare-abc",
        job_name="spare",
        attempt_id=f"spare-abc-a{number}",
        attempt_number=number,
        spec=spec,
        api_url="http://127.0.0.1:8470",
        agent_token="tok",
        **more,
    )


def test_the_allocation_holds_the_spares_and_a_spare_s_exit_ends_no_one():
    request = _request()
    script = render_script(request, SlurmOptions.resolve(request.spec, SlurmOptions()))
    assert "#SBATCH --nodes=3\n" in script and "--kill-on-bad-exit=0" in script
    assert launch_document(request, Path("/r"), Path("/w"), SlurmOptions())["nodes"] == 2
    # Without in-place restarts no spare could ever take a slot: none is asked for.
    plain = _request(retry={"max_restarts": 0})
    script = render_script(plain, SlurmOptions.resolve(plain.spec, SlurmOptions()))
    assert "#SBATCH --nodes=2\n" in script and "--kill-on-bad-exit=1" in script


def test_every_node_splits_the_sorted_hosts_alike():
    assert split_hosts(("node1", "node2", "node3"), 2) == (["node1", "node2"], ["node3"])
    assert split_hosts(("node1", "node2"), None) == (["node1", "node2"], [])


def test_the_handle_learns_hosts_and_spares_then_a_spare_takes_a_blamed_slot(tmp_path):
    root = tmp_path / "jobs" / "spare-abc" / "attempt-1"
    root.mkdir(parents=True)
    write_json(root / "launch.json", {"root": str(root), "master_port": None, "nodes": 2})
    launched = {"root": str(root), "hosts": [], "slurm_job_id": 77, "job_name": "spare-abc-a1", "spare_nodes": 1}
    assert _learned(launched, root) is None  # no node has started yet
    write_json(root / "hosts.json", {"hosts": ["node1", "node2"], "spares": ["node3"], "slurm_job_id": 77})
    first = _learned(launched, root)
    assert first is not None and first["hosts"] == ["node1", "node2"] and first["spares"] == ["node3"]
    assert _learned(first, root) is None  # learned once

    second = SlurmBackend(tmp_path / "jobs").launch(_request(2, in_place_of=first, replace_nodes={"node1": "node3"}))
    assert second["slurm_job_id"] == 77 and second["hosts"] == ["node3", "node2"]  # node1's rank slot
    assert second["spares"] == [] and second["replaced_nodes"] == {"node1": "node3"}  # not replenished
    assert not (tmp_path / "jobs" / "spare-abc" / "attempt-2").exists()
