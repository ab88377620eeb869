"""Thread counts of a point: torch's and numpy's, restored afterwards; the cap of a worker process.

:func:`torch_threads` sets torch's intra-op threads and, to the same count, the BLAS libraries
that numpy and scipy load (OpenBLAS, through threadpoolctl). numpy's OpenBLAS otherwise runs every
call on all cores with busy-waiting threads, which ``torch.set_num_threads`` does not reach: on 2
cores shared with other jobs one SVD of a 768 × 768 matrix (the certified local bound takes one
per head) cost 0.67 s of CPU on two threads against 0.08 s on one (measured 2026-11-26), and the
adversarial stage of the quick preset 123 s of CPU against 34 s.

A process may carry a cap on the torch threads of a point, in the environment variable
``MEANFIELD_MAX_THREADS``: the local Dask cluster sets it for its workers so that workers ×
threads stays within the machine's cores (docs/cluster.md, "Thread pools of the workers").
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["MAX_THREADS_ENV", "blas_threads", "thread_cap", "torch_threads", "worker_thread_cap"]

#: Environment variable holding the most torch threads a point may use in this process.
MAX_THREADS_ENV = "MEANFIELD_MAX_THREADS"


def thread_cap() -> int | None:
    """The cap of this process (``MEANFIELD_MAX_THREADS``), ``None`` when unset or invalid."""
    try:
        cap = int(os.environ.get(MAX_THREADS_ENV, ""))
    except ValueError:
        return None
    return cap if cap >= 1 else None


def worker_thread_cap(
    workers: int, cores: int | None = None, environ: Mapping[str, str] | None = None
) -> int | None:
    """Torch threads per worker so that ``workers × threads ≤ cores``; ``None``: no cap.

    ``None`` when ``OMP_NUM_THREADS`` is set in ``environ`` (default ``os.environ``): the user
    chose the thread count, and the points keep the counts of the serial run. Otherwise
    ``max(1, cores // workers)``, ``cores`` defaulting to ``os.cpu_count()``.
    """
    environ = os.environ if environ is None else environ
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None
    cores = int(cores if cores is not None else (os.cpu_count() or 1))
    return max(1, cores // max(1, int(workers)))


@functools.cache
def _blas_controller() -> Any:
    """The BLAS libraries loaded so far, numpy's and scipy's included, as threadpoolctl sees them."""
    import numpy  # noqa: F401 - load numpy's and scipy's OpenBLAS first, so that both are seen
    import scipy.linalg  # noqa: F401

    # threadpoolctl ships neither stubs nor py.typed; the controller is used as Any here
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def blas_threads(n: int | None = 1) -> Iterator[None]:
    """Run the block with ``n`` threads in every loaded BLAS library (``None``: leave them alone).

    The count is at most the worker's cap (:func:`thread_cap`), and each library's own count is
    restored afterwards.
    """
    if n is None:
        yield
        return
    cap = thread_cap()
    k = int(n) if cap is None else min(int(n), cap)
    with _blas_controller().limit(limits=k, user_api="blas"):
        yield


@contextlib.contextmanager
def torch_threads(n: int | None = 1) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads and ``n`` BLAS threads (``None``: leave both).

    Under a worker's cap (:func:`thread_cap`) the count is at most the cap, ``None`` included.
    Tiny dense problems (d and n of a few units) run fastest on one thread: with several, the
    per-op synchronisation dominates, and more so when other processes share the cores. numpy's
    and scipy's BLAS follow the same count (:func:`blas_threads`; the module docstring says why).
    """
    import torch

    cap = thread_cap()
    old = torch.get_num_threads()
    if n is None:
        n = old if cap is not None and old > cap else None
    if n is None:
        yield
        return
    k = int(n) if cap is None else min(int(n), cap)
    torch.set_num_threads(k)
    try:
        with blas_threads(k):
            yield
    finally:
        torch.set_num_threads(old)
