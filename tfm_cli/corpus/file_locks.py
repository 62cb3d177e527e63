"""Advisory file locks that tell processes apart wherever they run: POSIX record locks (fcntl), which the
kernel drops when the holding process dies, so a lock that can be taken proves its last holder is gone.

They work between processes of one host, between containers sharing a volume (one kernel), and between
NFS clients (NFSv4, or NFSv3 with a running lock daemon): the server arbitrates. A file system without a
lock service (some NFSv3 mounts with `nolock`, some FUSE file systems) refuses them, which is one clear
error, never a silent free-for-all. POSIX locks belong to the process, not to the file descriptor: a
process never conflicts with itself, and closing ANY descriptor of a locked file drops its locks on it,
so each lock file is opened once per holder here and kept open until released.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tfm_cli.errors import TfmError

POLL_SECONDS = 0.2  # how often a waiting process tries a held lock again
NO_LOCK_SERVICE = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def holder_record() -> dict[str, object]:
    """Who this process is, as written into a lock or marker file: host, PID and start time (informational:
    a PID names a process only within one host's, or container's, PID namespace)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def describe_holder(path: Path) -> str:
    """'host H, pid P, since T' from a lock file's record, or 'another process' if it holds none yet."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return f"host {record['host']}, pid {record['pid']}, since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def try_lock(path: Path, shared: bool = False) -> int | None:
    """The open descriptor of `path` with a lock taken on it, or None if another process holds a conflicting one.

    Exclusive locks create the file; shared ones (readers) open an existing file read-only and return None
    if it is missing or unreadable. Closing the descriptor releases the lock. Raises TfmError where the
    file system has no lock service.
    """
    try:
        fd = os.open(path, os.O_RDONLY if shared else os.O_RDWR | os.O_CREAT, 0o666)
    except FileNotFoundError:
        return None
    except PermissionError:
        if shared:
            return None
        raise TfmError(f"{path}: cannot create a lock file (permission denied); the cache folder must be writable") from None
    try:
        fcntl.lockf(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EACCES, errno.EAGAIN):
            return None
        if error.errno in NO_LOCK_SERVICE:
            raise TfmError(
                f"{path}: the file system refuses file locks ({os.strerror(error.errno)}); processes sharing this "
                "cache folder could not tell each other apart. Use a cache folder on a local disk or on NFS with "
                "locking enabled"
            ) from None
        raise
    return fd


def record_holder(fd: int) -> None:
    """Write holder_record() into the locked file `fd`, for the messages of processes that wait for it."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder_record()) + "\n").encode(), 0)


@contextlib.contextmanager
def exclusive_lock(
    path: Path, on_wait: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None,
) -> Iterator[None]:
    """Hold an exclusive lock on `path` for the body, waiting for it as long as another process holds it.

    `on_wait` is called once, with who holds it, when the lock is not free at once; `should_stop` is asked
    while waiting (True: KeyboardInterrupt).
    """
    fd = try_lock(path)
    if fd is None and on_wait is not None:
        on_wait(describe_holder(path))
    while fd is None:
        if should_stop is not None and should_stop():
            raise KeyboardInterrupt
        time.sleep(POLL_SECONDS)
        fd = try_lock(path)
    try:
        record_holder(fd)
        yield
    finally:
        os.close(fd)
