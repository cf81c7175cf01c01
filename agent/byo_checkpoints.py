"""Checkpoints of a trainer Aerie did not write: found on local disk, uploaded, committed, restored.

The trainer saves into `checkpoint.local_path` as it always does (HF `output_dir`, torchtitan's
checkpoint folder, Megatron's `--save`). The agent of the node hosting global rank 0 scans that
directory every tick; a checkpoint directory counts as finished only when its trainer's own
completion marker exists (`aerie_contracts.byo.MARKERS`, or a glob) *and* none of its files changed
size or mtime for `SETTLE_S` (a save still being written is never uploaded). It is then uploaded in
a background thread — training goes on — with parallel multipart uploads (`aerie_s3.upload`) to
`<AERIE_CHECKPOINT_URI>/step_N/attempt_E/`, and committed through the fenced gate
(`trainer.checkpoint.fence.commit`: a superseded attempt writes no manifest; the manifest is
written last, so an upload killed half-way leaves none). From then on it is a good checkpoint like
Aerie's own: GC, verification, chaining and resume apply.

On a restart with `AERIE_RESUME_FROM`, every node restores that checkpoint into local_path under
its original directory name before any rank starts: ranged parallel GETs (`aerie_s3.download`,
each object verified against S3's checksum), then every object of the manifest checked present
with its size. A script that resumes from the newest checkpoint in its directory resumes unchanged.
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
from agent.contract import node_path

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


def signature(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file's (relative path, size, mtime): equal twice over SETTLE_S = nothing is writing."""
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
    gate: Any = None  # trainer.checkpoint.fence.CommitGate, None outside Aerie
    done: dict[str, str] = field(default_factory=dict)  # directory name -> committed URI ("" = skip)
    failed: dict[str, str] = field(default_factory=dict)
    _seen: dict[str, tuple[float, tuple]] = field(default_factory=dict)
    _thread: threading.Thread | None = None
    committed: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_env(cls, environ: dict[str, str], ml_root: Path, uploads: bool) -> CheckpointSync | None:
        marker, prefix = E.CHECKPOINT_MARKER.get(environ=environ), E.CHECKPOINT_URI.get(environ=environ)
        if not marker:
            return None
        from trainer.checkpoint.fence import CommitGate

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
            if name in self.done or name in self.failed:
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
        import trainer.checkpoint.fence as fence
        from aerie_s3.upload import upload_files
        from trainer.checkpoint.manifest import checkpoint_uri

        uri = checkpoint_uri(self.prefix, step, self.attempt)
        t0 = time.monotonic()
        try:
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
        self.done[name] = uri
        self.committed.append({"step": step, "uri": uri, "size_bytes": size, "save_s": time.monotonic() - t0})
        log.info("committed %s (step %d, %d bytes) as %s", d, step, size, uri)

    # --- restore -----------------------------------------------------------------------------

    def restore(self, uri: str) -> Path:
        """Put checkpoint `uri` back under local_path, verified. Raises on anything wrong."""
        from aerie_s3.download import Transfer, download
        from aerie_s3.listing import list_prefix
        from trainer.checkpoint.manifest import read_manifest

        manifest = read_manifest(uri)
        if manifest is None:
            raise RuntimeError(f"{uri} has no manifest: not a committed checkpoint")
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
