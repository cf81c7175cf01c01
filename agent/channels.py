"""Input channels arrive before any rank starts: File mode downloads, FastFile is checked.

SageMaker downloads a File-mode channel into `/opt/ml/input/data/<channel>/` before the
container's code runs; on the local and Slurm backends the agent does it here, from the channel's
S3 URI (`SM_CHANNEL_<NAME>_S3_URI`) and its `inputdataconfig.json` entry:

- File: the objects under the prefix (with `ShardedByS3Key`, this node's share: every n-th key in
  key order, n = the number of hosts) are downloaded with the parallel ranged-GET engine
  (`aerie_s3.download`: `AERIE_S3_CONNECTIONS` CRT GETs in flight across objects), each verified
  (size, and a checksum where S3 has one), into the per-host ETag cache (`agent.channel_cache`),
  then hard-linked into the channel directory. A key lands at its path below the prefix, as on
  SageMaker: `s3://b/data/train` holding `data/train/a/x.bin` gives `<channel>/a/x.bin`.
- FastFile: nothing is downloaded (the trainer streams, see `trainer.data.s3_indexed`); the agent
  only checks that the prefix holds an object, so a wrong URI fails as early as in File mode.
- Pipe is SageMaker's own; elsewhere it is refused at submit time.

A missing prefix, an access error or an object that fails its check twice raises
`InputUnavailable`: the attempt fails with `input.unavailable` naming the channel and prefix, before
any rank starts, and the chain does not retry it (the job's input is wrong). Progress goes to the
node log every few seconds (the node's heartbeats say `phase: data_download` meanwhile); the totals
(seconds, bytes downloaded and from cache, per channel) into `agent/data_download.json`. Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aerie_contracts.channels import FAST_FILE, FILE, FULLY_REPLICATED, S3_URI_SUFFIX, SHARDED_BY_S3_KEY, env_name
from aerie_contracts.container import CHANNEL_CACHE_ENV, DEFAULT_CHANNEL_CACHE, INPUT_UNAVAILABLE, read_json
from agent.channel_cache import ChannelCache, place

log = logging.getLogger("aerie.agent")
PROGRESS_EVERY_S = 2.0


@dataclass(frozen=True)
class Channel:
    name: str
    uri: str
    mode: str
    distribution: str
    dir: Path


class InputUnavailable(Exception):
    """A channel that cannot arrive; `reason()` is the node's failure reason."""

    def __init__(self, channel: Channel, problem: str):
        self.channel = channel
        self.problem = problem
        super().__init__(f"input channel '{channel.name}' ({channel.uri}, {channel.mode} mode): {problem}")

    def reason(self, host: str) -> dict[str, Any]:
        return {
            "kind": INPUT_UNAVAILABLE,
            "host": host,
            "channel": self.channel.name,
            "prefix": self.channel.uri,
            "mode": self.channel.mode,
            "message": str(self),
        }


def channels_of(ml_root: Path, env: Mapping[str, str]) -> list[Channel]:
    """The S3 channels of this node's contract (local-path and SageMaker-managed ones have no
    `SM_CHANNEL_<NAME>_S3_URI` and need nothing from the agent)."""
    config = read_json(ml_root / "input" / "config" / "inputdataconfig.json", {}) or {}
    out = []
    for name in sorted(config):  # SageMaker's own list of the job's channels
        uri = env.get(f"SM_CHANNEL_{env_name(name)}{S3_URI_SUFFIX}")
        if not uri:
            continue
        entry = config.get(name) or {}
        out.append(
            Channel(
                name=name,
                uri=uri,
                mode=entry.get("TrainingInputMode") or FILE,
                distribution=entry.get("S3DistributionType") or FULLY_REPLICATED,
                dir=Path(env.get(f"SM_CHANNEL_{env_name(name)}") or ml_root / "input" / "data" / name),
            )
        )
    return out


def relative_path(prefix: str, key: str) -> str:
    """Where `key` lands under the channel directory: its path below the prefix "folder"."""
    rest = key[len(prefix) :]
    if not prefix or prefix.endswith("/"):
        rel = rest
    elif rest.startswith("/"):
        rel = rest[1:]
    else:  # a prefix that ends inside a name: `data/train` -> `train.bin`, `train/x.bin`
        rel = key[prefix.rfind("/") + 1 :]
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"key {key!r} has no safe path below the prefix {prefix!r}")
    return "/".join(parts)


def share(objects: list, hosts: tuple[str, ...] | list[str], host: str, distribution: str) -> list:
    """This node's objects: all of them, or with ShardedByS3Key every n-th in key order."""
    if distribution != SHARDED_BY_S3_KEY or len(hosts) <= 1:
        return objects
    return objects[list(hosts).index(host) :: len(hosts)]


class _Progress:
    """Bytes landed, a line in the node log and a heartbeat every PROGRESS_EVERY_S."""

    def __init__(self, channel: Channel, total: int, objects: int, notify: Callable[[dict], None] | None):
        self.channel, self.total, self.objects, self.notify = channel, total, objects, notify
        self.done = self.done_objects = 0
        self.t0 = self.last = time.monotonic()
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last < PROGRESS_EVERY_S:
                return
            self.last = now
        self.report()

    def object_done(self, *_args) -> None:
        with self.lock:
            self.done_objects += 1

    def snapshot(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        return {
            "channel": self.channel.name,
            "bytes": self.done,
            "total_bytes": self.total,
            "objects": self.done_objects,
            "total_objects": self.objects,
            "seconds": round(elapsed, 3),
            "MBps": round(self.done / elapsed / 1e6, 2),
        }

    def report(self) -> None:
        s = self.snapshot()
        pct = 100.0 * s["bytes"] / self.total if self.total else 100.0
        log.info(
            "channel %s: downloading %.1f/%.1f MiB (%.0f%%) at %.1f MB/s, %d/%d objects",
            self.channel.name,
            s["bytes"] / 2**20,
            self.total / 2**20,
            pct,
            s["MBps"],
            s["objects"],
            self.objects,
        )
        if self.notify is not None:
            self.notify(s)


def cache_of(env: Mapping[str, str], endpoint: str | None) -> ChannelCache | None:
    root = env.get(CHANNEL_CACHE_ENV) or DEFAULT_CHANNEL_CACHE
    if root.lower() in ("off", "none", "0", "false"):
        return None
    return ChannelCache(Path(root), endpoint)


def receive(
    ml_root: Path,
    env: Mapping[str, str],
    hosts: tuple[str, ...] | list[str],
    host: str,
    *,
    stop: threading.Event | None = None,
    notify: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """Make every channel of this node available; the `data_download` record. Raises
    InputUnavailable (the job's fault) or `aerie_s3.ranged.Cancelled` (a stop request)."""
    from aerie_s3.settings import S3Settings

    settings = S3Settings.from_env(env)
    channels = channels_of(ml_root, env)
    t0 = time.time()
    record: dict[str, Any] = {"started_at": t0, "channels": {}}
    for channel in channels:
        if channel.mode == FAST_FILE:
            record["channels"][channel.name] = _check_exists(channel, settings)
        elif channel.mode == FILE:
            record["channels"][channel.name] = _download_channel(
                channel, settings, cache_of(env, settings.endpoint_url), hosts, host, stop, notify
            )
        else:
            raise InputUnavailable(channel, f"{channel.mode} mode is only available on the sagemaker backend")
    per = record["channels"].values()
    record.update(
        ended_at=time.time(),
        seconds=round(time.time() - t0, 3),
        bytes=sum(c.get("downloaded_bytes", 0) for c in per),
        cached_bytes=sum(c.get("cached_bytes", 0) for c in per),
        objects=sum(c.get("objects", 0) for c in per),
        downloaded_objects=sum(c.get("downloaded_objects", 0) for c in per),
    )
    return record


def _list(channel: Channel, settings, limit: int | None = None) -> list:
    from aerie_s3.listing import describe_error, list_prefix

    try:
        return list_prefix(channel.uri, settings, limit=limit)
    except ValueError as exc:  # not an s3:// URI
        raise InputUnavailable(channel, str(exc)) from None
    except Exception as exc:  # botocore: NoSuchBucket, AccessDenied, endpoint unreachable, ...
        raise InputUnavailable(channel, f"cannot list the prefix: {describe_error(exc)}") from None


def _check_exists(channel: Channel, settings) -> dict[str, Any]:
    if not _list(channel, settings, limit=1):
        raise InputUnavailable(channel, "no objects under the prefix")
    log.info("channel %s: FastFile, streamed from %s (nothing downloaded)", channel.name, channel.uri)
    return {"uri": channel.uri, "mode": channel.mode}


def _download_channel(channel, settings, cache, hosts, host, stop, notify) -> dict[str, Any]:
    from aerie_s3.download import Transfer, download
    from aerie_s3.listing import describe_error
    from aerie_s3.settings import parse_uri
    from aerie_s3.verify import ChecksumMismatch

    t0 = time.monotonic()
    listed = _list(channel, settings)
    if not listed:
        raise InputUnavailable(channel, "no objects under the prefix")
    mine = share(sorted(listed, key=lambda o: o.key), hosts, host, channel.distribution)
    _, prefix = parse_uri(channel.uri)
    try:
        placed = {o: channel.dir / relative_path(prefix, o.key) for o in mine}
    except ValueError as exc:
        raise InputUnavailable(channel, str(exc)) from None
    _check_layout(channel, placed)
    if not mine:
        log.warning("channel %s: %s's ShardedByS3Key share of %d object(s) is empty", channel.name, host, len(listed))

    with cache.lock(channel.uri) if cache is not None else contextlib.nullcontext():
        if cache is not None:
            hits = {o: p for o in mine if (p := cache.lookup(o)) is not None}
            todo = [Transfer(o, cache.path(o)) for o in mine if o not in hits]
        else:  # no cache: straight into the channel directory, every time
            hits, todo = {}, [Transfer(o, placed[o]) for o in mine]
        total = sum(t.obj.size for t in todo)
        progress = _Progress(channel, total, len(todo), notify)
        if notify is not None:
            notify(progress.snapshot())  # the node is alive (heartbeat) before the first byte
        log.info(
            "channel %s: %d object(s), %.1f MiB for this node; %d (%.1f MiB) from the cache, downloading %d (%.1f MiB)",
            channel.name,
            len(mine),
            sum(o.size for o in mine) / 2**20,
            len(hits),
            sum(o.size for o in hits) / 2**20,
            len(todo),
            total / 2**20,
        )

        def committed(transfer, method):
            if cache is not None:
                cache.commit(transfer.obj, method)
            progress.object_done()

        try:
            stats = download(todo, settings=settings, stop=stop, on_bytes=progress.add, on_done=committed)
        except ChecksumMismatch as exc:
            raise InputUnavailable(channel, f"an object failed its check twice: {exc}") from None
        except OSError as exc:
            raise InputUnavailable(channel, f"download failed: {exc}") from None
        except Exception as exc:
            from aerie_s3.ranged import Cancelled

            if isinstance(exc, Cancelled):
                raise
            raise InputUnavailable(channel, f"download failed: {describe_error(exc)}") from None
        if cache is not None:
            for o, dest in placed.items():
                place(cache.path(o), dest)
    seconds = time.monotonic() - t0
    if todo:
        progress.report()
    log.info(
        "channel %s ready in %.1f s: %d object(s), %.1f MiB downloaded (%.1f MB/s), %.1f MiB from cache; verified %s",
        channel.name,
        seconds,
        stats.objects,
        stats.bytes / 2**20,
        stats.bytes / max(stats.seconds, 1e-9) / 1e6,
        sum(o.size for o in hits) / 2**20,
        stats.verified or "nothing new",
    )
    return {
        "uri": channel.uri,
        "mode": channel.mode,
        "distribution": channel.distribution,
        "objects": len(mine),
        "bytes": sum(o.size for o in mine),
        "downloaded_objects": stats.objects,
        "downloaded_bytes": stats.bytes,
        "cached_objects": len(hits),
        "cached_bytes": sum(o.size for o in hits),
        "download_seconds": round(stats.seconds, 3),
        "seconds": round(seconds, 3),
        "verified": stats.verified,
    }


def _check_layout(channel: Channel, placed: dict) -> None:
    """Two keys on one path, or a key that is also another's folder, cannot both land."""
    seen: dict[Path, Any] = {}
    for obj, path in placed.items():
        if path in seen:
            raise InputUnavailable(channel, f"keys {seen[path].key!r} and {obj.key!r} land on the same path")
        seen[path] = obj
    for path, obj in seen.items():
        for parent in path.parents:
            if parent in seen:
                raise InputUnavailable(channel, f"key {seen[parent].key!r} is a file and a folder of {obj.key!r}")
            if parent == channel.dir:
                break


def write_record(node_dir: Path, record: dict[str, Any]) -> None:
    path = node_dir / "data_download.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
