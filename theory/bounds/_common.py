"""Validation and log-domain helpers shared by the modules of :mod:`theory.bounds`.

A private module of the package: its names have no underscore because :mod:`theory.bounds` and
:mod:`theory.regimes` import them, and none of them is exported by a package's ``__init__``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------


def checked_float(
    x: ArrayLike,
    name: str,
    *,
    min_value: float | None = None,
    strict: bool = False,
    allow_inf: bool = False,
) -> NDArray[np.float64]:
    """Convert to a float64 array and check it with one-line errors."""
    arr = np.asarray(x, dtype=np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    if not allow_inf and np.isinf(arr).any():
        raise ValueError(f"{name} must be finite")
    if min_value is not None:
        bad = arr <= min_value if strict else arr < min_value
        if bad.any():
            op = ">" if strict else ">="
            raise ValueError(f"{name} must be {op} {min_value}, got {float(arr[bad].flat[0])!r}")
    return arr


def checked_count(x: ArrayLike, name: str, *, allow_inf: bool = False) -> NDArray:
    """Validate a token or copy count (integer-valued, >= 1; +inf if allowed)."""
    arr = checked_float(x, name, min_value=1, allow_inf=allow_inf)
    finite = np.isfinite(arr)
    if (arr[finite] != np.round(arr[finite])).any():
        raise ValueError(f"{name} must be integer-valued")
    return arr


def checked_norm(x: ArrayLike, name: str) -> NDArray[np.float64]:
    return checked_float(x, name, min_value=0.0)


def norm_theta(
    A_norm: ArrayLike, V_norm: ArrayLike, R: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    r"""Validate ``A_norm, V_norm, R`` (in that order) and return ``(V_norm, theta)``.

    ``theta = A_norm * R**2`` is the :math:`\theta = \|A\|_2R^2` of docs/theory.md §1.
    """
    a = checked_norm(A_norm, "A_norm")
    V = checked_norm(V_norm, "V_norm")
    R_ = checked_norm(R, "R")
    return V, a * R_**2


def checked_choice(value: str, name: str, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def as_result(arr: Any) -> Any:
    """Return numpy scalars for 0-d results and arrays otherwise."""
    return np.asarray(arr)[()]


def exp_or_log(log_value: NDArray[np.float64], log: bool) -> Any:
    if log:
        return as_result(log_value)
    with np.errstate(over="ignore"):
        return as_result(np.exp(log_value))


def quiet_log(x: NDArray[np.float64]) -> NDArray[np.float64]:
    with np.errstate(divide="ignore"):
        return np.log(x)


def log1mexp(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return ``log(1 - exp(x))`` for ``x <= 0`` accurately (Mächler 2012)."""
    with np.errstate(divide="ignore"):
        return np.where(x > -np.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def log_expit(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return ``log(1 / (1 + exp(-x)))`` without overflow."""
    return -np.logaddexp(0.0, -x)
