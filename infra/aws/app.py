#!/usr/bin/env python3
"""CDK entry point: `npx aws-cdk@2 synth|deploy` runs `python3 app.py` here (see cdk.json).

`build_app()` is also what `tests/infra/test_cdk.py` calls, with cdk.json's context plus the
`-c` values of the documented deploy command, so the test checks the template people deploy.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import aws_cdk as cdk

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from aerie_cdk import AerieStack, Settings  # noqa: E402


def cdk_json_context() -> dict:
    """The `context` block of cdk.json (feature flags and Aerie defaults)."""
    return json.loads((HERE / "cdk.json").read_text())["context"]


def build_app(context: dict | None = None, outdir: str | None = None) -> tuple[cdk.App, AerieStack]:
    """Build the app. With `context=None` (the CLI's case) CDK reads it from CDK_CONTEXT_JSON."""
    app = cdk.App(context=context, outdir=outdir)
    settings = Settings.from_context(app.node)
    env = None
    if os.environ.get("CDK_DEFAULT_ACCOUNT") and os.environ.get("CDK_DEFAULT_REGION"):
        env = cdk.Environment(account=os.environ["CDK_DEFAULT_ACCOUNT"], region=os.environ["CDK_DEFAULT_REGION"])
    stack = AerieStack(
        app,
        settings.stack_name,
        settings=settings,
        bundle_dir=Path(app.outdir) / "aerie-handlers-src",
        env=env,
    )
    cdk.Tags.of(stack).add("project", "aerie")
    cdk.Tags.of(stack).add("aerie:deployment", settings.name)
    return app, stack


if __name__ == "__main__":
    build_app()[0].synth()
