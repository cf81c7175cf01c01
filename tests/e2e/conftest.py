"""Fixtures of the whole-job tests."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers.sagemaker_standin import SageMakerStandIn, image_env


@pytest.fixture
def sagemaker(tmp_path, s3_env):
    """The SageMaker stand-in (tests/helpers/sagemaker_standin.py), its containers' "instance role"
    the loopback S3 server's."""
    if os.geteuid() != 0 or not shutil.which("unshare"):  # never a skip: it would read as a pass
        pytest.fail("the SageMaker stand-in's containers need root and unshare(1) (mount namespaces); CI runs as root")
    standin = SageMakerStandIn(tmp_path / "sagemaker", image_env(s3_env)).start()
    yield standin
    standin.close()
