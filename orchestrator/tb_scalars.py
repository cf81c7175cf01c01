"""Write TensorBoard scalars from the control plane, without torch or tensorboard installed.

The human eval's score (`eval/human_score`, `eval/hallucination_rate`) is known only to the API,
so the API writes it, into the job's TensorBoard directory beside the trainer's curves. An event
file is TFRecord framing (length, masked CRC-32C, data, masked CRC-32C) around `Event` protocol
buffers; a scalar needs four protobuf fields, encoded here by hand.

Ratings change after the fact, so each update writes a `SessionLog.START` at the series' first
step, then the whole series: a START is TensorBoard's sign that a run restarted, and its loader
drops the run's points from that step on ("purge orphaned data", on by default), so what it shows
is the latest series. The human eval therefore gets a run (directory) of its own.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import Iterable


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


SESSION_START = 1  # tensorflow.SessionLog.START


def _event(wall_time: float, step: int, *, file_version: str | None = None,
           scalars: dict[str, float] | None = None, session_start: bool = False) -> bytes:
    msg = _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3 | 0) + _varint(step)
    if file_version is not None:
        msg += _len_field(3, file_version.encode())
    if session_start:
        msg += _len_field(7, _varint(1 << 3 | 0) + _varint(SESSION_START))  # Event.session_log
    if scalars:
        values = b"".join(_len_field(1, _len_field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", v))
                          for tag, v in scalars.items())
        msg += _len_field(5, values)
    return msg


def _record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + _masked(header) + data + _masked(data)


class ScalarFile:
    """One event file, appended to and flushed per write (readers tail it)."""

    def __init__(self, directory: str | Path, suffix: str = "aerie"):
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        existing = sorted(directory.glob(f"events.out.tfevents.*.{suffix}"))
        if existing:
            self.path = existing[-1]
        else:
            self.path = directory / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{suffix}"
            self._append([_event(time.time(), 0, file_version="brain.Event:2")])

    def _append(self, events: Iterable[bytes]) -> None:
        with open(self.path, "ab") as f:
            f.write(b"".join(_record(e) for e in events))
            f.flush()
            os.fsync(f.fileno())

    def write_series(self, series: list[tuple[int, dict[str, float]]]) -> None:
        """Points (step, {tag: value}), written in ascending step order."""
        if not series:
            return
        t = time.time()
        points = sorted(series, key=lambda p: p[0])
        self._append([_event(t, points[0][0], session_start=True)]
                     + [_event(t, step, scalars=values) for step, values in points])
