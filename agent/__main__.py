"""`python -m agent`: the per-node agent, configured entirely by the contract environment."""

from __future__ import annotations

import logging
import sys

from agent.config import AgentConfig
from agent.supervisor import Supervisor


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="[agent %(asctime)s] %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat is noise
    cfg = AgentConfig.from_env()
    return Supervisor(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
