"""Executors and the single-writer driver: cost order, serial = Dask, killed worker and driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import experiments.engine._execution as execution
from experiments import engine
from experiments.engine import (
    CostProgress,
    Outcome,
    PointError,
    SerialExecutor,
    Sweep,
    SweepJob,
    Task,
    load_jsonl,
    make_executor,
    point_key,
    run_jobs,
    worker_cache,
)
from experiments.engine._tasks import default_cost, order_by_cost

ROOT = Path(__file__).resolve().parents[2]


# ---- toy tasks: top-level, pure, deterministic ---------------------------------------------
def toy_point(config):
    """A small deterministic float64 computation depending on every key of the point."""
    rng = np.random.default_rng(config["seed"])
    x = rng.standard_normal((config["n"], config["d"]))
    s = x @ x.T / np.sqrt(config["d"])
    s = s - s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    return {"value": float(np.linalg.norm(p @ x)), "trace": float(np.trace(p))}


def torch_point(config):
    """A meanfield computation in float64 on one torch thread, as the stages run their points."""
    import torch

    from experiments.engine import torch_threads
    from meanfield.attention import self_attention
    from meanfield.params import AttentionParams

    with torch_threads(1):
        g = torch.Generator().manual_seed(config["seed"])
        n, d = config["n"], config["d"]
        X = torch.randn(n, d, generator=g, dtype=torch.float64)
        A = torch.randn(d, d, generator=g, dtype=torch.float64) / d
        V = torch.randn(d, d, generator=g, dtype=torch.float64)
        Y = self_attention(X, AttentionParams(A=A, V=V), masked=bool(config["seed"] % 2))
        return {"norm": float(Y.norm()), "first": Y[0].tolist()}


def cached_point(config):
    before = execution.CACHE_STATS["misses"]
    model = worker_cache(("model", config["model"]), lambda: {"w": np.arange(3.0)})
    return {
        "pid": os.getpid(),
        "loaded": execution.CACHE_STATS["misses"] > before,
        "w": float(model["w"].sum()),
    }


def loading_point(config):
    """Loads (timed by ``engine.loading``) for ``config["load"]`` seconds, then computes."""

    def load():
        with engine.loading():
            time.sleep(config["load"])
        return {"w": 1.0}

    worker_cache(("slow", config["model"]), load)
    return {"pid": os.getpid(), **toy_point(config)}


def die_once(config):
    """Kill this worker process the first time (marker file absent), then compute."""
    marker = Path(config["marker"])
    if not marker.exists():
        marker.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return toy_point(config)


def always_die(config):
    os.kill(os.getpid(), signal.SIGKILL)


def failing_point(config):
    if config["n"] == 3:
        raise ValueError("bad\npoint")
    return toy_point(config)


def _points(seed0=0):
    return [{"n": n, "d": d, "seed": seed0 + 10 * n + d} for n in (2, 3, 5, 8) for d in (2, 4)]


def _jobs(out: Path, fn=toy_point, **cfg):
    return [
        SweepJob(Sweep(out, "alpha", {"what": "alpha", **cfg}), _points(0), fn),
        SweepJob(Sweep(out, "beta", {"what": "beta", **cfg}), _points(100)[:5], fn),
    ]


def _records(out: Path) -> dict[str, dict]:
    """Records of every sweep by (sweep, key), without the wall time."""
    got = {}
    for name in ("alpha", "beta"):
        for r in load_jsonl(out / f"{name}.jsonl"):
            key = (name, r["key"])
            assert key not in got, f"duplicate record {key}"
            got[key] = {k: v for k, v in r.items() if k != "seconds"}
    return got


# ---- cost model and order ------------------------------------------------------------------
def test_default_cost_and_override() -> None:
    assert default_cost({"n": 3, "d": 4, "windows": 5}) == 3 * 3 * 4 * 5
    assert default_cost({"n": 3}) == 9.0
    assert default_cost({"name": "x", "d": "wide"}) == 1.0
    assert Task("k", toy_point, {"n": 10, "d": 2}, cost=0.5).effective_cost == 0.5


def test_order_by_cost_largest_first_stable() -> None:
    tasks = [Task(str(i), toy_point, {"n": n, "d": 1}) for i, n in enumerate([2, 8, 4, 8, 1])]
    assert [t.key for t in order_by_cost(tasks)] == ["1", "3", "2", "0", "4"]
    ex = SerialExecutor()
    seen = [o.task.key for o in ex.map_unordered(tasks)]
    assert seen == ex.submitted == ["1", "3", "2", "0", "4"]


def test_one_queue_across_sweeps(tmp_path: Path) -> None:
    ex = SerialExecutor()
    jobs = _jobs(tmp_path)
    run_jobs(jobs, ex)
    cost_of = {
        f"{job.sweep.name}/{point_key(job.sweep.digest, p)}": default_cost(p)
        for job in jobs
        for p in job.points
    }
    costs = [cost_of[k] for k in ex.submitted]
    assert len(costs) == 13 and costs == sorted(costs, reverse=True)
    groups = [k.split("/")[0] for k in ex.submitted]
    # the sweeps interleave: beta's largest point runs before alpha's smallest ones
    assert groups.index("beta") < max(i for i, g in enumerate(groups) if g == "alpha")


def test_predict_wall_time() -> None:
    from experiments.engine import predict_wall_time

    one = predict_wall_time([4, 3, 2, 1], workers=1, rate=2.0, warmup=5.0)
    assert one["wall"] == 5.0 + 5.0 and one["tail"] == 0.0 and one["efficiency"] == 1.0
    # largest first on 2 workers: [4, 1] and [3, 2] -> makespan 5 cost = 2.5 s, perfectly even
    two = predict_wall_time([1, 2, 3, 4], workers=2, rate=2.0)
    assert two["wall"] == 2.5 and two["tail"] == 0.0
    # the classic LPT case: 3,3,2,2,2 on 2 workers -> [3,2,2] and [3,2]: 7 against 6 ideal
    lpt = predict_wall_time([3, 3, 2, 2, 2], workers=2, rate=1.0)
    assert lpt["wall"] == 7.0 and lpt["work"] == 6.0 and lpt["tail"] == 1.0
    assert lpt["efficiency"] == pytest.approx(6 / 7)
    # one huge point: the others cannot help
    big = predict_wall_time([100, 1, 1], workers=4, rate=1.0)
    assert big["wall"] == 100.0 and big["efficiency"] == pytest.approx(102 / 400)
    with pytest.raises(ValueError):
        predict_wall_time([1], workers=0, rate=1.0)


def test_measured_rate(tmp_path: Path) -> None:
    from experiments.engine import measured_rate

    recs = [
        {"point": {"n": 2, "d": 3}, "seconds": 2.0},
        {"point": {"n": 4, "d": 1}, "seconds": 1.0},
    ]
    assert measured_rate(recs) == pytest.approx((12 + 16) / 3.0)
    assert measured_rate(recs, cost=lambda p: 1.0) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        measured_rate([])


# ---- the serial driver ---------------------------------------------------------------------
def test_driver_records_match_sweep_run(tmp_path: Path) -> None:
    """run_jobs writes what Sweep.run writes (apart from the wall time and the line order)."""
    a, b = tmp_path / "a", tmp_path / "b"
    summary = run_jobs(_jobs(a), SerialExecutor())
    assert summary.computed == 13 and summary.skipped == 0 and not summary.lost
    for job in _jobs(b):
        job.sweep.run(job.points, job.fn, progress=False)
    assert _records(a) == _records(b)
    # and Sweep sees the driver's records as finished
    for job in _jobs(a):
        assert job.sweep.done() == {point_key(job.sweep.digest, p) for p in job.points}


def test_resume_skips_done_and_reports_progress(tmp_path: Path) -> None:
    import io

    jobs = _jobs(tmp_path)
    first = SweepJob(jobs[0].sweep, jobs[0].points[:3], toy_point)
    run_jobs([first], SerialExecutor())
    out = io.StringIO()
    prog = CostProgress(desc="t", stream=out, tty=False)
    summary = run_jobs(_jobs(tmp_path), SerialExecutor(), progress=prog)
    assert summary.skipped == 3 and summary.computed == 10
    assert prog.done_points == prog.total_points == 13
    assert prog.fraction() == 1.0
    assert "stage alpha done, 8 points (3 already done)" in out.getvalue()
    assert len(_records(tmp_path)) == 13


def test_point_error_raises_or_is_recorded(tmp_path: Path) -> None:
    with pytest.raises(PointError, match=r"point .*'n': 3.* ValueError: bad point$"):
        run_jobs(_jobs(tmp_path / "r", fn=failing_point), SerialExecutor())
    summary = run_jobs(_jobs(tmp_path / "c", fn=failing_point), SerialExecutor(), on_error="record")
    assert len(summary.errors) == 2 + 2  # n == 3 with d in (2, 4), in both sweeps
    assert all("Traceback" in o.traceback for o in summary.errors)
    assert summary.computed == 13 - 4


def test_context_joins_the_task_config_not_the_record(tmp_path: Path) -> None:
    sweep = Sweep(tmp_path, "alpha", {"what": "ctx"})
    pts = [{"n": 2, "d": 3}, {"n": 4, "d": 2}]
    run_jobs([SweepJob(sweep, pts, toy_point, context={"seed": 7})], SerialExecutor())
    recs = sweep.records()
    # records keep the points alone, appended largest cost first: (4, 2) then (2, 3)
    assert [r["point"] for r in recs] == [pts[1], pts[0]]
    for r in recs:
        assert r["key"] == point_key(sweep.digest, r["point"])
        assert r["value"] == toy_point({**r["point"], "seed": 7})["value"]
    with pytest.raises(ValueError, match="share the key"):
        run_jobs([SweepJob(Sweep(tmp_path, "b", {}), pts, toy_point, context={"n": 1})])


def test_worker_cache_loads_once_per_process() -> None:
    execution.clear_worker_cache()
    tasks = [Task(str(i), cached_point, {"model": i % 2}) for i in range(6)]
    out = list(SerialExecutor().map_unordered(tasks))
    assert sum(o.value["loaded"] for o in out) == 2
    assert execution.CACHE_STATS == {"hits": 4, "misses": 2}


def test_load_time_is_told_apart_from_the_work() -> None:
    """call_task reports the seconds spent in loading(); the executor sums them per worker."""
    execution.clear_worker_cache()
    ex = SerialExecutor()
    tasks = [
        Task(str(i), loading_point, {"model": i % 2, "load": 0.05, "n": 2, "d": 3, "seed": i})
        for i in range(4)
    ]
    out = {o.task.key: o for o in ex.map_unordered(tasks)}
    assert all(o.ok for o in out.values())
    loaded = [o for o in out.values() if o.load_seconds > 0]
    assert len(loaded) == 2  # one load per model, in the first task that needs it
    assert all(0.05 <= o.load_seconds <= o.seconds for o in loaded)
    times = ex.times.as_dict()
    ((worker, w),) = times["per_worker"].items()
    assert worker == f"pid {os.getpid()}" and w["tasks"] == 4
    assert w["load_seconds"] == pytest.approx(sum(o.load_seconds for o in out.values()))
    assert times["warmup_seconds"] == pytest.approx(w["load_seconds"])  # no start, no imports
    assert times["task_seconds"] == pytest.approx(sum(o.seconds for o in out.values()))


def test_torn_record_repaired_and_killed_driver_resumes(tmp_path: Path) -> None:
    """A driver killed (SIGKILL) mid-run, plus a torn last line, then a rerun: every point once."""
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from experiments.engine import SerialExecutor, SweepJob, run_jobs
        from experiments.engine import Sweep
        from tests.experiments.test_execution import _jobs, toy_point

        def slow_point(config):
            time.sleep(float(sys.argv[2]))
            return toy_point(config)

        jobs = [SweepJob(j.sweep, j.points, slow_point) for j in _jobs(sys.argv[1])]
        run_jobs(jobs, SerialExecutor())
        print("finished", flush=True)
    """)
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(out), "0.4"], env=env)
    deadline = time.monotonic() + 60
    while len(load_jsonl(out / "alpha.jsonl")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(load_jsonl(out / "alpha.jsonl")) + len(load_jsonl(out / "beta.jsonl"))
    assert 3 <= n_before < 13
    with open(out / "alpha.jsonl", "a") as fh:  # a record cut by a crash
        fh.write('{"key": "torn", "config_hash": "')
    done = subprocess.run(
        [sys.executable, str(script), str(out), "0"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "removed an unfinished record" in done.stderr
    ref = tmp_path / "ref"
    run_jobs(_jobs(ref), SerialExecutor())
    assert _records(out) == _records(ref)  # every point exactly once, same values


def test_executor_choice_and_missing_dask(monkeypatch) -> None:
    assert isinstance(make_executor(), SerialExecutor)
    assert isinstance(make_executor(workers=1), SerialExecutor)
    with pytest.raises(ValueError, match="not both"):
        make_executor(workers=2, scheduler="tcp://127.0.0.1:1")
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the extra were absent
    with pytest.raises(ImportError, match=r"meanfield\[dist\]") as err:
        make_executor(workers=2)
    assert "\n" not in str(err.value)


def test_outcome_ok() -> None:
    t = Task("k", toy_point, {})
    assert Outcome(t, "ok", value={}).ok and not Outcome(t, "lost").ok


# ---- Dask ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dask2_cluster(dask_by_value):
    ex = engine.DaskExecutor(workers=2, allowed_failures=1)
    try:
        yield ex
    finally:
        ex.close()


@pytest.fixture
def dask2(dask2_cluster):
    """The module's 2-worker cluster, with both workers up (a test before may have killed one)."""
    dask2_cluster.client.wait_for_workers(2, timeout=60)
    return dask2_cluster


def test_dask_local_cluster_is_loopback_without_dashboard(dask2) -> None:
    info = dask2.client.scheduler_info()
    assert dask2.workers == 2
    assert info["address"].startswith("tcp://127.0.0.1:")
    assert all(w.startswith("tcp://127.0.0.1:") for w in info["workers"])
    # Without a dashboard, the scheduler still serves health and metrics over HTTP: loopback too
    from distributed.comm import get_tcp_server_addresses

    http = get_tcp_server_addresses(dask2.cluster.scheduler.http_server)
    assert http and all(host == "127.0.0.1" for host, _ in http)
    assert "/status" not in {r[0] for r in dask2.cluster.scheduler.http_application.applications}


def test_dask_records_bit_identical_to_serial(tmp_path: Path, dask2) -> None:
    serial_ex = SerialExecutor()
    run_jobs(_jobs(tmp_path / "serial"), serial_ex)
    summary = run_jobs(_jobs(tmp_path / "dask"), dask2)
    assert summary.computed == 13 and not summary.lost and not summary.errors
    assert dask2.submitted == serial_ex.submitted  # the same one queue, largest cost first
    serial, dask = _records(tmp_path / "serial"), _records(tmp_path / "dask")
    assert len(serial) == 13
    assert serial == dask  # exact: the same function on the same point, floats bit for bit
    # the same with torch and meanfield in the workers
    run_jobs(_jobs(tmp_path / "serial_t", fn=torch_point), serial_ex)
    run_jobs(_jobs(tmp_path / "dask_t", fn=torch_point), dask2)
    serial, dask = _records(tmp_path / "serial_t"), _records(tmp_path / "dask_t")
    assert len(serial) == 13 and serial == dask


def test_dask_worker_cache_once_per_worker(dask2) -> None:
    tasks = [Task(str(i), cached_point, {"model": "m"}, cost=1.0) for i in range(12)]
    out = list(dask2.map_unordered(tasks))
    assert all(o.ok for o in out)
    by_pid: dict[int, int] = {}
    for o in out:
        by_pid[o.value["pid"]] = by_pid.get(o.value["pid"], 0) + o.value["loaded"]
    assert all(v <= 1 for v in by_pid.values())
    assert os.getpid() not in by_pid  # ran in the workers, not in the driver


def test_dask_warmup_is_timed_per_worker(dask2) -> None:
    """Start, imports on every worker and each worker's loads are recorded apart from the work."""
    tasks = [
        Task(
            str(i), loading_point, {"model": "m", "load": 0.2, "n": 2, "d": 3, "seed": i}, cost=1.0
        )
        for i in range(8)
    ]
    out = list(dask2.map_unordered(tasks))
    assert all(o.ok for o in out), [o.error for o in out]
    times = dask2.times.as_dict()
    assert times["start_seconds"] > 0
    assert len(times["import_seconds"]) == 2  # timed on both workers before the first task
    pids = {f"pid {o.value['pid']}" for o in out}
    for pid in pids:  # each worker that ran a task loaded the model once, in its first task
        mine = [o for o in out if o.worker == pid]
        assert sum(o.load_seconds > 0 for o in mine) == 1
        assert times["per_worker"][pid]["load_seconds"] >= 0.2
    assert times["warmup_seconds"] >= times["start_seconds"] + 0.2


def test_dask_worker_killed_mid_run_is_retried(tmp_path: Path, dask2) -> None:
    jobs = _jobs(tmp_path / "out", fn=die_once, marker=str(tmp_path / "marker"))
    for job in jobs:
        job.points = [{**p, "marker": str(tmp_path / "marker")} for p in job.points]
    summary = run_jobs(jobs, dask2)
    assert (tmp_path / "marker").exists()  # a worker did die
    assert summary.computed == 13 and not summary.lost
    ref_jobs = _jobs(tmp_path / "ref", marker=str(tmp_path / "marker"))
    for job in ref_jobs:
        job.points = [{**p, "marker": str(tmp_path / "marker")} for p in job.points]
    run_jobs(ref_jobs, SerialExecutor())  # marker exists: die_once computes directly
    assert _records(tmp_path / "out") == _records(tmp_path / "ref")


def test_dask_point_that_kills_every_worker_is_lost_then_resumed(tmp_path: Path, dask2) -> None:
    sweep = Sweep(tmp_path / "out", "alpha", {"what": "deadly"})
    summary = run_jobs([SweepJob(sweep, [{"n": 50, "d": 50, "seed": 0}], always_die)], dask2)
    # allowed_failures=1: killed two workers, then given up and reported, not written
    assert summary.computed == 0 and len(summary.lost) == 1
    assert "KilledWorker" in summary.lost[0].error
    assert load_jsonl(sweep.path) == []
    # the nannies restart the workers; the rest of the sweep then completes
    fine = _points(0)[:4]
    summary = run_jobs([SweepJob(sweep, fine, toy_point)], dask2)
    assert summary.computed == 4 and not summary.lost
    assert len(sweep.records()) == 4


def test_dask_scheduler_address_route(tmp_path: Path, dask2) -> None:
    """Connect to a running scheduler by address (here: the local cluster's)."""
    with engine.make_executor(scheduler=dask2.cluster.scheduler_address) as ex:
        assert isinstance(ex, engine.DaskExecutor) and ex.cluster is None
        assert ex.workers == 2
        summary = run_jobs(_jobs(tmp_path / "remote"), ex)
    assert summary.computed == 13
    run_jobs(_jobs(tmp_path / "serial"), SerialExecutor())
    assert _records(tmp_path / "remote") == _records(tmp_path / "serial")
    assert dask2.client.status == "running"  # closing that client left the cluster up


def verify_bounds_point(config):
    """The bound-verification stage's point function, as a top-level task."""
    from experiments.verify_bounds.checks import check_instance, registry_specs

    return check_instance(config["seed"], config["index"], config["kind"], registry_specs(None))


def test_dask_real_stage_points_bit_identical(tmp_path: Path, dask2) -> None:
    """Bound-verification instances: the stage's own serial sweep against Dask through run_jobs."""
    from experiments.verify_bounds import KINDS, verify
    from experiments.verify_bounds.checks import registry_specs
    from experiments.verify_bounds.sweep import HARNESS_VERSION, _schedule

    seed, n = 5, 8
    verify(n_instances=n, seed=seed, progress=False, sweep_dir=tmp_path / "serial")
    config = {
        "harness_version": HARNESS_VERSION,
        "seed": seed,
        "bounds": [s.name for s in registry_specs(None)],
    }
    sweep = Sweep(tmp_path / "dask", "instances", config, seed=seed, device="cpu", dtype="float64")
    points = _schedule(n, KINDS)
    job = SweepJob(sweep, points, verify_bounds_point, context={"seed": seed})
    summary = run_jobs([job], dask2)
    assert summary.computed == n
    serial = Sweep(tmp_path / "serial", "instances", config).records()
    strip = lambda r: {k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
    assert sorted(map(json.dumps, map(strip, serial))) == sorted(
        map(json.dumps, map(strip, sweep.records()))
    )
    assert len(serial) == n and all(r["checks"] for r in serial)
