"""Aerie's AWS deployment as a CDK app: one stack, built from a few small constructs.

`app.py` beside this package is what `cdk synth`/`cdk deploy` run; `tests/infra/test_cdk.py`
builds the same app in-process and checks the template.
"""

from .stack import AerieStack
from .settings import Settings

__all__ = ["AerieStack", "Settings"]
