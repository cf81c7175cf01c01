"""docs/architecture.md's table of the AERIE_* environment is the one aerie_contracts.env generates:
a variable added, renamed or re-described in the contract shows in the docs, or this fails."""

from __future__ import annotations

from pathlib import Path

from aerie_contracts.env import markdown_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_the_documented_environment_is_the_contract():
    assert markdown_table().strip() in DOCS.read_text(), "regenerate it: python -m aerie_contracts.env"
