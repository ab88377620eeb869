"""``--scheduler`` against a cluster of separate processes: a worker killed mid-run loses nothing.

The recipe of docs/cluster.md ("On a cluster with an existing scheduler"), on the loopback
interface: ``dask scheduler`` and two ``dask worker`` processes started from the command line,
each worker in its own working directory, with its own environment and its own process group,
then ``meanfield experiment real_data --scheduler ADDRESS``. One worker (its whole process group:
nanny and worker) is killed with SIGKILL while it holds points and after the first record is on
disk. The run must still end, exit 0, and write every point once, with the records of a serial
run.

Every process (driver, scheduler, workers, serial run) runs with OMP/MKL/OPENBLAS_NUM_THREADS=1
(the nanny of ``dask worker`` sets these to 1 in its worker anyway) and the tiny preset runs each
real-data point on one torch thread (``threads = 1``): the thread counts are those of the serial
run wherever a point runs, so the records must be equal float for float, not only close.

Every Dask process listens on 127.0.0.1 only (checked), and every process is killed in a
``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.engine import load_jsonl
from experiments.engine._lock import LOCK_NAME

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's console scripts: dask, meanfield

# Real-data points of the tiny preset's random GPT-2 layer, 2 windows each: about a second per
# point once a worker has loaded the model, long enough to kill a worker while it holds one.
N_GRID = "[12,16,20,24,28,32]"
STAGE_ARGS = ["experiment", "real_data", "--preset", "tiny", "--set", f"n_grid={N_GRID}"]
STAGE_ARGS += ["--no-progress", "--json"]
SWEEP = Path("real_data") / "gpt2rand2L-L1__kjv__short.jsonl"
N_POINTS = 6

START_TIMEOUT = 120  # scheduler file written, both workers registered (2 shared cores)
RUN_TIMEOUT = 400  # each meanfield command


def _env(scratch: Path, **extra: str) -> dict[str, str]:
    """This environment with one thread per numerical pool and no inherited thread cap.

    Dask's scratch files go under ``scratch`` (not the shared ``/tmp/dask-scratch-space``).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_NUM_THREADS") and k != "MEANFIELD_MAX_THREADS"
    }
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        OMP_WAIT_POLICY="PASSIVE",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MPLBACKEND="Agg",
        DASK_TEMPORARY_DIRECTORY=str(scratch),
    )
    env.update(extra)
    return env


def _meanfield() -> list[str]:
    """The installed ``meanfield`` console script, else the module."""
    script = BIN / "meanfield"
    return [str(script)] if script.exists() else [sys.executable, "-m", "meanfield_cli"]


def _start(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own session (process group id = its pid).

    Its stdout goes to ``log``, its stderr to ``log`` + ``.err``.
    """
    with open(log, "wb") as out, open(f"{log}.err", "wb") as err:
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True
        )


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (it leads it) and reap ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignored
        pass


def _tail(log: Path, n: int = 3000) -> str:
    """The end of a process's stderr and stdout, for failure messages."""
    return "".join(
        p.read_text(errors="replace")[-n:] for p in (Path(f"{log}.err"), log) if p.exists()
    )


def _lines(root: Path) -> int:
    """Complete JSONL lines under ``root`` (the records written so far)."""
    return sum(p.read_bytes().count(b"\n") for p in root.rglob("*.jsonl"))


def _listening(pid: int) -> list[str]:
    """Addresses on which the process ``pid`` and its children listen (TCP and UDP)."""
    import psutil  # a dependency of distributed

    proc = psutil.Process(pid)
    found = []
    for p in [proc, *proc.children(recursive=True)]:
        try:
            conns = (getattr(p, "net_connections", None) or p.connections)(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        found += [c.laddr.ip for c in conns if c.status in (psutil.CONN_LISTEN, psutil.CONN_NONE)]
    return found


def _records(path: Path) -> dict[str, dict]:
    """Key -> record without its timings; asserts that no point was recorded twice."""
    recs = load_jsonl(path)
    by_key = {r["key"]: {k: v for k, v in r.items() if not k.startswith("seconds")} for r in recs}
    assert len(by_key) == len(recs), f"{path}: a point recorded twice"
    return by_key


@pytest.mark.slow  # 75-130 s on 2 shared cores: the run on Dask, then the serial run
def test_scheduler_cli_with_a_worker_killed_mid_run(tmp_path: Path) -> None:
    """dask scheduler + 2 dask workers (CLI); one killed while it holds points; nothing lost."""
    pytest.importorskip("dask")
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("psutil")
    dask_cli = BIN / "dask"
    if not dask_cli.exists():
        pytest.skip(f"no dask command next to {sys.executable}")

    sched_dir, drv_dir = tmp_path / "scheduler", tmp_path / "driver"
    wdirs = {name: tmp_path / f"worker-{name}" for name in ("a", "b")}
    for d in (sched_dir, drv_dir, *wdirs.values()):
        d.mkdir()
    out, ref = tmp_path / "dist", tmp_path / "serial"
    sched_file = sched_dir / "scheduler.json"
    procs: dict[str, subprocess.Popen] = {}
    client = None
    t0 = time.monotonic()
    try:
        # -- the scheduler: loopback only, a free port, health/metrics on a free loopback port
        procs["scheduler"] = _start(
            [str(dask_cli), "scheduler", "--host", "127.0.0.1", "--port", "0"]
            + ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]
            + ["--scheduler-file", str(sched_file), "--idle-timeout", "600"],
            sched_dir,
            _env(tmp_path),
            sched_dir / "log",
        )
        address = None
        deadline = time.monotonic() + START_TIMEOUT
        while address is None:
            assert procs["scheduler"].poll() is None, _tail(sched_dir / "log")
            assert time.monotonic() < deadline, "no scheduler file\n" + _tail(sched_dir / "log")
            try:
                address = json.loads(sched_file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
        assert address.startswith("tcp://127.0.0.1:"), address

        # -- two workers, each in its own directory, environment and process group
        for name, wdir in wdirs.items():
            procs[name] = _start(
                [str(dask_cli), "worker", address, "--host", "127.0.0.1", "--nthreads", "1"]
                + ["--no-dashboard", "--dashboard-address", "127.0.0.1:0", "--name", name]
                + ["--local-directory", str(wdir), "--death-timeout", "60"],
                wdir,
                _env(tmp_path, MEANFIELD_TEST_WORKER=name),
                wdir / "log",
            )
        client = distributed.Client(address, timeout=60, set_as_default=False)
        client.wait_for_workers(2, timeout=START_TIMEOUT)

        def whoami():
            import os

            return (
                os.getpid(),
                os.getcwd(),
                os.environ.get("MEANFIELD_TEST_WORKER"),
                {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
            )

        addr = {}
        for a, (pid, cwd, marker, threads) in client.run(whoami).items():
            assert Path(cwd) == wdirs[marker], (marker, cwd)  # its own directory, environment
            assert os.getpgid(pid) == procs[marker].pid  # in the group we started
            assert threads == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            addr[marker] = a
        assert sorted(addr) == ["a", "b"]
        for name in ("scheduler", "a", "b"):  # nothing listens beyond the loopback interface
            ips = _listening(procs[name].pid)
            assert ips and set(ips) == {"127.0.0.1"}, (name, ips)
        t_cluster = time.monotonic() - t0

        # -- the run, through the real command line
        client.get_task_stream()  # the scheduler records which worker computed what from now
        driver_cmd = [*_meanfield(), *STAGE_ARGS, "--out", str(out), "--scheduler", address]
        procs["driver"] = _start(driver_cmd, drv_dir, _env(tmp_path), drv_dir / "log")
        drv_out = drv_dir / "log"

        def points_by(stream, worker):  # the point tasks (execution.py: "point-<run>-<rank>")
            return [
                t["key"] for t in stream if t["worker"] == worker and t["key"].startswith("point-")
            ]

        # -- kill worker b (nanny and worker: its whole group) once a record is on disk, b has
        # computed a point and holds another; the scheduler says which points b holds
        victim, held, n_at_kill = addr["b"], (), 0
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            assert procs["driver"].poll() is None, (
                "the run ended before worker b could be killed mid-run\n" + _tail(drv_out)
            )
            assert time.monotonic() < deadline, "no record, or b held no point\n" + _tail(drv_out)
            n_at_kill = _lines(out)
            if n_at_kill >= 1 and points_by(client.get_task_stream(), victim):
                held = client.processing(workers=[victim]).get(victim, ())
                if held:
                    os.killpg(procs["b"].pid, signal.SIGKILL)
                    break
            time.sleep(0.05)
        procs["b"].wait(timeout=30)
        assert 1 <= n_at_kill < N_POINTS

        # -- the run ends, on worker a alone
        try:
            code = procs["driver"].wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail("the run did not end after worker b was killed\n" + _tail(drv_out))
        assert code == 0, _tail(drv_out)
        t_run = time.monotonic() - t0 - t_cluster

        # the scheduler dropped b; a computed the points that b held when it was killed
        stream = client.get_task_stream()
        assert list(
            client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.workers))
        ) == [addr["a"]]
        by_a, by_b = points_by(stream, addr["a"]), points_by(stream, addr["b"])
        lost = set(held) - set(by_b)  # held and not finished by b: in flight when it died
        assert lost, f"b finished {held} before it was killed: no point in flight"
        assert lost <= set(by_a), (lost, by_a)
        assert by_b  # b computed points before it was killed: records from both are compared
    finally:
        if client is not None:
            client.close()
        for proc in procs.values():
            _kill_group(proc)

    ex = json.loads(drv_out.read_text())["execution"]  # --json: the command's document
    assert ex["rounds"] >= 1 and len(ex["per_worker"]) == 2  # both workers returned points
    assert sum(w["tasks"] for w in ex["per_worker"].values()) >= N_POINTS

    # -- the serial run of the same command, same thread settings
    t1 = time.monotonic()
    serial = subprocess.run(
        [*_meanfield(), *STAGE_ARGS, "--out", str(ref)],
        cwd=drv_dir,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert serial.returncode == 0, serial.stderr[-3000:]
    t_serial = time.monotonic() - t1

    got, want = _records(out / SWEEP), _records(ref / SWEEP)
    assert len(want) == N_POINTS
    assert got.keys() == want.keys()  # every point, none twice (checked in _records)
    assert _lines(out) == N_POINTS  # and no other line, torn or not
    assert got == want  # float for float: the same thread counts everywhere
    for name in ("windows.csv", "fits.csv", "manifest.json"):  # what the stage made of them
        assert (out / "real_data" / name).read_bytes() == (ref / "real_data" / name).read_bytes()
    assert not (out / LOCK_NAME).exists()  # released
    print(
        f"cluster up {t_cluster:.1f} s, run {t_run:.1f} s, serial {t_serial:.1f} s; "
        f"b killed holding {len(held)} point(s) ({len(lost)} in flight) with {n_at_kill}/{N_POINTS} records on disk; "
        f"points computed by a: {len(by_a)}, by b: {len(by_b)}"
    )
