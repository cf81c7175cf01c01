"""The architecture's import rules: orchestrator, agent, lambdas, aerie_s3 and aerie_checkpoint never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not allowed here")
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def _modules(package: str) -> list[str]:
    return sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / package).rglob("*.py")
        if "migrations" not in p.parts
    )


# Every module of the torch-free packages, found on disk so a new one can't be forgotten, plus
# the trainer modules the handlers and the CLI rely on.
TORCH_FREE = (
    _modules("orchestrator")
    + _modules("agent")
    + _modules("lambdas")
    + _modules("recovery")
    + _modules("aerie_s3")
    + _modules("aerie_client")
    + _modules("aerie_report")
    + _modules("aerie_checkpoint")
    + _modules("devtools")
    + [
        "trainer",
        "trainer.faults",
        "trainer.data.cli",
        "trainer.data.channels",
        "trainer.data.s3_indexed",
        "trainer.data.readahead",
        "trainer.checkpoint.s3io",
    ]
)


def test_torch_free_modules_import_without_torch():
    """One interpreter with torch made unimportable imports every module in turn."""
    code = (
        BLOCK_TORCH
        + f"""
import importlib, traceback
failed = []
for name in {TORCH_FREE!r}:
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\\n".join(failed))
raise SystemExit(1 if failed else 0)
"""
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_contracts_use_the_standard_library_only():
    """`aerie_contracts` ships in the Lambda bundle and the torch-free agent: stdlib imports only."""
    import ast

    outside = []
    for path in [*(REPO / "aerie_contracts").rglob("*.py"), *(REPO / "aerie_report").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("aerie_contracts", "__future__"):
                    outside.append(f"{path.relative_to(REPO)}: {name}")
    assert not outside, outside


# The import rules of docs/architecture.md's package table, between the project's own packages:
# package -> (the project packages/modules it may import). Anything not listed is a violation.
PROJECT_PACKAGES = (
    "aerie_checkpoint",
    "aerie_client",
    "aerie_contracts",
    "aerie_report",
    "aerie_s3",
    "agent",
    "bench",
    "devtools",
    "infra",
    "lambdas",
    "orchestrator",
    "recovery",
    "tests",
    "trainer",
)
ALLOWED = {
    "aerie_contracts": (),
    # The one client of the API (httpx): the contracts' route builders, nothing of the product.
    "aerie_client": ("aerie_contracts",),
    "aerie_report": ("aerie_contracts",),  # the one-line client: standard library + contracts only
    "aerie_s3": ("aerie_contracts",),
    # The torch-free checkpoint kernel (storage, manifest, gc, fence): S3 through aerie_s3, the fence's
    # commit through the API (aerie_client); nothing of the trainer or the agent, who both import it.
    "aerie_checkpoint": ("aerie_client", "aerie_contracts", "aerie_s3"),
    # A third-party trainer's checkpoints are committed by the agent (agent/byo_checkpoints.py).
    "agent": ("aerie_client", "aerie_contracts", "aerie_s3", "aerie_checkpoint.manifest", "aerie_checkpoint.fence"),
    # The decisions after a failure: the contracts' words, and the torch-free checkpoint listing
    # the resume point is chosen from (S3's verified checkpoints: aerie_checkpoint.manifest).
    "recovery": ("aerie_contracts", "aerie_checkpoint.manifest"),
    # Handlers: event -> the recovery package's decision -> one API call; checkpoint GC's retention
    # policy (aerie_checkpoint.gc) and the manifest it keeps.
    "lambdas": ("aerie_client", "aerie_contracts", "recovery", "aerie_checkpoint.manifest", "aerie_checkpoint.gc"),
    # The CLI hands its `data`, `export` and `--fault` commands to the trainer's torch-free entry points.
    # devtools.devstack: `aerie up` only, imported inside the command when it starts the loopback S3
    # (test_the_product_imports_devtools_only_where_aerie_up_starts_the_dev_stack).
    "orchestrator": (
        "aerie_client",
        "aerie_contracts",
        "aerie_s3",
        "devtools.devstack",
        "lambdas",
        "recovery",
        "trainer.data.cli",
        "trainer.export_cli",
        "trainer.faults",
    ),
    # The torch-free checkpoint kernel (manifest, fenced commit) is aerie_checkpoint's; the fence speaks
    # to the API there, so the trainer imports no aerie_client of its own.
    "trainer": ("aerie_checkpoint", "aerie_contracts", "aerie_s3"),
    "infra": ("aerie_contracts", "lambdas", "recovery", "infra"),
    # The scaffolding (harness, dev stack, throttling proxy, goodput simulator) drives the product
    # from outside only: its CLI and API, as a user would (a node loss is `aerie chaos`).
    "devtools": ("aerie_contracts",),
    # Benches measure the product and drive it through the harness; never through the test tree.
    "bench": tuple(p for p in PROJECT_PACKAGES if p != "tests"),
}


def _project_imports(package: str) -> list[tuple[str, str]]:
    import ast

    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        if "migrations" in path.parts or ".venv" in path.parts:
            continue
        for _, names in _imports(ast.parse(path.read_text())):
            found += [(str(path.relative_to(REPO)), n) for n in names if n.split(".")[0] in PROJECT_PACKAGES]
    return found


def _imports(tree):
    """(node, the absolute module names it imports) for every import statement of `tree`."""
    import ast

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, [node.module]


def test_every_package_imports_only_what_the_architecture_allows():
    """AST scan of every module: a project import outside its package's allowed list fails."""
    broken = []
    for package, allowed in ALLOWED.items():
        for path, name in _project_imports(package):
            if name.split(".")[0] == package:
                continue
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                broken.append(f"{path}: imports {name} (allowed: {', '.join(allowed) or 'standard library only'})")
    assert not broken, "\n".join(broken)


def test_the_product_imports_devtools_only_where_aerie_up_starts_the_dev_stack():
    """The scaffolding is out of the product (issue #32): no product module imports `devtools` at
    module level, and the one import inside a function is `aerie up`'s, for the loopback S3."""
    import ast

    product = (
        "aerie_checkpoint",
        "aerie_client",
        "aerie_contracts",
        "aerie_report",
        "aerie_s3",
        "agent",
        "lambdas",
        "orchestrator",
        "recovery",
        "trainer",
    )
    found = []
    for package in product:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            top_level = {id(n) for n in tree.body}
            for node, names in _imports(tree):
                if any(n.split(".")[0] == "devtools" for n in names):
                    where = "module level" if id(node) in top_level else "lazy"
                    found.append((str(path.relative_to(REPO)), where))
    assert found == [("orchestrator/cli/stack.py", "lazy")], found
