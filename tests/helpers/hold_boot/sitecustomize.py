"""Test-only: a node whose boot never finishes, so its agent never starts and never reports.

Put this directory on a job's `PYTHONPATH` (the spec's `env`) and name a node directory suffix
in `TEST_HOLD_NODE` (e.g. `attempt-1/algo-2`): Python imports this file at start-up in every
process a node starts, and the processes of that node (`AERIE_ML_ROOT` ends with the suffix)
stop here for good, before `agent.entrypoint` runs a line, as on a machine stuck at boot (a hung
mount, an image that never finishes pulling). Other nodes and later attempts are untouched.
Nothing in the product reads `TEST_HOLD_NODE`; this file lives only under tests/.
"""

import os
import time

_suffix = os.environ.get("TEST_HOLD_NODE", "").strip("/")
if _suffix and os.environ.get("AERIE_ML_ROOT", "").rstrip("/").endswith("/" + _suffix):
    while True:
        time.sleep(3600)
