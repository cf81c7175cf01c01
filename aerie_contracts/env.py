"""The `AERIE_*` environment: every name, what it means, who sets it and who reads it.

Each variable is an `EnvVar`, a `str` whose value is the variable's name, so it is used exactly
where the name was (`os.environ.get(env.API)`), and carries its documentation with it. `ALL`
lists them; `docs/architecture.md`'s table is generated from it (`python -m aerie_contracts.env`).

The names are defined in `aerie_contracts/env_names.py`, by group; this module re-exports every
one of them, so callers only ever write `env.API`.

Who: `backend` = every backend's node launch (`orchestrator/backends/nodeenv.py`); `agent` = the
per-node agent, which also passes everything on to its ranks; `trainer` = Aerie's trainer;
`control plane` = `aerie up` (`orchestrator.settings.Settings`, prefix AERIE_); `cli`; `lambdas`
= event handlers (in-process or AWS Lambda); `operator` = whoever deploys (CDK app, container).
"""

from __future__ import annotations

# A star import on purpose: every name defined there is `env.<NAME>`, with no second listing here.
from aerie_contracts.env_names import *  # noqa: F403
from aerie_contracts.env_var import ALL as ALL
from aerie_contracts.env_var import EnvVar as EnvVar

BY_NAME: dict[str, EnvVar] = {v.name: v for v in ALL}


def markdown_table() -> str:
    rows = ["| variable | meaning | set by | read by |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.meaning} | {v.set_by} | {v.read_by} |" for v in ALL]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
