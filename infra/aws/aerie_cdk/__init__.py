"""Aerie's AWS deployment as a CDK app: one stack, built from a few small constructs.

`app.py` beside this package is what `cdk synth`/`cdk deploy` run; `tests/infra/test_cdk.py`
builds the same app in-process and checks the template.
"""

from .settings import Settings
from .stack import AerieStack

__all__ = ["AerieStack", "Settings"]
