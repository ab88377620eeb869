r"""The engine adapter: certified brackets from :func:`meanfield.lipschitz.local_lipschitz`.

:class:`Target` holds one certified value ``lower <= exact <= upper`` and the context the bounds
need; the helpers turn numpy instances into the library's parameters and measures (float64).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np


@dataclass
class Target:
    r"""One certified engine value and the context the bounds need.

    Attributes
    ----------
    label : str
        What was measured (e.g. ``"sequence"``, ``"two_dirac_opt[+]"``).
    geometry : str
        ``"euclidean"``, ``"wasserstein"``, ``"split"`` (engine geometries), ``"l2_inf"``
        (:math:`\infty`-norm of Kim's L2 attention) or ``"softmax_cost"`` (Kim's lemma).
    lower, value, upper : float
        Certified bracket ``lower <= exact <= upper`` and the engine's estimate.
    ctx : dict
        ``what`` (``"sequence"``, ``"measure"``, ``"kim"``, ``"softmax_cost"``), ``masked``,
        ``n``, ``R`` (largest token norm), ``heads`` (list of ``(A, V, W)`` numpy arrays, ``W``
        the column block of :math:`W^O` or ``None``), ``WO`` and, for constructions,
        ``construction`` with its parameters (``gamma``, ``Vu_norm``, ``eps``, ...), plus the
        input arrays (``X``; or ``points``, ``log_weights``, ``positions``).
    """

    label: str
    geometry: str
    lower: float
    value: float
    upper: float
    ctx: dict[str, Any] = field(default_factory=dict)


def as_tensor64(a: np.ndarray) -> Any:
    import torch

    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def params_of(heads: Sequence[tuple], WO: np.ndarray | None) -> Any:
    from meanfield import AttentionParams, MultiHeadParams

    ps = [AttentionParams(as_tensor64(A), as_tensor64(V)) for A, V, _ in heads]
    if len(ps) == 1 and WO is None:
        return ps[0]
    return MultiHeadParams(tuple(ps), W_O=None if WO is None else as_tensor64(WO))


def engine_of(
    x: Any,
    params: Any,
    *,
    geometry: Literal["euclidean", "wasserstein", "split"] = "euclidean",
    masked: bool = False,
) -> tuple[float, float, float]:
    """Certified bracket (lower, value, upper) of the local constant (dense, float64)."""
    from meanfield.lipschitz import local_lipschitz

    est = local_lipschitz(x, params, geometry=geometry, masked=masked, method="dense")
    return float(est.lower), float(est.value), float(est.upper)


def measure_of(points: np.ndarray, log_weights: np.ndarray, positions: np.ndarray | None = None):
    from meanfield import DiracMeasure

    return DiracMeasure.from_log_weights(
        as_tensor64(points),
        as_tensor64(log_weights),
        None if positions is None else as_tensor64(positions),
    )
