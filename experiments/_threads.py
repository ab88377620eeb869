"""Torch thread counts: a context manager restoring them, and the cap of a worker process.

A process may carry a cap on the torch threads of a point, in the environment variable
``MEANFIELD_MAX_THREADS``: the local Dask cluster sets it for its workers so that workers ×
threads stays within the machine's cores (docs/cluster.md, "Thread pools of the workers").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

__all__ = ["MAX_THREADS_ENV", "thread_cap", "torch_threads", "worker_thread_cap"]

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


@contextlib.contextmanager
def torch_threads(n: int | None = 1) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``None``: leave the setting alone).

    Under a worker's cap (:func:`thread_cap`) the count is at most the cap, ``None`` included.
    Tiny dense problems (d and n of a few units) run fastest on one thread: with several, the
    per-op synchronisation dominates, and more so when other processes share the cores.
    """
    import torch

    cap = thread_cap()
    old = torch.get_num_threads()
    if n is None:
        n = old if cap is not None and old > cap else None
    if n is None:
        yield
        return
    torch.set_num_threads(int(n) if cap is None else min(int(n), cap))
    try:
        yield
    finally:
        torch.set_num_threads(old)
