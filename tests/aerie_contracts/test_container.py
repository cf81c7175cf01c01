"""The SageMaker training-container contract: the `/opt/ml` layout a backend writes for a node."""

from __future__ import annotations

import json

from aerie_contracts.container import NodeContract


def test_the_local_contract_writes_sagemakers_full_layout(tmp_path):
    NodeContract(tmp_path / "algo-2", ("algo-2", "algo-1"), "algo-2", network_interface="lo").write()
    rc = json.loads((tmp_path / "algo-2" / "input" / "config" / "resourceconfig.json").read_text())
    assert rc == {
        "current_host": "algo-2",
        "current_instance_type": "local",
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [
            {"instance_group_name": "homogeneousCluster", "instance_type": "local", "hosts": ["algo-1", "algo-2"]}
        ],
        "network_interface_name": "lo",
    }
