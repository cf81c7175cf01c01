"""The in-place handle every backend derives from the failed attempt's (orchestrator/backends/in_place.py)."""

from __future__ import annotations

from aerie_contracts import memckpt
from orchestrator.backends import in_place
from orchestrator.backends.base import LaunchRequest


def _request(replace: dict[str, str] | None = None) -> LaunchRequest:
    return LaunchRequest(
        job_id="j",
        job_name="j",
        attempt_id="j-a2",
        attempt_number=2,
        spec=None,  # type: ignore[arg-type]  # the handle does not read it
        api_url="http://127.0.0.1:1",
        agent_token="t",
        in_place_of={},
        replace_nodes=replace or {},
    )


def test_the_handle_is_the_old_ones_with_a_port_a_key_and_a_count_of_its_own():
    previous = {"hosts": ["algo-1", "algo-2"], "attempt_id": "j-a1", memckpt.HANDLE_KEY: "old", "root": "/r"}
    handle = in_place.next_handle(previous, _request(), master_port=29501)
    assert handle["attempt_id"] == "j-a2" and handle["in_place"] and handle["root"] == "/r"
    assert handle["master_port"] == 29501 and handle["in_place_restarts"] == 1
    assert handle[memckpt.HANDLE_KEY] != "old" and previous[memckpt.HANDLE_KEY] == "old"
    assert in_place.restarts_of(handle) == 2


def test_a_spare_takes_the_replaced_nodes_slot_and_is_a_spare_no_more():
    previous = {"hosts": ["algo-1", "algo-2"], "spares": ["algo-3", "algo-4"]}
    request = _request({"algo-1": "algo-3"})
    handle = in_place.next_handle(previous, request, master_port=1)
    assert handle["hosts"] == ["algo-3", "algo-2"] and handle["spares"] == ["algo-4"]
    assert handle["replaced_nodes"] == {"algo-1": "algo-3"}
    assert in_place.spares_taken(previous, request) == ["algo-3"]


def test_the_port_rule_moves_by_strides_and_wraps_within_the_range():
    assert in_place.rendezvous_port(29500, 1) == 29501
    assert in_place.rendezvous_port(65535, 1) == 1024
    assert in_place.rendezvous_port(20010, 3, low=20000, span=100, stride=37) == 20000 + (10 + 111) % 100
