"""Checkpoints of a trainer Aerie did not write: found on local disk, uploaded, committed, restored.

The trainer saves into `checkpoint.local_path` as it always does (HF `output_dir`, torchtitan's
checkpoint folder, Megatron's `--save`). The agent of the node hosting global rank 0 scans that
directory every tick; a checkpoint directory counts as finished only when its trainer's own
completion marker exists (`aerie_contracts.byo.MARKERS`, or a glob) *and* none of its files changed
size or mtime for `SETTLE_S` (a save still being written is never uploaded). It is then uploaded in
a background thread — training goes on — with parallel multipart uploads (`aerie_s3.upload`) to
`<AERIE_CHECKPOINT_URI>/step_N/attempt_E/`, and committed through the fenced gate
(`aerie_checkpoint.fence.commit`: a superseded attempt writes no manifest; the manifest is
written last, so an upload killed half-way leaves none). From then on it is a good checkpoint like
Aerie's own: GC, verification, chaining and resume apply.

On a restart with `AERIE_RESUME_FROM`, every node restores that checkpoint into local_path under
its original directory name before any rank starts: ranged parallel GETs (`aerie_s3.download`,
each object verified against S3's checksum), then every object of the manifest checked present
with its size. A script that resumes from the newest checkpoint in its directory resumes unchanged.

On an in-place restart (the same nodes, a new worker group: `hand_over`) the directory still holds
the last group's files. Everything in it is moved aside (`.aerie-aside/attempt-N/` inside it, the
same filesystem: a rename, never a copy; only the newest aside is kept) so that no checkpoint the
control plane did not choose is ever resumed from: a newer one the failed attempt wrote but never
committed, a save it left half-written. The one exception is the resume point itself where this
node committed it and its files are unchanged since: it stays where the trainer left it, and
nothing is downloaded. Every other node restores the resume point as on a relaunch.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aerie_contracts import byo
from aerie_contracts import env as E
from aerie_contracts.container import node_path

log = logging.getLogger("aerie.agent")
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")


def local_dir(local_path: str | None, ml_root: Path) -> Path:
    """Where the checkpoints are on this node: SageMaker's /opt/ml paths under the node's ML root
    (the local and Slurm backends root /opt/ml there), other absolute paths as given."""
    return node_path(local_path or byo.DEFAULT_LOCAL_PATH, ml_root)


def finished_candidates(root: Path, marker: str) -> dict[str, tuple[int, Path]]:
    """{directory name: (step, directory)} of every checkpoint whose completion marker exists."""
    found: dict[str, tuple[int, Path]] = {}
    if not root.is_dir():
        return found
    if marker == byo.MARKER_LIGHTNING:
        return lightning_candidates(root)
    if marker == byo.MARKER_HF:
        pattern, name_re = "checkpoint-*/trainer_state.json", re.compile(r"^checkpoint-(\d+)$")
    elif marker in (byo.MARKER_DCP, byo.MARKER_TORCHTITAN):
        pattern, name_re = "step-*/.metadata", re.compile(r"^step-(\d+)$")
    elif marker == byo.MARKER_MEGATRON:
        try:
            it = int((root / "latest_checkpointed_iteration.txt").read_text().strip())
        except (OSError, ValueError):
            return found  # absent, or "release": nothing newer to pick up
        d = root / f"iter_{it:07d}"
        return {d.name: (it, d)} if d.is_dir() else found
    else:
        pattern, name_re = marker, _LAST_INT
    for hit in root.glob(pattern):
        d = hit.parent
        m = name_re.search(d.name)
        if m and d != root:
            found[str(d.relative_to(root))] = (int(m.group(1)), d)
    return found


# Lightning's ModelCheckpoint names: "epoch=E-step=S.ckpt" (its default `filename`), "last.ckpt",
# "last-v1.ckpt" (a version counter); any other `filename` template keeps the ".ckpt" suffix.
_LIGHTNING_STEP = re.compile(r"(?:^|[-_])step=(\d+)")
_LIGHTNING_LAST = re.compile(r"^last(?:-v\d+)?\.ckpt$")
LIGHTNING_LAST = "last.ckpt"  # what `trainer.fit(ckpt_path="last")` looks for in the checkpoint directory
LIGHTNING_STAGE = ".aerie-upload"  # hard links of files being uploaded (the trainer may rotate them away)
ASIDE = ".aerie-aside"  # the last worker group's files, set aside on an in-place restart (`hand_over`)
# An in-place restart waits this long for the last group's upload to end (it is superseded: its
# commit is refused by the fence) before its files are moved; it never blocks the restart longer.
HANDOVER_UPLOAD_WAIT_S = 10.0


def lightning_step(path: Path) -> int | None:
    """The `global_step` a Lightning checkpoint file holds, read without torch; None when the file is
    not a complete torch zip archive (a save still being written, or cut short) or has no step.

    torch.save writes a zip whose central directory comes last, so a file still being written (or
    copied: Lightning's save goes through a temporary file that is moved, i.e. copied where the
    temporary directory is another filesystem) does not open. The step is the top-level dict's
    `global_step` in `archive/data.pkl` (Lightning's `dump_checkpoint` puts it second, after
    `epoch`): the pickle is walked opcode by opcode, nothing is unpickled."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not names:
                return None
            with z.open(names[0]) as f:
                data = f.read(1 << 16)  # the first keys are in the first bytes
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None
    key = None
    try:
        for i, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if i > 200:
                break
            if key == "global_step" and op.name in ("BININT", "BININT1", "BININT2", "LONG1", "INT"):
                return int(arg)  # type: ignore[arg-type]
            memo = "PUT" in op.name or op.name == "MEMOIZE"
            key = arg if isinstance(arg, str) and "UNICODE" in op.name else (key if memo else None)
    except Exception:  # a truncated read or an unexpected opcode: no step
        return None
    return None


def lightning_candidates(root: Path) -> dict[str, tuple[int, Path]]:
    """{relative path: (step, file)} of every complete Lightning checkpoint file under root (flat
    files, in any directory below it: `dirpath` or `lightning_logs/version_N/checkpoints/`). A
    step-named file's step is in its name; `last.ckpt` (no step in its name) is read from its
    content and skipped where a step-named file of the same directory holds that step (the same
    save). Symbolic links (`save_last="link"`) are skipped: their target is a file of its own."""
    found: dict[str, tuple[int, Path]] = {}
    if not root.is_dir():
        return found
    lasts: list[tuple[str, Path]] = []
    for p in sorted(root.rglob("*.ckpt")):
        try:
            rel = p.relative_to(root)
            if p.is_symlink() or not p.is_file() or LIGHTNING_STAGE in rel.parts or rel.parts[0].startswith(".aerie"):
                continue
        except (OSError, ValueError):
            continue
        if _LIGHTNING_LAST.match(p.name):
            lasts.append((str(rel), p))
            continue
        held = lightning_step(p)  # None: not a complete checkpoint (yet)
        m = _LIGHTNING_STEP.search(p.stem)
        if held is None:
            continue
        found[str(rel)] = (int(m.group(1)) if m else held, p)
    for rel, p in lasts:
        step = lightning_step(p)
        if step is None:
            continue
        if any(s == step and q.parent == p.parent for s, q in found.values()):
            continue
        found[f"{rel}@{step}"] = (step, p)  # last.ckpt is rewritten at every save: one name per step
    return found


def signature(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file's (relative path, size, mtime): equal twice over SETTLE_S = nothing is writing.
    For a single file (Lightning's flat checkpoints): that file's name, size and mtime."""
    if directory.is_file():
        try:
            st = directory.stat()
        except OSError:
            return ()
        return ((directory.name, st.st_size, st.st_mtime_ns),)
    out = []
    for p in sorted(directory.rglob("*")):
        try:
            if p.is_file():
                st = p.stat()
                out.append((str(p.relative_to(directory)), st.st_size, st.st_mtime_ns))
        except OSError:
            continue
    return tuple(out)


@dataclass
class CheckpointSync:
    """One node's watcher (rank 0's node uploads; every node restores)."""

    root: Path
    marker: str
    prefix: str  # AERIE_CHECKPOINT_URI
    attempt: int | None = None
    settle_s: float = byo.SETTLE_S
    uploads: bool = True
    gate: Any = None  # aerie_checkpoint.fence.CommitGate, None outside Aerie
    done: dict[str, str] = field(default_factory=dict)  # directory name -> committed URI ("" = skip)
    failed: dict[str, str] = field(default_factory=dict)
    _seen: dict[str, tuple[float, tuple]] = field(default_factory=dict)
    _thread: threading.Thread | None = None
    committed: list[dict[str, Any]] = field(default_factory=list)
    uploaded: dict[str, tuple] = field(default_factory=dict)  # directory name -> the files committed (signature)
    _floor: int = -1  # flat files (Lightning): the restored step; files of older steps are not uploaded again

    @classmethod
    def from_env(cls, environ: dict[str, str], ml_root: Path, uploads: bool) -> CheckpointSync | None:
        marker, prefix = E.CHECKPOINT_MARKER.get(environ=environ), E.CHECKPOINT_URI.get(environ=environ)
        if not marker:
            return None
        from aerie_checkpoint.fence import CommitGate

        number = E.ATTEMPT_NUMBER.get(environ=environ) or ""
        return cls(
            root=local_dir(E.CHECKPOINT_LOCAL_PATH.get(environ=environ), ml_root),
            marker=marker,
            prefix=prefix or "",
            attempt=int(number) if number.isdigit() else None,
            uploads=uploads and bool(prefix),
            gate=CommitGate.from_env(environ),
        )

    # --- upload ------------------------------------------------------------------------------

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def tick(self, now: float) -> None:
        """Start uploading the oldest finished, settled checkpoint not done yet (one at a time)."""
        if not self.uploads or self.busy():
            return
        for name, (step, d) in sorted(finished_candidates(self.root, self.marker).items(), key=lambda kv: kv[1][0]):
            if name in self.done or name in self.failed or (d.is_file() and step <= self._floor):
                continue
            sig = signature(d)
            first, last_sig = self._seen.get(name, (now, ()))
            if sig != last_sig or not sig:
                self._seen[name] = (now, sig)  # new or still changing: the clock starts again
                continue
            if now - first < self.settle_s:
                continue
            self._thread = threading.Thread(target=self._upload, args=(name, step, d, sig), daemon=True)
            self._thread.start()
            return

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _upload(self, name: str, step: int, d: Path, sig: tuple) -> None:
        import aerie_checkpoint.fence as fence
        from aerie_checkpoint.manifest import checkpoint_uri
        from aerie_s3.upload import upload_files

        uri = checkpoint_uri(self.prefix, step, self.attempt)
        t0 = time.monotonic()
        staged: Path | None = None
        try:
            if d.is_file():  # a flat checkpoint file (Lightning): one object, restored as last.ckpt
                staged = self._stage(d)  # the trainer may rotate it away (save_top_k) mid-upload
                size = upload_files([(str(staged), f"{uri}/{d.name}")])
                # the bytes uploaded are the ones that settled (a rotation may have removed `d`
                # meanwhile: its hard link kept them; a rewrite in place changes size or mtime)
                if [x[1:] for x in signature(staged)] != [x[1:] for x in sig]:
                    raise RuntimeError(f"{d} changed while it was uploaded")
                rel = name.split("@", 1)[0]
                extra = {
                    byo.MANIFEST_LOCAL_DIR: str(Path(rel).parent),
                    byo.MANIFEST_LOCAL_FILE: rel,
                    byo.MANIFEST_SOURCE: "agent",
                    "marker": self.marker,
                }
            else:
                size = upload_files([(str(d / rel), f"{uri}/{rel}") for rel, _s, _m in sig])
                if signature(d) != sig:
                    raise RuntimeError(f"{d} changed while it was uploaded")
                extra = {byo.MANIFEST_LOCAL_DIR: name, byo.MANIFEST_SOURCE: "agent", "marker": self.marker}
            fence.commit(
                uri,
                self.gate,
                step=step,
                extra=extra,
                attempt=self.attempt,
                attempt_id=self.gate.attempt_id if self.gate else "",
            )
        except Exception as exc:  # a superseded attempt, a vanished file (rotation), S3 down
            log.error("checkpoint %s (step %d) not committed: %s", d, step, exc)
            self.failed[name] = str(exc)
            return
        finally:
            if staged is not None and staged != d:
                staged.unlink(missing_ok=True)
        self.done[name] = uri
        self.uploaded[name] = sig
        self.committed.append({"step": step, "uri": uri, "size_bytes": size, "save_s": time.monotonic() - t0})
        log.info("committed %s (step %d, %d bytes) as %s", d, step, size, uri)

    def _stage(self, f: Path) -> Path:
        """A hard link to `f` under local_path's .aerie-upload/ (same filesystem): the trainer's
        rotation (ModelCheckpoint's save_top_k removes the previous file) cannot take the bytes
        away mid-upload. Where links are not possible, the file itself."""
        stage = self.root / LIGHTNING_STAGE
        target = stage / f"{time.monotonic_ns()}-{f.name}"
        try:
            stage.mkdir(exist_ok=True)
            import os

            os.link(f, target)
        except OSError:
            return f
        return target

    # --- restore -----------------------------------------------------------------------------

    def restore(self, uri: str) -> Path:
        """Put checkpoint `uri` back under local_path, verified. Raises on anything wrong."""
        from aerie_checkpoint.manifest import read_manifest
        from aerie_s3.download import Transfer, download
        from aerie_s3.listing import list_prefix

        manifest = read_manifest(uri)
        if manifest is None:
            raise RuntimeError(f"{uri} has no manifest: not a committed checkpoint")
        if (manifest.get("extra") or {}).get(byo.MANIFEST_LOCAL_FILE):
            return self._restore_file(uri, manifest)
        name = (manifest.get("extra") or {}).get(byo.MANIFEST_LOCAL_DIR)
        if not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise RuntimeError(f"{uri} was not committed from a local checkpoint directory (no safe local_dir)")
        target = self.root / name
        listed = {o.key[len(uri.split("/", 3)[3].rstrip("/")) + 1 :]: o for o in list_prefix(uri.rstrip("/") + "/")}
        want = {o["key"]: o for o in manifest["objects"]}
        missing = sorted(k for k in want if k not in listed or listed[k].size != want[k]["size"])
        if missing:
            raise RuntimeError(f"{uri}: objects missing or of the wrong size in S3: {missing[:5]}")
        stage = self.root / f".aerie-restore-{name.replace('/', '_')}"
        download([Transfer(listed[k], stage / k) for k in want], verify=True)
        for key, obj in want.items():  # what landed is what the manifest committed
            if (stage / key).stat().st_size != obj["size"]:
                raise RuntimeError(f"{uri}: {key} restored with the wrong size")
        if target.exists():
            import shutil

            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        stage.rename(target)
        if self.marker == byo.MARKER_MEGATRON:
            (self.root / "latest_checkpointed_iteration.txt").write_text(str(manifest["step"]))
        self.done[name] = ""  # restored, not ours to upload again
        return target

    def _restore_file(self, uri: str, manifest: dict[str, Any]) -> Path:
        """A flat checkpoint file (Lightning) back as `last.ckpt` in the directory it was saved in,
        so `trainer.fit(ckpt_path="last")` resumes from it. Other `last*.ckpt` there (a newer save
        that was never committed) are moved aside (`<name>.aerie-aside`), never used."""
        from aerie_s3.download import Transfer, download
        from aerie_s3.listing import list_prefix

        rel = str(manifest["extra"][byo.MANIFEST_LOCAL_FILE])
        if Path(rel).is_absolute() or ".." in Path(rel).parts or len(manifest.get("objects") or []) != 1:
            raise RuntimeError(f"{uri}: not one flat checkpoint file with a safe local_file ({rel!r})")
        obj = manifest["objects"][0]
        listed = {o.key.rsplit("/", 1)[-1]: o for o in list_prefix(uri.rstrip("/") + "/")}
        got = listed.get(obj["key"].rsplit("/", 1)[-1])
        if got is None or got.size != obj["size"]:
            raise RuntimeError(f"{uri}: {obj['key']} missing or of the wrong size in S3")
        directory = self.root / Path(rel).parent
        directory.mkdir(parents=True, exist_ok=True)
        stage = directory / f".aerie-restore-{Path(rel).name}"
        download([Transfer(got, stage)], verify=True)
        if stage.stat().st_size != obj["size"] or lightning_step(stage) is None:
            stage.unlink(missing_ok=True)
            raise RuntimeError(f"{uri}: {obj['key']} restored incomplete")
        for other in directory.glob("last*.ckpt"):
            if _LIGHTNING_LAST.match(other.name) and other.name != LIGHTNING_LAST:
                other.rename(other.with_name(other.name + ".aerie-aside"))
        target = directory / LIGHTNING_LAST
        stage.replace(target)
        step = int(manifest["step"])
        self.done[f"{target.relative_to(self.root)}@{step}"] = ""  # restored, not ours to upload again
        self._floor = max(self._floor, step)
        return target


# --- in-place hand-over ------------------------------------------------------------------------


def hand_over(previous: CheckpointSync, fresh: CheckpointSync, resume: str | None, tag: str) -> str | None:
    """Between two worker groups on the same node (an in-place restart): wait briefly for the last
    group's upload, then set the directory's entries aside (module docstring) except the resume
    point where `previous` committed it from this node with its files unchanged. Returns that
    directory's name when it was kept (nothing to restore), else None."""
    previous.wait(HANDOVER_UPLOAD_WAIT_S)
    kept = _committed_here(previous, resume)
    set_aside(fresh.root, tag, keep=kept)
    if kept is None:
        return None
    fresh.done[kept] = ""  # restored, in effect: not ours to upload again
    m = _LAST_INT.search(kept)
    if fresh.marker == byo.MARKER_MEGATRON and m:  # its pointer file was set aside with the rest
        (fresh.root / "latest_checkpointed_iteration.txt").write_text(str(int(m.group(1))))
    return kept


def _committed_here(previous: CheckpointSync, resume: str | None) -> str | None:
    """The top-level checkpoint directory `previous` committed as `resume`, if its files are still
    the ones uploaded (a flat file, Lightning's, is restored instead: it becomes last.ckpt)."""
    if not resume:
        return None
    for name, uri in previous.done.items():
        if not uri or uri.rstrip("/") != resume.rstrip("/") or "/" in name or name.startswith(".aerie"):
            continue
        d = previous.root / name
        if d.is_dir() and previous.uploaded.get(name) and signature(d) == previous.uploaded[name]:
            return name
    return None


def set_aside(root: Path, tag: str, keep: str | None = None) -> Path | None:
    """Move every entry of `root` (but `keep` and the asides) into `root/.aerie-aside/<tag>/`,
    removing older asides first (one is kept: the disk holds the last group's files once). Returns
    the aside directory, or None when there was nothing to move."""
    import shutil

    if not root.is_dir():
        return None
    entries = [e for e in root.iterdir() if e.name != ASIDE and e.name != keep]
    if not entries:
        return None
    base = root / ASIDE
    if base.is_dir():
        for old in base.iterdir():
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() and not old.is_symlink() else old.unlink()
    target = base / tag
    target.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        entry.rename(target / entry.name)
    log.info("set aside %d entr%s of %s in %s", len(entries), "y" if len(entries) == 1 else "ies", root, target)
    return target
