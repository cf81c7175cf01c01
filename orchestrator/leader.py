"""Who runs the reconcile loop: exactly one control-plane process per store.

Several API processes may serve one PostgreSQL (behind a load balancer), but only one may launch
attempts and deliver events, or an attempt could be launched twice. PostgreSQL: a session-level
advisory lock held on a dedicated connection; when the leader dies its connection closes, the
lock is released at once, and a follower takes over on its next try (within its poll interval).
SQLite (one machine): an exclusive `flock` on a file beside the database, released by the kernel
when the holder dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from sqlalchemy import Engine, text

log = logging.getLogger("aerie.leader")

LOCK_KEY = 0x61657269  # "aeri"


class LeaderLock:
    def try_acquire(self) -> bool:
        raise NotImplementedError

    def still_held(self) -> bool:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError


class PostgresLeaderLock(LeaderLock):
    def __init__(self, engine: Engine):
        self.engine = engine
        self._conn = None

    def try_acquire(self) -> bool:
        if self._conn is not None:
            return self.still_held()
        conn = self.engine.connect()
        try:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar()
            conn.commit()
        except Exception:
            conn.close()
            raise
        if got:
            self._conn = conn
            return True
        conn.close()
        return False

    def still_held(self) -> bool:
        """The lock lives as long as its connection: check the connection is alive."""
        if self._conn is None:
            return False
        try:
            self._conn.execute(text("SELECT 1"))
            self._conn.commit()
            return True
        except Exception:
            log.warning("lost the leader connection; stepping down")
            self._drop()
            return False

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
                self._conn.commit()
            except Exception:
                pass
            self._drop()

    def _drop(self) -> None:
        try:
            self._conn.close()  # type: ignore[union-attr]
        except Exception:
            pass
        self._conn = None


class FileLeaderLock(LeaderLock):
    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return True

    def still_held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def leader_lock_for(engine: Engine, sqlite_lock_path: Path) -> LeaderLock:
    if engine.dialect.name == "postgresql":
        return PostgresLeaderLock(engine)
    return FileLeaderLock(sqlite_lock_path)
