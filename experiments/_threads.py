"""A context manager for torch's intra-op thread count, restored on exit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["torch_threads"]


@contextlib.contextmanager
def torch_threads(n: int | None = 1) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``None``: leave the setting alone).

    Tiny dense problems (d and n of a few units) run fastest on one thread: with several, the
    per-op synchronisation dominates, and more so when other processes share the cores.
    """
    import torch

    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)
