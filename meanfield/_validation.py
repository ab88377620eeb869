"""The input rule of the public attention functions, in one place (docs/conventions.md §8).

Every public function that takes points together with parameters (``self_attention``,
``attention``, ``attention_map``, ``attention_weights``, ``attention_points``,
``l2_self_attention``, ``linearize``, ``local_lipschitz``) passes its inputs through
:func:`check_points` (or :func:`check_measure`) and the helpers below. The rule:

1. **Floating inputs keep their dtype; they must match the parameters.** A floating tensor (or a
   floating numpy array) whose dtype differs from the parameters' is an error, never a silent cast:
   a cast down loses precision, a cast up hides a cost, and either would make the result's dtype
   depend on the order of the arguments. Convert one side with ``.to(...)``.
2. **Inputs without a floating dtype of their own take the parameters'.** Python lists and scalars
   and integer or boolean tensors are converted to the dtype and device of the parameters.
3. **Auxiliary inputs follow the points.** Log-weights and positions are cast to the dtype of the
   points, as :class:`~meanfield.measures.DiracMeasure` casts its weights; token indices are
   integers.
4. **Two measures (transport distances) may differ in dtype**: the exact solvers work in float64
   and return the dtype of ``mu``, the entropic solver works in the promoted dtype. They must be
   unbatched :class:`~meanfield.measures.DiracMeasure` objects of one dimension on one device
   (:func:`check_measure_pair`).
5. **Errors are one line**: ``TypeError`` for something that is not array-like or is complex, or
   for parameters of the wrong class; ``ValueError`` for wrong shapes, mismatched dimensions, an
   empty sequence (``n = 0``), NaN or infinite points, a dtype or device mismatch.
6. **Flags are booleans.** ``masked`` and the other switches take ``True`` or ``False`` (a numpy
   bool too); anything else, such as the string ``"yes"``, is a ``TypeError``
   (:func:`check_flag`), never read by its truth value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._numerics import check_finite

__all__ = [
    "check_aux",
    "check_flag",
    "check_index",
    "check_measure",
    "check_measure_pair",
    "check_points",
    "params_dtype_device",
    "to_floating",
]


def reject_variants(params: object, what: str) -> None:
    """Raise a one-line ``ValueError`` when a head of ``params`` uses an attention variant.

    For consumers that model only the plain bilinear head (docs/theory.md §B6): a feature they
    do not model is an error naming it, never a number for another map.
    """
    for h in getattr(params, "heads", ()):
        variants = getattr(h, "variants", ())
        if variants:
            raise ValueError(f"{what} does not model {', '.join(variants)} yet")


def check_flag(value: object, name: str) -> bool:
    """Rule 6: ``value`` as a bool when it is one (Python or numpy), else a one-line TypeError."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def params_dtype_device(params: object, allowed: tuple[type, ...], what: str) -> tuple[Any, Any]:
    """The floating dtype and device of ``params``, after checking its class."""
    if not isinstance(params, allowed):
        names = " or ".join(c.__name__ for c in allowed)
        raise TypeError(f"{what}: params must be {names}, got {type(params).__name__}")
    dtype = getattr(params, "dtype", None)
    device = getattr(params, "device", None)
    if dtype is None:  # L2AttentionParams
        W_Q = params.W_Q  # type: ignore[attr-defined]
        dtype, device = W_Q.dtype, W_Q.device
    return dtype, device


def to_floating(x: object, name: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Apply rules 1 and 2: a tensor of ``dtype`` on ``device``, or a one-line error."""
    if isinstance(x, Tensor):
        t = x
    elif hasattr(x, "dtype") and hasattr(x, "shape"):  # numpy arrays and scalars
        try:
            t = torch.as_tensor(np.asarray(x), device=device)  # numpy lives on the CPU: move it
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"{name} must be a tensor or array-like, got {type(x).__name__}"
            ) from err
    else:
        try:
            t = torch.as_tensor(x, dtype=dtype, device=device)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"{name} must be a tensor or a (nested) list of real numbers, got "
                f"{type(x).__name__}"
            ) from err
    if t.is_complex():
        raise TypeError(f"{name} must be real, got dtype {t.dtype}")
    if t.is_floating_point() and t.dtype != dtype:
        raise ValueError(
            f"{name} has dtype {t.dtype} but the parameters have {dtype}; convert one of them "
            f"with .to({dtype})"
        )
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the parameters are on {device}")
    return t if t.dtype == dtype else t.to(dtype)


def check_points(x: object, name: str, d: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Points of shape (..., n, d) with ``n >= 1``, finite, in the parameters' dtype and device."""
    X = to_floating(x, name, dtype, device)
    if X.ndim < 2:
        raise ValueError(f"{name} must have shape (..., n, d), got {tuple(X.shape)}")
    if X.shape[-1] != d:
        raise ValueError(f"{name} has dimension {X.shape[-1]} but the parameters expect d = {d}")
    if X.shape[-2] == 0:
        raise ValueError(f"{name} is empty (n = 0, shape {tuple(X.shape)}); attention needs n >= 1")
    check_finite(X, name)
    return X


def check_aux(
    x: object | None, name: str, like: Tensor, size: int, *, finite: bool = True
) -> Tensor | None:
    """Log-weights or positions of shape (..., size), cast to the dtype of the points ``like``.

    The leading dimensions must broadcast against those of ``like``. ``finite=False`` lets
    ``-inf`` through (log-weights of zero masses); NaN and ``+inf`` are then left to the softmax,
    which rejects them.
    """
    if x is None:
        return None
    if isinstance(x, Tensor):
        if x.is_complex():
            raise TypeError(f"{name} must be real, got dtype {x.dtype}")
        if x.device != like.device:
            raise ValueError(f"{name} is on {x.device} but the points are on {like.device}")
        t = x.to(like.dtype)
    else:
        try:
            t = torch.as_tensor(np.asarray(x, dtype=np.float64), device=like.device).to(like.dtype)
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"{name} must be a tensor or array-like, got {type(x).__name__}"
            ) from err
    batch = like.shape[:-2]
    if t.ndim < 1 or t.shape[-1] != size:
        raise ValueError(f"{name} must have shape (..., {size}), got {tuple(t.shape)}")
    try:
        torch.broadcast_shapes(t.shape[:-1], batch)
    except RuntimeError as err:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}, which does not broadcast with the points' batch "
            f"shape {tuple(batch)}"
        ) from err
    if finite:
        check_finite(t, name)
    return t


def check_index(x: object | None, name: str, like: Tensor, size: int) -> Tensor | None:
    """Integer token indices of shape (..., size) on the device of ``like``."""
    if x is None:
        return None
    t = x if isinstance(x, Tensor) else torch.as_tensor(x, device=like.device)
    if t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must hold integers, got dtype {t.dtype}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but the points are on {like.device}")
    if t.ndim < 1 or t.shape[-1] != size:
        raise ValueError(f"{name} must have shape (..., {size}), got {tuple(t.shape)}")
    return t


def check_measure(mu: object, dtype: torch.dtype, device: torch.device, d: int, what: str) -> None:
    """A :class:`~meanfield.measures.DiracMeasure` matching the parameters (rule 1)."""
    from .measures import DiracMeasure

    if not isinstance(mu, DiracMeasure):
        raise TypeError(f"{what}: mu must be a DiracMeasure, got {type(mu).__name__}")
    if mu.d != d:
        raise ValueError(f"{what}: mu has dimension {mu.d} but the parameters expect d = {d}")
    if mu.dtype != dtype:
        raise ValueError(
            f"{what}: mu has dtype {mu.dtype} but the parameters have {dtype}; convert one of "
            f"them with .to({dtype})"
        )
    if mu.device != device:
        raise ValueError(f"{what}: mu is on {mu.device} but the parameters are on {device}")


def check_measure_pair(mu: object, nu: object, what: str) -> None:
    """Two unbatched measures of one dimension on one device (rule 4)."""
    from .measures import DiracMeasure

    for name, m in (("mu", mu), ("nu", nu)):
        if not isinstance(m, DiracMeasure):
            raise TypeError(f"{what}: {name} must be a DiracMeasure, got {type(m).__name__}")
    assert isinstance(mu, DiracMeasure) and isinstance(nu, DiracMeasure)
    if mu.points.ndim != 2 or nu.points.ndim != 2:
        raise ValueError(
            f"{what} needs unbatched measures, got batch shapes {tuple(mu.batch_shape)} and "
            f"{tuple(nu.batch_shape)}"
        )
    if mu.d != nu.d:
        raise ValueError(f"{what}: dimension mismatch, mu has d={mu.d} but nu has d={nu.d}")
    if mu.device != nu.device:
        raise ValueError(f"{what}: mu is on {mu.device} but nu is on {nu.device}")
