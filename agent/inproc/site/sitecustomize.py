"""Aerie's in-process probe, started by Python itself in every rank (agent/inproc/__init__.py).

`agent.rank` puts this directory first on the rank's `PYTHONPATH`, so Python's `site` imports this
module at start-up instead of the `sitecustomize` the rank would have had. Two duties, both cheap
for any Python process, torch or not (a launcher, a shell helper, a DataLoader worker):

1. Chain: run the `sitecustomize.py` that is next on `sys.path` after this directory (a distro's,
   a venv's, the user's own), as Python would have; its errors are reported the way `site` reports
   them (one line) and never stop the rank. Its public names are copied into this module.
2. Wait: a `sys.meta_path` finder that finds nothing itself; when `torch` is imported (by the
   script: this module never imports it), it lets torch load, then loads the probe
   (`agent/inproc/hooks.py`, by its path, under the private package name `_aerie_inproc`, so a
   user's own `agent` package can neither shadow it nor be shadowed) and installs its hooks.
   Other modules can ask for the same (`when_imported`): the probe hooks
   `torch.distributed.checkpoint` when the script imports it.

Python started with `-S`, `-I` or `-E` reads neither `PYTHONPATH` nor this file: no probe there.
Standard library only, and nothing imported at start-up beyond what `site` already loaded.
"""

import os
import sys

# typing.TYPE_CHECKING without importing `typing` (not loaded at start-up): the names below are
# for mypy only, in annotations Python never evaluates (strings, and local variables').
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

_HERE = os.path.dirname(os.path.realpath(__file__))
# module name -> [callable(module)] run once that module has executed
_CALLBACKS: "dict[str, list[Callable[[ModuleType], object]]]" = {}


def _chain() -> None:
    """Run the next `sitecustomize.py` on `sys.path` after this directory, if there is one."""
    seen = False
    for entry in list(sys.path):
        try:
            here = os.path.realpath(entry or os.getcwd())
        except (OSError, ValueError):
            continue
        if here == _HERE:
            seen = True
            continue
        path = os.path.join(here, "sitecustomize.py")
        if not seen or not os.path.isfile(path):
            continue
        import importlib.util

        try:
            spec = importlib.util.spec_from_file_location("sitecustomize", path)
            if spec is None or spec.loader is None:
                return
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as exc:  # as site.execsitecustomize reports it: one line, and carry on
            print(f"Error in sitecustomize ({path}); set PYTHONVERBOSE for traceback:", file=sys.stderr)
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return
        globals().update({k: v for k, v in vars(module).items() if not k.startswith("_")})
        return


def when_imported(name: str, callback: "Callable[[ModuleType], object]") -> None:
    """Call `callback(module)` once `name` has been imported (now, if it already was)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        _CALLBACKS.setdefault(name, []).append(callback)


class _Watch:
    """A finder that finds nothing: for a watched module it asks the finders after it for the
    spec, and has the module's loader run the callbacks once the module has executed."""

    def find_spec(
        self, fullname: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if fullname not in _CALLBACKS:
            return None
        spec: ModuleSpec | None = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader: Any = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        callbacks = _CALLBACKS.pop(fullname)

        def exec_then_call(module: "ModuleType") -> None:
            try:
                del loader.exec_module  # this instance's own method again
            except AttributeError:
                pass
            exec_module(module)
            for callback in callbacks:
                callback(module)

        try:
            loader.exec_module = exec_then_call
        except (AttributeError, TypeError):
            return spec  # a loader that takes no attribute: no probe, nothing broken
        return spec


def _activate(torch: "ModuleType") -> None:
    """torch is imported: load the probe's package by path and install its hooks."""
    try:
        import importlib
        import importlib.util

        package_dir = os.path.dirname(_HERE)
        root = os.path.dirname(os.path.dirname(package_dir))
        if importlib.util.find_spec("aerie_contracts") is None:
            sys.path.append(root)  # last: it never shadows the user's modules
        spec = importlib.util.spec_from_file_location(
            "_aerie_inproc", os.path.join(package_dir, "__init__.py"), submodule_search_locations=[package_dir]
        )
        if spec is None or spec.loader is None:
            return
        package = importlib.util.module_from_spec(spec)
        sys.modules["_aerie_inproc"] = package
        spec.loader.exec_module(package)
        importlib.import_module("_aerie_inproc.hooks").install(torch, when_imported)
    except Exception as exc:
        print(f"aerie probe: off ({type(exc).__name__}: {exc})", file=sys.stderr)


# `health.probe: off` never gets here: agent.inproc.child_env leaves this directory off the path.
_chain()
sys.modules.setdefault("_aerie_probe_site", sys.modules[__name__])
when_imported("torch", _activate)
if "torch" in _CALLBACKS:
    sys.meta_path.insert(0, _Watch())
