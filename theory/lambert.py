r"""Real Lambert W on the branches 0 and -1, with domain checks.

The Lambert W function solves :math:`W(z)\,e^{W(z)} = z` (docs/theory.md §11, *standard*).
On the real line it has two branches:

* :math:`W_0` on :math:`[-1/e, \infty)`, increasing from :math:`-1` to :math:`\infty`;
* :math:`W_{-1}` on :math:`[-1/e, 0)`, decreasing from :math:`-1` to :math:`-\infty`.

Both meet at the branch point :math:`z = -1/e`, :math:`W = -1`, where
:math:`W'(z) = W/(z(1 + W))` is infinite.

Numerics
--------
Away from the branch point the values come from :func:`scipy.special.lambertw` (real part taken
after the domain checks). Near the branch point scipy loses accuracy (a relative error of
:math:`2\cdot10^{-6}` on :math:`W_{-1}` at :math:`z = -1/e + 10^{-12}`, and NaN at the float
nearest :math:`-1/e`), so there the toolkit solves :math:`\psi(1 + W) = p` instead, where
:math:`p = \pm\sqrt{2(1 + ez)}` is computed with a compensated (double-double) product and
:math:`\psi(u) = u\sqrt{2\varphi(u)/u^2}`, :math:`\varphi(u) = (u - 1)e^u + 1`, is smooth with
:math:`\psi'(0) = 1`. On branch -1 at tiny arguments, :math:`-10^{-100} < z < 0` (where scipy
returns -inf or NaN for subnormal ``z``), the toolkit solves :math:`w + \log(-w) = \log(-z)` by
Newton's method instead. The result is accurate to a few ulps of :math:`W` for every float input.

The float nearest :math:`-1/e` lies below :math:`-1/e` (by about :math:`1.2\cdot10^{-17}`); inputs
at
most :data:`BRANCH_POINT_TOLERANCE` below :math:`-1/e` are treated as the branch point and return
exactly :math:`-1`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

__all__ = [
    "BRANCH_POINT_TOLERANCE",
    "lambertw",
    "lambertw_asymptotic",
    "lambertw_derivative",
    "lambertw_exp",
]

#: Inputs with ``1 + e*z`` in ``[-BRANCH_POINT_TOLERANCE, 0]`` are the branch point ``z = -1/e``.
#: ``1e-15`` in ``1 + e*z`` is about ``3.7e-16`` in ``z``, i.e. a few ulps of ``1/e``.
BRANCH_POINT_TOLERANCE = 1e-15

# e split as a double-double: _E_HI + _E_LO equals e to about 1e-32.
_E_HI = 2.718281828459045
_E_LO = 1.4456468917292502e-16
# Below this value of q = 1 + e*z the branch-point solver replaces scipy.
_Q_SERIES = 0.05
# On branch -1, arguments in (-_Z_TINY, 0) are solved in the log domain: scipy loses accuracy
# there for subnormal z (-inf at -5e-324, NaN at -1e-320, a relative error of 2e-9 at -1e-315).
_Z_TINY = 1e-100
# lambertw_exp uses scipy.special.wrightomega from this u up (measured within an ulp of mpmath).
_U_WRIGHTOMEGA = -2.0
# Dekker's splitting constant for float64 (2**27 + 1).
_SPLITTER = 134217729.0


def _two_product(a: NDArray[np.float64], b: float) -> tuple[NDArray, NDArray]:
    """Return ``(prod, err)`` with ``prod + err == a * b`` exactly (Dekker, no FMA needed)."""
    prod = a * b
    t = _SPLITTER * a
    a_hi = t - (t - a)
    a_lo = a - a_hi
    tb = _SPLITTER * b
    b_hi = tb - (tb - b)
    b_lo = b - b_hi
    err = ((a_hi * b_hi - prod) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return prod, err


def _one_plus_ez(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """Compute ``q = 1 + e*z`` to full relative precision near ``z = -1/e``."""
    with np.errstate(over="ignore", invalid="ignore"):
        prod, err = _two_product(z, _E_HI)
        # For z near -1/e, prod is in [-2, -1/2] and 1 + prod is exact (Sterbenz).
        return (1.0 + prod) + (err + _E_LO * z)


def _phi_over_u2(u: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return ``((u - 1) e^u + 1) / u**2 = sum_{k>=2} (k - 1) u^(k-2) / k!`` for ``|u| < 1``."""
    out = np.zeros_like(u)
    # Horner evaluation of sum_{j=0}^{J} c_j u^j with c_j = (j + 1) / (j + 2)!.
    terms = 24
    coeffs = []
    fact = 2.0  # (j + 2)! for j = 0
    for j in range(terms):
        coeffs.append((j + 1) / fact)
        fact *= j + 3
    for c in reversed(coeffs):
        out = out * u + c
    return out


def _branch_point_solve(q: NDArray[np.float64], branch: int) -> NDArray[np.float64]:
    """Solve for ``W`` near the branch point given ``q = 1 + e*z >= 0`` (small)."""
    p = -np.sqrt(2.0 * q) if branch == -1 else np.sqrt(2.0 * q)
    # Series start (Corless et al. 1996, eq. 4.22): W + 1 = p - p^2/3 + 11/72 p^3 - 43/540 p^4.
    u = p * (1.0 + p * (-1.0 / 3.0 + p * (11.0 / 72.0 - p * 43.0 / 540.0)))
    for _ in range(4):
        s = np.sqrt(2.0 * _phi_over_u2(u))
        psi = u * s
        dpsi = np.exp(u) / s
        u = u - (psi - p) / dpsi
    return u - 1.0


def _validate_branch(branch: int) -> None:
    if branch not in (0, -1):
        raise ValueError(f"branch must be 0 or -1, got {branch!r}")


def _atleast_1d(x: ArrayLike) -> tuple[NDArray[np.float64], bool]:
    """``x`` as a float64 array of at least one dimension, and whether it was a scalar."""
    arr = np.asarray(x, dtype=np.float64)
    return np.atleast_1d(arr), arr.ndim == 0


def _finish(out: NDArray[np.float64], scalar: bool) -> Any:
    return np.float64(out.reshape(-1)[0]) if scalar else out


def lambertw(z: ArrayLike, branch: int = 0, *, precision: int | None = None) -> Any:
    r"""Real Lambert W, :math:`W_k(z)\,e^{W_k(z)} = z`, on the branches ``k = 0`` and ``k = -1``.

    Parameters
    ----------
    z : array_like
        Arguments. Branch 0 needs :math:`z \ge -1/e` (``+inf`` allowed); branch -1 needs
        :math:`-1/e \le z < 0`. With ``precision`` given, entries may also be strings or
        ``mpmath.mpf`` values, which keeps digits beyond float64.
    branch : {0, -1}
        The real branch.
    precision : int, optional
        Number of decimal digits. When given, the values are computed by :func:`mpmath.lambertw`
        at that working precision and returned as an ``mpmath.mpf`` (scalar input) or a numpy
        object array of ``mpf`` (array input). When omitted, the result is float64.

    Returns
    -------
    numpy.float64 or numpy.ndarray or mpmath.mpf
        :math:`W_k(z)`, same shape as ``z``.

    Raises
    ------
    ValueError
        If ``branch`` is not 0 or -1, ``z`` contains NaN, or ``z`` is outside the branch domain
        (``z = -inf`` included).

    Notes
    -----
    docs/theory.md §11 (*standard*). Inputs at most :data:`BRANCH_POINT_TOLERANCE` below
    :math:`-1/e` in :math:`1 + ez` count as the branch point and return exactly -1; this covers
    the float ``-1/np.e``, which lies slightly below :math:`-1/e`. See the module docstring for
    the branch-point solver.
    """
    _validate_branch(branch)
    if precision is not None:
        return _lambertw_mp(z, branch, precision)
    z_arr, scalar = _atleast_1d(z)
    if np.isnan(z_arr).any():
        raise ValueError("lambertw: z contains NaN")
    if (z_arr == -np.inf).any():
        raise ValueError("lambertw: z = -inf is below the branch point -1/e")
    q = np.where(np.isfinite(z_arr), _one_plus_ez(z_arr), np.inf)
    if (q < -BRANCH_POINT_TOLERANCE).any():
        bad = z_arr[q < -BRANCH_POINT_TOLERANCE].flat[0]
        raise ValueError(f"lambertw: z = {float(bad)!r} is below the branch point -1/e")
    if branch == -1 and (z_arr >= 0).any():
        bad = z_arr[z_arr >= 0].flat[0]
        raise ValueError(f"lambertw: branch -1 needs -1/e <= z < 0, got z = {float(bad)!r}")
    q = np.maximum(q, 0.0)
    near = q < _Q_SERIES
    out = np.empty_like(z_arr)
    out[near] = _branch_point_solve(q[near], branch)
    tiny = (branch == -1) & ~near & (z_arr > -_Z_TINY)
    out[tiny] = _lambertw_m1_tiny(z_arr[tiny])
    far = ~near & ~tiny
    out[far] = special.lambertw(z_arr[far], branch).real
    return _finish(out, scalar)


def _lambertw_m1_tiny(z: NDArray[np.float64]) -> NDArray[np.float64]:
    r"""Branch -1 for :math:`-10^{-100} < z < 0`, subnormal ``z`` included.

    Solves :math:`w + \log(-w) = L` with :math:`L = \log(-z)` (exact to an ulp even for
    subnormal ``z``) by Newton's method on this increasing concave function of :math:`w < -1`,
    started at the asymptotic value :math:`L - \log(-L)`.
    """
    L = np.log(-z)
    w = L - np.log(-L)
    for _ in range(8):
        step = (w + np.log(-w) - L) / (1.0 + 1.0 / w)
        w = w - step
        if (np.abs(step) <= 1e-16 * np.abs(w)).all():
            break
    return w


def _lambertw_mp(z: Any, branch: int, precision: int) -> Any:
    import mpmath

    if int(precision) < 1:
        raise ValueError(f"lambertw: precision must be a positive digit count, got {precision!r}")
    z_obj = np.asarray(z, dtype=object)
    scalar = z_obj.ndim == 0
    flat = np.atleast_1d(z_obj).ravel()
    out = np.empty(flat.shape, dtype=object)
    with mpmath.workdps(int(precision) + 10):
        minus_inv_e = -mpmath.exp(-1)
        for idx, value in enumerate(flat):
            is_float = isinstance(value, (float, np.floating))
            zi = mpmath.mpf(value)
            if mpmath.isnan(zi):
                raise ValueError("lambertw: z contains NaN")
            q = 1 + mpmath.e * zi
            tol = BRANCH_POINT_TOLERANCE if is_float else mpmath.mpf(10) ** (-int(precision))
            if q < -tol:
                raise ValueError(f"lambertw: z = {value!r} is below the branch point -1/e")
            if branch == -1 and zi >= 0:
                raise ValueError(f"lambertw: branch -1 needs -1/e <= z < 0, got z = {value!r}")
            if q <= 0 or zi == minus_inv_e:
                out[idx] = mpmath.mpf(-1)
            else:
                out[idx] = mpmath.re(mpmath.lambertw(zi, branch))
    with mpmath.workdps(int(precision)):
        result = np.array([+v for v in out], dtype=object).reshape(np.shape(z_obj))
    return result[()] if scalar else result


def lambertw_derivative(z: ArrayLike, branch: int = 0) -> Any:
    r"""Evaluate the derivative of Lambert W.

    :math:`W_k'(z) = \frac{W_k(z)}{z(1 + W_k(z))} = \frac{e^{-W_k(z)}}{1 + W_k(z)}`.

    Parameters
    ----------
    z : array_like
        Arguments in the domain of the branch (see :func:`lambertw`).
    branch : {0, -1}
        The real branch.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The derivative; ``+inf`` (branch 0) or ``-inf`` (branch -1) at the branch point, and
        exactly 1 at ``z = 0`` on branch 0.

    Notes
    -----
    docs/theory.md §11 (*standard*). The second form, from :math:`W/z = e^{-W}`, has no 0/0 at
    :math:`z = 0`.
    """
    w, scalar = _atleast_1d(lambertw(z, branch))
    denom = 1.0 + w
    with np.errstate(divide="ignore", over="ignore"):
        out = np.exp(-w) / denom
    out[denom == 0.0] = np.inf if branch == 0 else -np.inf
    return _finish(out, scalar)


def lambertw_asymptotic(z: ArrayLike, branch: int = 0, *, terms: int = 2) -> Any:
    r"""Asymptotic expansion of Lambert W: :math:`L_1 - L_2 + L_2/L_1 + \dots`.

    For branch 0 and :math:`z \to \infty`, :math:`L_1 = \log z`, :math:`L_2 = \log\log z`; for
    branch
    -1 and :math:`z \to 0^-`, :math:`L_1 = \log(-z)`, :math:`L_2 = \log(-\log(-z))`.

    Parameters
    ----------
    z : array_like
        Branch 0: :math:`z > e` (so that :math:`L_2 > 0`); branch -1: :math:`-1/e < z < 0`.
    branch : {0, -1}
        The real branch.
    terms : {1, 2, 3}
        Number of terms: ``1`` gives :math:`L_1`, ``2`` gives :math:`L_1 - L_2` (default), ``3``
        adds
        :math:`L_2/L_1`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The truncated expansion.

    Notes
    -----
    docs/theory.md §11 (*standard*): :math:`W_0(z) = \log z - \log\log z + o(1)`. The expansion is
    derived symbolically in :func:`theory.symbolic.lambertw_asymptotic`. The error of the
    two-term form is of order :math:`L_2/L_1`, so it converges slowly.
    """
    _validate_branch(branch)
    if terms not in (1, 2, 3):
        raise ValueError(f"terms must be 1, 2 or 3, got {terms!r}")
    z_arr, scalar = _atleast_1d(z)
    if branch == 0:
        if not (z_arr > np.e).all():
            raise ValueError("lambertw_asymptotic: branch 0 needs z > e")
        L1 = np.log(z_arr)
        L2 = np.log(L1)
    else:
        if not ((z_arr > -np.exp(-1.0)) & (z_arr < 0)).all():
            raise ValueError("lambertw_asymptotic: branch -1 needs -1/e < z < 0")
        L1 = np.log(-z_arr)
        L2 = np.log(-L1)
    out = L1.copy()
    if terms >= 2:
        out = out - L2
    if terms >= 3:
        out = out + L2 / L1
    return _finish(out, scalar)


def lambertw_exp(u: ArrayLike) -> Any:
    r"""Principal branch at an exponential argument, :math:`W_0(e^u)`, without overflow.

    Parameters
    ----------
    u : array_like
        Logarithm of the argument; any real value (``e^u`` may overflow float64, e.g. ``u = 2000``).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`W_0(e^u)`, i.e. the solution :math:`w > 0` of :math:`w + \log w = u`.

    Raises
    ------
    ValueError
        If ``u`` contains NaN.

    Notes
    -----
    docs/theory.md §11 (*standard*). For real :math:`u`, :math:`W_0(e^u)` is the Wright omega
    function :math:`\omega(u)`. For :math:`u \ge -2` it is :func:`scipy.special.wrightomega`
    (within an ulp of mpmath there); below, where ``wrightomega`` drifts to about 15 ulps (near
    :math:`u = -50`), it is :func:`lambertw` of :math:`e^u` (within an ulp; :math:`e^u` does not
    overflow there). ``u = -inf`` gives 0 and ``u = +inf`` gives ``+inf``.
    """
    u_arr, scalar = _atleast_1d(u)
    if np.isnan(u_arr).any():
        raise ValueError("lambertw_exp: u contains NaN")
    out = np.empty_like(u_arr)
    low = u_arr < _U_WRIGHTOMEGA
    out[low] = lambertw(np.exp(u_arr[low]))
    out[~low] = special.wrightomega(u_arr[~low])
    return _finish(out, scalar)
