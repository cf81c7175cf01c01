"""Stage the handlers' Lambda code at synth time, in Python, without Docker.

The asset is a directory holding:
- `lambdas/` from the repo (the handlers) and `aerie_contracts/` (the contracts they speak),
- `aerie_checkpoint/`, the torch-free checkpoint kernel the handlers import (`manifest` for the
  resume point, `gc` for retention; `storage` uses `aerie_s3`'s boto3 client); nothing of
  `trainer/` ships (it needs torch),
- `aerie_s3/`, the torch-free S3 package `storage` builds on (pure Python; the CRT client it can
  use is imported only for data transfers, which the handlers never make),
- the pure-Python third-party distributions the handlers use (`slack_sdk`, `httpx` and their
  requirements), copied file by file from the environment that runs the synth.

Copying installed distributions keeps synth offline and reproducible for one environment; it is
safe only for pure-Python code, so any compiled file stops the synth with a clear error. boto3 and
its family come with the Lambda runtime and are left out.
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[3]

# What the handlers import besides the standard library and boto3.
HANDLER_DISTRIBUTIONS = ("slack_sdk", "httpx", "croniter")

# Provided by the AWS Lambda Python runtime.
RUNTIME_PROVIDED = frozenset(
    canonicalize_name(n) for n in ("boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "urllib3", "six")
)

# Copied whole: the handlers, the recovery package they decide with, the standard-library
# contracts module they import, the API client they speak through (httpx, bundled below) and
# the torch-free checkpoint kernel (manifest, retention).
HANDLER_PACKAGES = ("lambdas", "recovery", "aerie_contracts", "aerie_client", "aerie_checkpoint")

# Whole first-party packages the packages above import (pure Python, torch-free).
SHARED_PACKAGES = ("aerie_s3",)

COMPILED_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")


def lambda_environment(python_version: str) -> dict[str, str]:
    """Marker environment of the Lambda runtime, to pick the requirements it needs."""
    env = dict(default_environment())
    env.update(
        python_version=python_version,
        python_full_version=f"{python_version}.0",
        sys_platform="linux",
        platform_system="Linux",
        os_name="posix",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def requirement_closure(roots: tuple[str, ...], python_version: str) -> list[str]:
    """Installed distributions `roots` need on the Lambda runtime, runtime-provided ones excluded."""
    env = lambda_environment(python_version)
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen or name in RUNTIME_PROVIDED:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist.metadata["Name"]
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=str.lower)


def _copy_distribution(name: str, dest: Path) -> None:
    dist = metadata.distribution(name)
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if not parts or parts[0] == ".." or parts[0].endswith((".dist-info", ".egg-info")) or "__pycache__" in parts:
            continue
        source = Path(dist.locate_file(file))
        if not source.is_file():
            continue
        if source.suffix in COMPILED_SUFFIXES or ".cpython-" in source.name:
            raise RuntimeError(
                f"{name} ships compiled code ({file}); it cannot be copied into a Lambda bundle "
                "built on this machine. Use a Lambda layer built for the target platform instead."
            )
        target = dest / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def stage_handler_bundle(dest: Path, python_version: str = "3.12", repo_root: Path = REPO_ROOT) -> Path:
    """Write the Lambda asset directory at `dest` (replaced if present) and return it."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for package in HANDLER_PACKAGES:
        shutil.copytree(
            repo_root / package,
            dest / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "tests", "fixtures"),
        )
    for package in SHARED_PACKAGES:
        shutil.copytree(repo_root / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in requirement_closure(HANDLER_DISTRIBUTIONS, python_version):
        _copy_distribution(name, dest)
    return dest
