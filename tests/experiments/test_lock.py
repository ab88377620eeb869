"""The lock on an output directory: exclusive, one-line error, stale takeover, release."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.engine import LockHeldError
from experiments.engine._lock import LOCK_NAME, OutDirLock, lock_owner

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


HOLDER = """
    import sys, time
    from experiments.engine._lock import OutDirLock
    lock = OutDirLock(sys.argv[1], command="holder --out " + sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(120)
"""


def _wait_locked(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "locked", proc.stderr.read()


def test_second_lock_fails_with_one_line_naming_the_owner(tmp_path: Path) -> None:
    with OutDirLock(tmp_path, command="meanfield reproduce --out X"):
        info = lock_owner(tmp_path)
        assert info["pid"] == os.getpid()
        assert info["host"] == socket.gethostname()
        with pytest.raises(LockHeldError) as err:
            OutDirLock(tmp_path).acquire()
        msg = str(err.value)
        assert "\n" not in msg
        assert f"pid {os.getpid()}" in msg
        assert socket.gethostname() in msg
        assert "meanfield reproduce --out X" in msg
        assert info["started"] in msg
    assert not (tmp_path / LOCK_NAME).exists()
    OutDirLock(tmp_path).acquire().release()  # free again


def test_released_on_exception_and_idempotent(tmp_path: Path) -> None:
    lock = OutDirLock(tmp_path)
    with pytest.raises(KeyError):
        with lock:
            assert lock.held and (tmp_path / LOCK_NAME).exists()
            raise KeyError("boom")
    assert not lock.held
    assert not (tmp_path / LOCK_NAME).exists()
    lock.release()  # no-op


def test_creates_missing_directory(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    with OutDirLock(out):
        assert (out / LOCK_NAME).is_file()


def test_live_process_in_another_process_blocks(tmp_path: Path) -> None:
    proc = _python(HOLDER, str(tmp_path))
    try:
        _wait_locked(proc)
        with pytest.raises(LockHeldError, match=f"pid {proc.pid} .*holder --out"):
            OutDirLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait()


def test_stale_lock_of_a_killed_process_is_taken_over(tmp_path: Path, caplog) -> None:
    proc = _python(HOLDER, str(tmp_path))
    _wait_locked(proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stale = lock_owner(tmp_path)
    assert stale is not None and stale["pid"] == proc.pid  # a killed process cannot clean up
    with caplog.at_level("WARNING", logger="experiments.engine._lock"):
        lock = OutDirLock(tmp_path).acquire()
    try:
        assert lock.took_over["token"] == stale["token"]
        assert lock_owner(tmp_path)["pid"] == os.getpid()
        assert "stale lock" in caplog.text and str(proc.pid) in caplog.text
    finally:
        lock.release()


def test_released_at_normal_exit_without_with(tmp_path: Path) -> None:
    code = """
        import sys
        from experiments.engine._lock import OutDirLock
        OutDirLock(sys.argv[1]).acquire()
        print("locked", flush=True)
    """
    proc = _python(code, str(tmp_path))
    _wait_locked(proc)
    assert proc.wait(timeout=60) == 0
    assert not (tmp_path / LOCK_NAME).exists()


def test_reused_pid_is_stale(tmp_path: Path) -> None:
    """Our own pid, but recorded with another process start time: the id was reused."""
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "proc_start": -1,
        "started": "then",
        "command": "old run",
        "token": "t",
    }
    if not Path(f"/proc/{os.getpid()}/stat").exists():
        pytest.skip("needs /proc")
    (tmp_path / LOCK_NAME).write_text(json.dumps(info))
    with OutDirLock(tmp_path) as lock:
        assert lock.took_over["token"] == "t"


def test_other_host_is_not_taken_over(tmp_path: Path) -> None:
    info = {"pid": 1, "host": "elsewhere.invalid", "started": "s", "command": "c", "token": "t"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(info))
    with pytest.raises(LockHeldError, match="another host.*remove"):
        OutDirLock(tmp_path).acquire()
    assert lock_owner(tmp_path)["token"] == "t"


def test_unreadable_lock_waits_then_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    path.write_text("")  # a run killed between creating and writing
    with pytest.raises(LockHeldError, match="being locked"):
        OutDirLock(tmp_path).acquire(timeout=0.2)  # young: being written right now
    old = time.time() - 60
    os.utime(path, (old, old))
    with OutDirLock(tmp_path) as lock:
        assert lock.held


def test_release_never_removes_someone_elses_lock(tmp_path: Path) -> None:
    lock = OutDirLock(tmp_path).acquire()
    other = {**lock_owner(tmp_path), "token": "someone-else"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(other))
    lock.release()
    assert lock_owner(tmp_path)["token"] == "someone-else"


def test_concurrent_acquire_exactly_one_wins(tmp_path: Path) -> None:
    code = """
        import sys, time
        from pathlib import Path
        from experiments.engine._lock import OutDirLock, LockHeldError
        t0 = float(sys.argv[2])
        while time.time() < t0:
            pass
        try:
            OutDirLock(sys.argv[1]).acquire()
        except LockHeldError:
            print("refused", flush=True)
            sys.exit(0)
        print("won", flush=True)
        while not Path(sys.argv[3]).exists():  # hold until the others have answered
            time.sleep(0.01)
    """
    out, release = tmp_path / "out", tmp_path / "release"
    start = str(time.time() + 1.5)
    procs = [_python(code, str(out), start, str(release)) for _ in range(3)]
    try:
        answers = [p.stdout.readline().strip() for p in procs]
    finally:
        release.touch()
        for p in procs:
            p.wait(timeout=60)
    assert sorted(answers) == ["refused", "refused", "won"], answers


def test_other_host_without_heartbeat_is_taken_over(tmp_path: Path) -> None:
    info = {"pid": 1, "host": "elsewhere.invalid", "started": "s", "command": "c", "token": "t"}
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps(info))
    old = time.time() - 20 * 60  # 20 min without a heartbeat
    os.utime(path, (old, old))
    with pytest.raises(LockHeldError, match="another host"):
        OutDirLock(tmp_path, stale_after=None).acquire()  # told never to take one over
    with OutDirLock(tmp_path) as lock:  # default: stale after 15 min
        assert lock.took_over["token"] == "t"
        assert lock_owner(tmp_path)["host"] == socket.gethostname()


def test_heartbeat_refreshes_the_lock_until_released(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    lock = OutDirLock(tmp_path, heartbeat=0.05, stale_after=1.0).acquire()
    old = time.time() - 100
    os.utime(path, (old, old))
    deadline = time.monotonic() + 10
    while path.stat().st_mtime < old + 50 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.stat().st_mtime > time.time() - 10  # refreshed
    thread = lock._thread
    lock.release()
    thread.join(timeout=5)
    assert not thread.is_alive() and not path.exists()
    with pytest.raises(ValueError, match="three heartbeats"):
        OutDirLock(tmp_path, heartbeat=60, stale_after=100)


def test_sigterm_unwinds_and_releases(tmp_path: Path) -> None:
    code = """
        import sys, time
        from experiments.engine._lock import OutDirLock, sigterm_as_exit
        with sigterm_as_exit(), OutDirLock(sys.argv[1]):
            print("locked", flush=True)
            time.sleep(120)
    """
    proc = _python(code, str(tmp_path))
    _wait_locked(proc)
    assert (tmp_path / LOCK_NAME).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert not (tmp_path / LOCK_NAME).exists()
