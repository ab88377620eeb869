"""A lock on an output directory, so that two runs never write into the same ``--out``.

The lock is a small JSON file, ``<out>/.meanfield.lock``, created atomically (``O_CREAT |
O_EXCL``): of two runs started together, exactly one creates it. It names its owner (process id,
host, boot id, process start time, the time the lock was taken and the command line), so that a
second run fails at once with a one-line error naming the run in progress.

A process killed with ``SIGKILL`` cannot remove its lock. Such a stale lock is recognised and
taken over: on the host that wrote it, the owner is gone when its process id no longer exists,
when that id now belongs to a process started later (the id was reused), or when the machine has
rebooted since (another boot id). A process on another host (a cluster driver job resubmitted to
another node) cannot be checked directly: its lock is refreshed by a heartbeat (the file's mtime,
every minute by default), and a lock from another host whose heartbeat stopped long ago (15 min by
default) is taken over; a younger one is refused with an error that names the file to remove once
that run is known to be over.

:func:`sigterm_as_exit` turns ``SIGTERM`` (sent by ``kill``, or by SLURM at the end of a job's
time) into ``SystemExit``, so that ``with`` blocks unwind and the lock is removed.

Taking over a stale lock is itself guarded by a second ``O_EXCL`` file, so that of two runs that
find the same stale lock only one removes it, and neither removes a fresh lock taken meanwhile.

Examples
--------
>>> with OutDirLock("results"):  # doctest: +SKIP
...     run_everything()
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import errno
import json
import logging
import os
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "LOCK_NAME",
    "LockHeldError",
    "OutDirLock",
    "describe",
    "exclusive_run",
    "lock_owner",
    "sigterm_as_exit",
]

log = logging.getLogger(__name__)

LOCK_NAME = ".meanfield.lock"
_TAKEOVER_SUFFIX = ".takeover"
# A lock file that stays empty or unreadable this long was left by a process killed between
# creating it and writing it (that takes microseconds); younger, it is being written right now.
_UNREADABLE_GRACE_S = 10.0
# A takeover guard older than this was left by a process killed during a takeover.
_TAKEOVER_GRACE_S = 30.0


class LockHeldError(RuntimeError):
    """Another live run holds the lock on this output directory."""


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (Linux ``/proc``), ``None`` elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def _pid_exists(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as err:  # ESRCH: no such process; EPERM: exists, owned by another user
        return err.errno != errno.ESRCH
    return True


def _owner_info(command: str | None) -> dict[str, Any]:
    pid = os.getpid()
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "proc_start": _process_start_ticks(pid),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else shlex.join(sys.argv),
        "token": uuid.uuid4().hex,
    }


def _read(path: Path) -> dict[str, Any] | None:
    """The lock's content, ``None`` when it is missing, empty or not JSON."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _is_stale(
    info: dict[str, Any], age: float = 0.0, stale_after: float | None = None
) -> bool | None:
    """``True``: the owner is gone; ``False``: alive; ``None``: cannot tell (another host).

    ``age`` is the seconds since the lock's last heartbeat; on another host the owner counts as
    gone once ``age`` exceeds ``stale_after`` (never when ``stale_after`` is ``None``).
    """
    if info.get("host") != socket.gethostname():
        return True if stale_after is not None and age > stale_after else None
    boot = _boot_id()
    if boot is not None and info.get("boot_id") not in (None, boot):
        return True  # rebooted since: no process of that boot survives
    try:
        pid = int(info.get("pid", -1))
    except (TypeError, ValueError):
        return True
    if not _pid_exists(pid):
        return True
    recorded = info.get("proc_start")
    # the id was reused by a process started later
    return recorded is not None and _process_start_ticks(pid) not in (None, recorded)


def describe(info: dict[str, Any]) -> str:
    """One-line description of a lock's owner."""
    cmd = info.get("command") or "?"
    if len(cmd) > 160:
        cmd = cmd[:157] + "..."
    return (
        f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, "
        f"started {info.get('started', '?')}, command: {cmd}"
    )


def lock_owner(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The owner recorded in ``out_dir``'s lock, or ``None`` when the directory is not locked."""
    return _read(Path(out_dir) / LOCK_NAME)


class OutDirLock:
    """An exclusive lock on an output directory; a context manager.

    Parameters
    ----------
    out_dir : path
        The directory to lock (created if missing).
    command : str, optional
        The command line recorded for other runs to see (default: ``sys.argv``).
    heartbeat : float or None
        Seconds between two refreshes of the lock file's mtime by a daemon thread (default 60;
        ``None``: no heartbeat).
    stale_after : float or None
        A lock written on another host whose mtime is older than this many seconds is stale
        (default 900; ``None``: never take over a lock from another host).

    Raises
    ------
    LockHeldError
        From :meth:`acquire` (or ``with``), when a live run holds the lock, or one on another host
        that cannot be checked. The message is one line naming that run and the lock file.

    Notes
    -----
    The lock is released by :meth:`release`, at the end of a ``with`` block (also when it raises)
    and, as a fallback, at interpreter exit. A process killed outright leaves its lock behind;
    the next run on the same host detects it as stale and takes it over (with a warning).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        *,
        command: str | None = None,
        heartbeat: float | None = 60.0,
        stale_after: float | None = 900.0,
    ) -> None:
        if heartbeat is not None and stale_after is not None and heartbeat * 3 > stale_after:
            raise ValueError("stale_after must be at least three heartbeats")
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_NAME
        self.command = command
        self.heartbeat = heartbeat
        self.stale_after = stale_after
        self.info: dict[str, Any] | None = None
        self.took_over: dict[str, Any] | None = None
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self.info is not None

    def _try_create(self, info: dict[str, Any]) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return True

    def _take_over(self, stale: dict[str, Any] | None) -> None:
        """Remove the stale lock ``stale`` (``None``: an unreadable one), unless it changed."""
        guard = self.path.with_name(self.path.name + _TAKEOVER_SUFFIX)
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _age(guard) > _TAKEOVER_GRACE_S:
                guard.unlink(missing_ok=True)
            return  # another run is taking over right now; the caller tries again
        try:
            current = _read(self.path)
            if stale is None:
                same = current is None
            else:
                same = current is not None and current.get("token") == stale.get("token")
            if same:
                self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)
            guard.unlink(missing_ok=True)

    def acquire(self, *, timeout: float = 5.0) -> OutDirLock:
        """Take the lock or raise :class:`LockHeldError` (``timeout`` bounds races, not waiting)."""
        if self.held:
            return self
        self.out_dir.mkdir(parents=True, exist_ok=True)
        info = _owner_info(self.command)
        deadline = time.monotonic() + timeout
        while True:
            if self._try_create(info):
                self.info = info
                _OBJECTS[id(self)] = self  # released at exit, if still held
                self._start_heartbeat()
                return self
            current = _read(self.path)
            if current is None:
                if not self.path.exists():
                    continue  # released between our attempt and the read
                if _age(self.path) > _UNREADABLE_GRACE_S:
                    log.warning("%s: removing an unreadable lock left by a killed run", self.path)
                    self._take_over(None)
                    continue
            else:
                age = _age(self.path)
                stale = _is_stale(current, age, self.stale_after)
                if stale:
                    log.warning(
                        "%s: taking over a stale lock (%s: %s)",
                        self.out_dir,
                        describe(current),
                        "that process is gone"
                        if current.get("host") == socket.gethostname()
                        else f"no heartbeat for {age:.0f} s",
                    )
                    self.took_over = current
                    self._take_over(current)
                    continue
                if stale is False:
                    where, hint = "is in use by", "wait for it to finish or stop it"
                else:
                    where = "is locked by a run on another host,"
                    hint = f"if that run is over, remove {self.path}"
                raise LockHeldError(f"{self.out_dir} {where} {describe(current)}; {hint}")
            if time.monotonic() > deadline:
                raise LockHeldError(
                    f"{self.out_dir} is being locked by another run ({self.path} is still being "
                    "written); try again"
                )
            time.sleep(0.05)

    def _start_heartbeat(self) -> None:
        if self.heartbeat is None:
            return
        assert self.info is not None, "the heartbeat starts once the lock is held"
        self._stop = threading.Event()
        stop, path, token, period = self._stop, self.path, self.info["token"], self.heartbeat

        def beat() -> None:
            while not stop.wait(period):
                current = _read(path)
                if current is None or current.get("token") != token:
                    return  # no longer ours
                try:
                    os.utime(path)
                except OSError:
                    return

        self._thread = threading.Thread(target=beat, name="meanfield-lock-heartbeat", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Remove the lock if this object still owns it (idempotent)."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            self._thread = None
        if self.info is None:
            return
        current = _read(self.path)
        if current is not None and current.get("token") == self.info["token"]:
            self.path.unlink(missing_ok=True)
        self.info = None
        _OBJECTS.pop(id(self), None)  # no longer released at exit

    def __enter__(self) -> OutDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"OutDirLock({str(self.out_dir)!r}, held={self.held})"


_OBJECTS: dict[int, OutDirLock] = {}


@atexit.register
def _release_all() -> None:
    for lock in list(_OBJECTS.values()):
        if lock.info is not None and lock.info.get("pid") == os.getpid():  # not in a forked child
            lock.release()


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Within the block, ``SIGTERM`` raises ``SystemExit(143)`` (main thread only; else no-op).

    A terminated run then unwinds like an interrupted one: ``with`` blocks close, the lock is
    removed, and the exit status is the usual 128 + 15.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def exclusive_run(out_dir: str | os.PathLike) -> Iterator[OutDirLock]:
    """Hold the lock on ``out_dir`` for a run, with ``SIGTERM`` turned into a clean exit.

    Raises :class:`LockHeldError` at once, naming the run in progress, when another run holds it.
    """
    with sigterm_as_exit(), OutDirLock(out_dir) as lock:
        yield lock
