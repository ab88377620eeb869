"""Thread caps of the workers: workers × threads ≤ cores, unless OMP_NUM_THREADS is set."""

from __future__ import annotations

import os

import pytest
import torch

from experiments import engine
from experiments.engine import Task, torch_threads
from experiments.engine._threads import MAX_THREADS_ENV, blas_threads, thread_cap, worker_thread_cap


def test_worker_thread_cap_shares_the_cores() -> None:
    assert worker_thread_cap(2, cores=2, environ={}) == 1
    assert worker_thread_cap(4, cores=16, environ={}) == 4
    assert worker_thread_cap(3, cores=16, environ={}) == 5  # 3 x 5 <= 16
    assert worker_thread_cap(8, cores=2, environ={}) == 1  # at least one
    assert worker_thread_cap(2, cores=16, environ={"OMP_NUM_THREADS": "6"}) is None  # respected
    assert worker_thread_cap(2, cores=16, environ={"OMP_NUM_THREADS": ""}) == 8  # empty: unset


def test_torch_threads_under_a_cap(monkeypatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    assert thread_cap() is None
    with torch_threads(3):
        assert torch.get_num_threads() == 3
    monkeypatch.setenv(MAX_THREADS_ENV, "2")
    assert thread_cap() == 2
    with torch_threads(3):
        assert torch.get_num_threads() == 2  # capped
    with torch_threads(1):
        assert torch.get_num_threads() == 1  # below the cap: as asked
    torch.set_num_threads(4)
    try:
        with torch_threads(None):
            assert torch.get_num_threads() == 2  # "leave it" still respects the cap
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv(MAX_THREADS_ENV, "zero")
    assert thread_cap() is None


def _blas_counts() -> list[int]:
    """Thread counts of the BLAS libraries numpy and scipy loaded (OpenBLAS here)."""
    import numpy as np
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_info

    np.linalg.norm(np.eye(3), 2)
    counts = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    if not counts:
        pytest.skip("no BLAS library that threadpoolctl can see")
    return counts


def test_points_run_numpy_blas_on_the_torch_thread_count(monkeypatch) -> None:
    """numpy's OpenBLAS follows torch_threads (its busy-waiting threads cost 3-8x the CPU)."""
    import numpy as np

    monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    before = _blas_counts()
    with torch_threads(1):
        assert _blas_counts() == [1] * len(before)
        assert np.linalg.norm(np.diag([3.0, 1.0]), 2) == 3.0  # numpy still computes
    assert _blas_counts() == before  # restored
    with torch_threads(None):
        assert _blas_counts() == before  # None leaves it alone
    monkeypatch.setenv(MAX_THREADS_ENV, "1")
    with blas_threads(8):
        assert _blas_counts() == [1] * len(before)  # the worker's cap holds for BLAS too
    assert _blas_counts() == before


def report_threads(config):
    """What a worker runs a 2-thread point (as the adversarial stage's) and a default one on."""
    import torch

    from experiments.engine import torch_threads

    with torch_threads(2):
        two = torch.get_num_threads()
    with torch_threads(None):
        default = torch.get_num_threads()
    return {
        "two": two,
        "default": default,
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "cap": os.environ.get(MAX_THREADS_ENV),
    }


def worker_pid(config):
    return {"pid": os.getpid()}


def _reports(ex):
    tasks = [Task(str(i), report_threads, {}, cost=1.0) for i in range(4)]
    out = list(ex.map_unordered(tasks))
    assert all(o.ok for o in out), [o.error for o in out]
    return [o.value for o in out]


def malloc_trim(config):
    return {"trim": os.environ.get("MALLOC_TRIM_THRESHOLD_")}


def test_local_workers_are_capped_to_their_share_of_the_cores(dask_by_value, monkeypatch) -> None:
    cap = max(1, (os.cpu_count() or 1) // 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with engine.DaskExecutor(workers=2) as ex:
        # not Dask's MALLOC_TRIM_THRESHOLD_=65536 (pages faulted in again on every product)
        trims = list(ex.map_unordered([Task(str(i), malloc_trim, {}, cost=1.0) for i in range(4)]))
        assert [o.value for o in trims] == [{"trim": None}] * 4
        assert ex.max_threads == cap and f"max_threads={cap}" in repr(ex)
        for r in _reports(ex):
            assert r == {"two": min(2, cap), "default": cap, "omp": str(cap), "cap": str(cap)}
        # a stage's calls before its round (StageRun.remote) stay on one worker process
        calls = [ex.call(worker_pid, {}) for _ in range(4)]
        assert all(o.ok for o in calls) and len({o.value["pid"] for o in calls}) == 1
        assert calls[0].value["pid"] != os.getpid()


@pytest.mark.slow
def test_local_workers_keep_an_explicit_omp_setting(dask_by_value, monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's choice: no cap
    with engine.DaskExecutor(workers=2) as ex:
        assert ex.max_threads is None
        for r in _reports(ex):
            assert r == {"two": 2, "default": 1, "omp": "1", "cap": None}
