"""`python -m agent`: the per-node agent, configured entirely by the contract environment."""

from __future__ import annotations

import logging
import sys

from aerie_contracts.container import RESOURCE_CONFIG, write_json
from agent.config import AgentConfig
from agent.identity import spare_hosts
from agent.supervisor import Supervisor


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="[agent %(asctime)s] %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat is noise
    cfg = AgentConfig.from_env()
    if cfg.identity is not None and spare_hosts():
        # The job's hot spares are set apart (agent.identity.without_spares): the ranks' own
        # resourceconfig.json lists this node's attempt hosts, as their SM_HOSTS do.
        write_json(cfg.ml_root / RESOURCE_CONFIG, cfg.identity.resource_config())
    return Supervisor(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
