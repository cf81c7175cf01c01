"""Every `AERIE_*` name the repository writes anywhere is registered in `aerie_contracts.env`.

The other contracts tests check the names `env.ALL` knows; this one greps for every name, known or
not, in every file that can set or read a variable: Python (string literals, f-strings and
comments; Python identifiers are not variables), shell scripts (by suffix or shebang), YAML,
Makefiles, Dockerfiles, TOML, JSON and the Markdown docs. A name built at run time from the prefix
(an f-string or `str.format` field, `%s` or a shell `$x` right after it, a literal ending in it
that `+` continues) cannot be checked, so it is refused as well: take the name from
`aerie_contracts.env`. The bare prefix (`"AERIE_"`, as in `k.startswith("AERIE_")`) is no name
and is allowed.
"""

from __future__ import annotations

import bisect
import io
import os
import re
import tokenize
from pathlib import Path

from aerie_contracts import env
from orchestrator.settings import Settings

REPO = Path(__file__).resolve().parents[2]

PREFIX = "AERIE_"
NAME = re.compile(r"(?<!\w)AERIE_[A-Z0-9_]*[A-Z0-9](?![\w])")
# The prefix followed by a template part: `{x}` (f-string, str.format, Jinja), `%s`, `$x`/`${x}`.
BUILT = re.compile(r"(?<!\w)AERIE_[A-Z0-9_]*(?=[{%$])")
BUILT_AT_END = re.compile(r"(?<!\w)AERIE_[A-Z0-9_]*$")  # a literal the next token continues
CONCATENATED = re.compile(r"(?<!\w)AERIE_[A-Z0-9_]*[\"'] *\+")  # the same, seen in the raw text

SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "build",
    "dist",
    "cdk.out",
    ".aerie",
    "output",
}
TEXT_SUFFIXES = {".sh", ".bash", ".yml", ".yaml", ".mk", ".toml", ".cfg", ".ini", ".json", ".md"}


def _kind(path: Path) -> str | None:
    """ "python", "text" (grepped whole) or None (not a file that names variables)."""
    if path.suffix == ".py":
        return "python"
    if path.suffix in TEXT_SUFFIXES or path.name == "Makefile" or path.name.startswith("Dockerfile"):
        return "text"
    if not path.suffix:
        try:
            with open(path, "rb") as f:
                first = f.readline(200)
        except OSError:
            return None
        if first.startswith(b"#!"):
            return "python" if b"python" in first else "text"
    return None


def _files(root: Path):
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in names:
            path = Path(folder, name)
            kind = _kind(path)
            if kind is not None:
                yield path, kind


def _text_names(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(line, name) of every name and (line, text) of every built name in a text file."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line(m: re.Match[str]) -> int:
        return bisect.bisect_right(starts, m.start())

    names = [(line(m), m.group()) for m in NAME.finditer(text)]
    built = [(line(m), m.group() + text[m.end()]) for m in BUILT.finditer(text)]
    built += [(line(m), m.group()) for m in CONCATENATED.finditer(text)]
    return names, built


def _python_names(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The same for Python source: its string literals and comments, never its identifiers."""
    names, built = [], []
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.NL]
    fstring_middle = getattr(tokenize, "FSTRING_MIDDLE", None)  # Python 3.12+: f-strings in parts
    for i, tok in enumerate(tokens):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT, fstring_middle):
            continue
        line = tok.start[0]
        for offset, part in enumerate(tok.string.splitlines()):
            names += [(line + offset, m.group()) for m in NAME.finditer(part)]
            built += [(line + offset, m.group()) for m in BUILT.finditer(part)]
        if tok.type == tokenize.COMMENT or i + 1 == len(tokens):
            continue
        body = tok.string.rstrip("'\"") if tok.type == tokenize.STRING else tok.string
        nxt = tokens[i + 1]
        continued = (tok.type == tokenize.STRING and nxt.string == "+") or (
            tok.type == fstring_middle and nxt.string == "{"
        )
        end = BUILT_AT_END.search(body) if continued else None
        if end is not None:
            built.append((tok.end[0], f"{end.group()} {nxt.string}"))
    return names, built


def unregistered_env_names(root: Path, registered: set[str] | None = None) -> list[str]:
    """`path:line: ...` for every `AERIE_*` name under `root` not in `registered` (default: every
    name `aerie_contracts.env` defines), and for every name built from the prefix at run time."""
    known = set(env.BY_NAME) if registered is None else registered
    found = []
    for path, kind in _files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if PREFIX not in text:
            continue
        names, built = _text_names(text)  # a superset of what Python's tokens hold: quick, and often enough
        if kind == "python" and (built or any(name not in known for _, name in names)):
            try:  # look again at its strings and comments only (an identifier is no variable)
                names, built = _python_names(text)
            except (tokenize.TokenError, SyntaxError):  # not valid Python after all: the grep stands
                pass
        rel = path.relative_to(root)
        found += [f"{rel}:{line}: {name} is not in aerie_contracts.env" for line, name in names if name not in known]
        found += [
            f"{rel}:{line}: a name built from the AERIE_ prefix ({what!r}): take it from aerie_contracts.env"
            for line, what in built
        ]
    return found


def test_every_aerie_name_in_the_repository_is_registered():
    found = unregistered_env_names(REPO)
    assert not found, "register them (with a meaning) in aerie_contracts/env_names.py:\n" + "\n".join(found)


def test_the_check_fails_on_a_new_unregistered_name_and_passes_without_it(tmp_path):
    new = PREFIX + "FOO"  # spelled in two parts, so that this file itself names no variable
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text(f'import os\n\nAPI = os.environ.get("{env.API}")\n')
    assert unregistered_env_names(tmp_path) == []
    module.write_text(module.read_text() + f'FOO = os.environ.get("{new}", "")\n')
    assert unregistered_env_names(tmp_path) == [f"pkg/mod.py:4: {new} is not in aerie_contracts.env"]
    module.write_text(module.read_text().replace(f'"{new}"', f"'{new}'"))  # either quote
    assert len(unregistered_env_names(tmp_path)) == 1
    assert unregistered_env_names(tmp_path, set(env.BY_NAME) | {new}) == []  # registered: fine
    module.unlink()
    assert unregistered_env_names(tmp_path) == []


def test_the_check_sees_every_kind_of_file_and_every_way_of_building_a_name(tmp_path):
    new = PREFIX + "FOO"
    files = {
        "a.py": f'x = f"{new}_{{n}}"\n',  # a name inside an f-string
        "b.py": f'x = "{PREFIX}" + key\n',  # concatenated onto the prefix
        "c.py": f'x = f"{PREFIX}{{key.upper()}}_ARN"\n',  # an f-string after the prefix
        "d.py": f"# set {new} to change it\n",  # a comment
        "e.sh": f'dir="${{{new}:-/tmp}}"\n',
        "f": f"#!/bin/sh\necho ${new}\n",  # a shell script by its shebang
        "g.yaml": f"env:\n  {new}: 1\n",
        "Makefile": f"test:\n\t{new}=1 pytest\n",
        "h.sh": f'echo "{PREFIX}${{x}}"\n',
        "Dockerfile": f"ENV {new}=1\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    found = unregistered_env_names(tmp_path)
    assert sorted({f.split(":")[0] for f in found}) == sorted(files), "\n".join(found)
    allowed = {
        "ok.py": f'{PREFIX}SOURCE = "aerie"\nclean = {{k: v for k, v in e.items() if not k.startswith("{PREFIX}")}}\n'
        f'"""The {PREFIX}* variables; {env.HOME} and {PREFIX}<field>."""\n',
        "ok.md": f"`{env.API}` and the `{PREFIX}*` variables\n",
        "data.bin": f"{new}\n",  # not a file that sets or reads variables
    }
    for name in files:
        (tmp_path / name).unlink()
    for name, text in allowed.items():
        (tmp_path / name).write_text(text)
    assert unregistered_env_names(tmp_path) == []


def test_every_control_plane_setting_is_registered():
    """pydantic-settings reads `Settings`' fields as `AERIE_<FIELD>` (or their aliases): each of
    those names is in the contract, so a new setting shows in the environment's table."""
    names = set()
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        choices = getattr(alias, "choices", None) or ([alias] if alias else [PREFIX + field.upper()])
        names |= {str(c) for c in choices if str(c).startswith(PREFIX)}
    assert names - set(env.BY_NAME) == set()
    assert env.LOST_AFTER_HEARTBEATS in names and env.SLACK_BOT_TOKEN in names
