"""S3 for checkpoints: torch DCP's storage writer and reader on top of `aerie_s3`.

The torch-free half (settings, the boto3 and CRT clients, the parallel ranged-GET engine) lives in
`aerie_s3`, shared with the agent's channel downloads and FastFile reads; the names checkpoint
code used to know are re-exported here (`S3Settings`, `parse_uri`, `is_s3`, `boto3_client`,
`parallel_get`). The writer and reader classes live in `s3dcp`, which imports torch and
s3torchconnector; this module imports it only when an S3 writer or reader is asked for, so that
importing `s3io` (and its re-exports) stays torch-free and cheap (s3torchconnector loads the CRT).

How data moves (checked against s3torchconnector 1.5.0 and torch 2.13):

- Saves: DCP's writer serialises each rank's items into `thread_count` files at once; every
  file is a streaming multipart upload through the CRT (`S3Writer`), parts of `part_size`
  go out in parallel as they fill. Nothing is staged on local disk.
- Restores: s3torchconnector's reader fetches each file as one coalesced range; the CRT
  GETs part 0 of each object alone before fanning out, and each file ends on a tail of its
  last parts, which through the throttling proxy kept a restore near half of (peak
  connections x cap). Our reader subclass hands the byte ranges a rank needs to
  `aerie_s3.ranged` (equal slices of at most `read_part_size`, `connections` CRT ranged GETs
  in flight, into memory, bounded), and lets the parent deserialise from there.
  `parallel_get` is the same engine for one whole object outside DCP (e.g. a `torch.save` file).
"""

from __future__ import annotations

import os

from aerie_checkpoint.storage import local_path

# Re-exported for the checkpoint tests and operators' scripts that know them by these names;
# new code imports them from `aerie_s3` (their home).
from aerie_s3.clients import boto3_client
from aerie_s3.ranged import coalesce, parallel_get
from aerie_s3.settings import MiB, S3Settings, is_s3, parse_uri

__all__ = [
    "MiB",
    "S3Settings",
    "boto3_client",
    "is_s3",
    "parallel_get",
    "parse_uri",
    "storage_reader",
    "storage_writer",
]
_coalesce = coalesce  # the name the reader's tests know


def storage_writer(uri: str | os.PathLike, thread_count: int = 8, settings: S3Settings | None = None, **kwargs):
    """A DCP `StorageWriter` for `s3://` (streams to S3) or `file://`/a path."""
    if is_s3(uri):
        from trainer.checkpoint.s3dcp import AerieS3StorageWriter

        return AerieS3StorageWriter(str(uri), settings or S3Settings.from_env(), thread_count=thread_count, **kwargs)
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(local_path(uri), thread_count=thread_count, **kwargs)


def storage_reader(uri: str | os.PathLike, connections: int = 16, settings: S3Settings | None = None, **kwargs):
    """A DCP `StorageReader` for `s3://` (`connections` ranged GETs at once) or `file://`/a path."""
    if is_s3(uri):
        from trainer.checkpoint.s3dcp import AerieS3StorageReader

        return AerieS3StorageReader(str(uri), settings or S3Settings.from_env(), connections=connections, **kwargs)
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(local_path(uri), **kwargs)
