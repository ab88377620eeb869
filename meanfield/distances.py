r"""Wasserstein distances between weighted atomic measures (docs/theory.md §B3).

Between :math:`\mu=\sum_{i=1}^n a_i\delta_{x_i}` and :math:`\nu=\sum_{j=1}^m b_j\delta_{y_j}`
the exact solvers compute

.. math::
    W_p(\mu,\nu)^p = \min_{\pi\in\Pi(a,b)} \langle\pi, M\rangle
                   = \min_{\pi\in\Pi(a,b)} \sum_{i,j}\pi_{ij}\,\|x_i-y_j\|^p,
    \qquad \Pi(a,b)=\{\pi\in\mathbb R_+^{n\times m}:\ \pi\mathbf 1_m=a,\ \pi^\top\mathbf 1_n=b\},

and the bottleneck distance
:math:`W_\infty(\mu,\nu)=\min_{\pi\in\Pi(a,b)}\max_{\pi_{ij}>0}\|x_i-y_j\|`. The entropic solver
computes the minimiser of :math:`\langle\pi,M\rangle+\varepsilon\,\mathrm{KL}(\pi\,|\,a\otimes b)`
over :math:`\Pi(a,b)`. Here:

- :math:`M\in\mathbb R_+^{n\times m}` is the cost matrix :math:`M_{ij}=\|x_i-y_j\|_2^p`,
  computed in the difference form (never as :math:`\|x\|^2+\|y\|^2-2x^\top y`, which cancels);
- :math:`a, b` are the masses (``mu.weights``, ``nu.weights``) on the probability simplex;
- :math:`\pi` is a transport plan (coupling), :math:`p\ge1` the exponent, :math:`\varepsilon>0`
  the entropic regularisation in the units of :math:`M`.

Provenance: *standard* (docs/theory.md §B3); the conditional distance there is a reconstruction.
For uniform measures of equal size the exact problem is a linear assignment (Birkhoff), solved
with :func:`scipy.optimize.linear_sum_assignment`; otherwise POT's network simplex :func:`ot.emd`.
The entropic solver is POT's log-domain Sinkhorn on its torch backend. POT is imported on first
use, never by ``import meanfield``. The exact solvers work in float64 numpy; their values are
recomputed in torch from the optimal plan, so they are differentiable in the points (Danskin's
theorem, the plan held fixed), never in the weights. Positions of causal measures are ignored by every function except
:func:`conditional_wasserstein`.
"""

from __future__ import annotations

import bisect
import math
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ._validation import check_measure_pair
from .measures import DiracMeasure

__all__ = [
    "SinkhornResult",
    "TransportError",
    "TransportResult",
    "conditional_wasserstein",
    "optimal_transport",
    "sinkhorn_wasserstein",
    "wasserstein",
    "wasserstein_inf",
]

OnFailure = Literal["raise", "warn"]

#: Rows of the cost matrix formed at once, as a number of float64 entries (keeps memory ~32 MiB).
_BLOCK_ENTRIES = 1 << 22


class TransportError(RuntimeError):
    """An exact transport solver stopped before reaching an optimal plan."""


@dataclass(frozen=True)
class TransportResult:
    r"""Exact optimal transport between two atomic measures.

    Attributes
    ----------
    distance : Tensor, shape ()
        :math:`W_p(\mu,\nu)`, dtype and device of ``mu.points``; differentiable in the points.
    plan : Tensor, shape (n, m)
        An optimal coupling :math:`\pi` (rows sum to ``mu.weights``, columns to ``nu.weights``).
    p : float
        The exponent :math:`p`.
    converged : bool
        Whether the solver certified optimality (``False`` only with ``on_failure="warn"``).
    method : str
        ``"trivial"`` (one atom on a side), ``"assignment"`` (uniform, equal sizes) or
        ``"network_simplex"`` (POT's :func:`ot.emd`).
    """

    distance: Tensor
    plan: Tensor
    p: float
    converged: bool
    method: str


@dataclass(frozen=True)
class SinkhornResult:
    r"""Entropic optimal transport between two atomic measures (log-domain Sinkhorn).

    Attributes
    ----------
    cost : Tensor, shape ()
        :math:`\langle\pi_\varepsilon, M\rangle`, the transport cost of the entropic plan, an
        approximation of :math:`W_p^p` from above:
        :math:`0\le\langle\pi_\varepsilon,M\rangle-W_p^p\le\varepsilon\log\min(n,m)` at convergence.
    distance : Tensor, shape ()
        ``cost ** (1/p)``; with ``debiased=True``, ``max(divergence, 0) ** (1/p)`` instead.
    plan : Tensor or None, shape (n, m)
        The entropic plan :math:`\pi_\varepsilon` (``None`` when ``return_plan=False``).
    n_iter : int
        Sinkhorn iterations performed (summed over the three problems when debiased).
    converged : bool
        Whether ``marginal_error <= tol`` for every problem solved.
    marginal_error : float
        :math:`\|\pi_\varepsilon\mathbf 1-a\|_1+\|\pi_\varepsilon^\top\mathbf 1-b\|_1`, measured on
        the returned plan (summed in float64); the maximum over the problems solved when debiased.
    eps : float
        The regularisation :math:`\varepsilon`.
    objective : Tensor, shape ()
        The full entropic objective
        :math:`\mathrm{OT}_\varepsilon(a,b)=\langle\pi_\varepsilon,M\rangle+\varepsilon\,
        \mathrm{KL}(\pi_\varepsilon\,|\,a\otimes b)`.
    divergence : Tensor or None, shape ()
        The Sinkhorn divergence :math:`S_\varepsilon=\mathrm{OT}_\varepsilon(a,b)
        -\tfrac12(\mathrm{OT}_\varepsilon(a,a)+\mathrm{OT}_\varepsilon(b,b))` when
        ``debiased=True``, else ``None``. It is not :math:`W_p^p` and can be slightly negative.
    """

    cost: Tensor
    distance: Tensor
    plan: Tensor | None
    n_iter: int
    converged: bool
    marginal_error: float
    eps: float
    objective: Tensor
    divergence: Tensor | None = None


# ---------------------------------------------------------------------------------------------
# validation and numpy helpers
# ---------------------------------------------------------------------------------------------
def _check_p(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"p must be a real number, got {type(p).__name__}")
    if math.isinf(p) and p > 0:
        raise ValueError("p must be finite; use wasserstein_inf for W_inf")
    if not p >= 1:
        raise ValueError(f"p must be >= 1, got {p}")
    return float(p)


def _check_max_iter(max_iter: int) -> None:
    if max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter}")


def _mass_tol(mu: DiracMeasure, nu: DiracMeasure) -> float:
    """Masses are known to a few rounding errors of the coarser input dtype (as in measures.py)."""
    eps = max(torch.finfo(mu.dtype).eps, torch.finfo(nu.dtype).eps)
    return 8.0 * max(mu.n, nu.n, 16) * eps


def _np64(t: Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def _simplex(w: np.ndarray) -> np.ndarray:
    """Renormalise masses to sum to 1 in float64 (POT checks marginals strictly)."""
    return w / w.sum()


def _distances_np(x: np.ndarray, y: np.ndarray, p: float | None) -> np.ndarray:
    """``||x_i - y_j||^p`` in float64, difference form, in row blocks (``p=None``: the norm)."""
    n, m, d = x.shape[0], y.shape[0], x.shape[1]
    out = np.empty((n, m), dtype=np.float64)
    rows = max(1, _BLOCK_ENTRIES // max(1, m * d))
    for s in range(0, n, rows):
        sq = np.square(x[s : s + rows, None, :] - y[None, :, :]).sum(-1)
        if p == 2:
            out[s : s + rows] = sq
        elif p is None or p == 1:
            out[s : s + rows] = np.sqrt(sq)
        else:
            out[s : s + rows] = np.sqrt(sq) ** p
    return out


def _is_uniform(w: np.ndarray) -> bool:
    return bool(np.all(w == w[0]))


def _import_ot() -> ModuleType:
    try:
        import ot
    except ImportError as err:  # pragma: no cover - POT is a declared dependency
        raise ImportError("optimal transport needs the POT package: pip install pot") from err
    return ot


def _emd(a: np.ndarray, b: np.ndarray, M: np.ndarray, max_iter: int) -> tuple[np.ndarray, int]:
    """POT's network simplex with its own warnings silenced; returns (plan, result_code)."""
    ot = _import_ot()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        G, log = ot.emd(a, b, np.ascontiguousarray(M), numItermax=int(max_iter), log=True)
    return np.asarray(G, dtype=np.float64), int(log["result_code"])


def _solve_plan(
    a: np.ndarray, b: np.ndarray, M: np.ndarray, *, max_iter: int, on_failure: OnFailure
) -> tuple[np.ndarray, bool, str]:
    """Optimal plan for masses ``a``, ``b`` (float64, summing to 1) and cost ``M``."""
    n, m = M.shape
    if n == 1 or m == 1:
        return np.outer(a, b), True, "trivial"
    if n == m and _is_uniform(a) and _is_uniform(b):
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(M)
        plan = np.zeros((n, m), dtype=np.float64)
        plan[rows, cols] = 1.0 / n
        return plan, True, "assignment"
    plan, code = _emd(a, b, M, max_iter)
    if code == 1:
        return plan, True, "network_simplex"
    if code == 3:
        msg = (
            f"network simplex stopped before optimality after max_iter={max_iter} iterations "
            "(POT numItermax); increase max_iter"
        )
        if on_failure == "raise":
            raise TransportError(msg)
        warnings.warn(msg, UserWarning, stacklevel=3)
        # POT's early exit leaves mass on artificial arcs; complete it to a coupling of (a, b) so
        # that its cost is an upper bound on W_p^p
        r = np.clip(a - plan.sum(1), 0.0, None)
        c = np.clip(b - plan.sum(0), 0.0, None)
        if r.sum() > 0 and c.sum() > 0:
            plan = plan + np.outer(r, c) / max(r.sum(), c.sum())
        return plan, False, "network_simplex"
    raise TransportError(
        f"network simplex failed with POT result code {code} (infeasible or unbounded)"
    )


def _cost_from_plan(x: Tensor, y: Tensor, plan: np.ndarray, p: float) -> Tensor:
    r""":math:`\sum_{ij}\pi_{ij}\|x_i-y_j\|^p` in float64 torch over the support of ``plan``.

    Differentiable in ``x`` and ``y`` with the plan held fixed (Danskin's theorem).
    """
    ii, jj = np.nonzero(plan)
    device = x.device
    i_t = torch.as_tensor(ii, dtype=torch.long, device=device)
    j_t = torch.as_tensor(jj, dtype=torch.long, device=device)
    w = torch.as_tensor(plan[ii, jj], dtype=torch.float64, device=device)
    x64, y64 = x.to(torch.float64), y.to(torch.float64)
    sq = (x64[i_t] - y64[j_t]).square().sum(-1)
    cost = sq if p == 2 else _safe_root(sq, 2.0).pow(p)
    return (w * cost).sum()


def _safe_root(c: Tensor, p: float) -> Tensor:
    """``c ** (1/p)`` for ``c >= 0`` with a zero (not NaN) gradient at ``c = 0``."""
    pos = c > 0
    c_safe = torch.where(pos, c, torch.ones_like(c))
    return torch.where(pos, c_safe.pow(1.0 / p), torch.zeros_like(c))


# ---------------------------------------------------------------------------------------------
# exact W_p
# ---------------------------------------------------------------------------------------------
def optimal_transport(
    mu: DiracMeasure,
    nu: DiracMeasure,
    *,
    p: float = 2,
    max_iter: int = 1_000_000,
    on_failure: OnFailure = "raise",
) -> TransportResult:
    r"""Exact optimal transport :math:`W_p(\mu,\nu)` and an optimal plan (docs/theory.md §B3).

    Solves :math:`\min_{\pi\in\Pi(a,b)}\sum_{ij}\pi_{ij}\|x_i-y_j\|^p` exactly. *Standard.*

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched source measure :math:`\sum_i a_i\delta_{x_i}`, ``n`` atoms in dimension ``d``.
    nu : DiracMeasure
        Unbatched target measure :math:`\sum_j b_j\delta_{y_j}`, ``m`` atoms in dimension ``d``.
    p : float, default 2
        Exponent, ``1 <= p < inf`` (use :func:`wasserstein_inf` for :math:`p=\infty`).
    max_iter : int, default 1_000_000
        Iteration cap of the network simplex (POT's ``numItermax``).
    on_failure : {"raise", "warn"}, default "raise"
        When the network simplex hits ``max_iter`` before optimality: raise
        :class:`TransportError`, or warn (``UserWarning``) and return the solver's partial plan,
        completed to a coupling by a product plan on the unassigned mass, with
        ``converged=False`` (its cost is then an upper bound on :math:`W_p^p`).

    Returns
    -------
    TransportResult
        ``distance`` (shape (), dtype and device of ``mu.points``), ``plan`` (shape (n, m)),
        ``p``, ``converged``, ``method``.

    Raises
    ------
    TypeError
        If an input is not a :class:`DiracMeasure`.
    ValueError
        On batched measures, a dimension or device mismatch, or ``p < 1``.
    TransportError
        If the network simplex fails (see ``on_failure``).

    Notes
    -----
    Masses are renormalised to sum to 1 in float64 before solving. Uniform measures of equal size
    use :func:`scipy.optimize.linear_sum_assignment` (an optimal plan is a permutation, by
    Birkhoff); a side with one atom has the product coupling as its only plan; everything else goes
    to :func:`ot.emd`. Positions of causal measures are ignored (see
    :func:`conditional_wasserstein`). The distance is recomputed in torch from the plan, so it
    carries gradients to the points (valid where the optimal plan is unique; the gradient at
    distance 0 is set to 0). The plan has no gradient.
    """
    check_measure_pair(mu, nu, "optimal_transport")
    p = _check_p(p)
    if on_failure not in ("raise", "warn"):
        raise ValueError(f"on_failure must be 'raise' or 'warn', got {on_failure!r}")
    _check_max_iter(max_iter)
    a, b = _simplex(_np64(mu.weights)), _simplex(_np64(nu.weights))
    M = _distances_np(_np64(mu.points), _np64(nu.points), p)
    plan, converged, method = _solve_plan(a, b, M, max_iter=max_iter, on_failure=on_failure)
    cost = _cost_from_plan(mu.points, nu.points, plan, p)
    distance = _safe_root(cost, p).to(mu.dtype)
    plan_t = torch.as_tensor(plan, dtype=mu.dtype, device=mu.device)
    return TransportResult(distance, plan_t, p, converged, method)


def wasserstein(
    mu: DiracMeasure,
    nu: DiracMeasure,
    *,
    p: float = 2,
    max_iter: int = 1_000_000,
    on_failure: OnFailure = "raise",
) -> Tensor:
    r"""Exact distance :math:`W_p(\mu,\nu)` between atomic measures (docs/theory.md §B3).

    .. math:: W_p(\mu,\nu)^p=\min_{\pi\in\Pi(a,b)}\sum_{ij}\pi_{ij}\|x_i-y_j\|^p .

    *Standard.* A thin wrapper of :func:`optimal_transport`; see it for the parameters and errors.

    Parameters
    ----------
    mu, nu, p, max_iter, on_failure
        As in :func:`optimal_transport`.

    Returns
    -------
    Tensor, shape ()
        :math:`W_p(\mu,\nu)`, dtype and device of ``mu.points``. For uniform clouds of equal size,
        :math:`W_2(\mathrm m(X),\mathrm m(Y))=\min_\sigma\|X-Y_\sigma\|_F/\sqrt n`.
    """
    return optimal_transport(mu, nu, p=p, max_iter=max_iter, on_failure=on_failure).distance


# ---------------------------------------------------------------------------------------------
# W_inf
# ---------------------------------------------------------------------------------------------
def wasserstein_inf(mu: DiracMeasure, nu: DiracMeasure, *, max_iter: int = 1_000_000) -> Tensor:
    r"""Exact bottleneck distance :math:`W_\infty(\mu,\nu)` between two small atomic measures.

    .. math:: W_\infty(\mu,\nu)=\min_{\pi\in\Pi(a,b)}\ \max_{(i,j):\,\pi_{ij}>0}\|x_i-y_j\| .

    *Standard* (docs/theory.md §B3, §A5: moving a mass by :math:`\delta` costs :math:`\|\delta\|`
    whatever the mass).

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched measure :math:`\sum_i a_i\delta_{x_i}`, points (n, d).
    nu : DiracMeasure
        Unbatched measure :math:`\sum_j b_j\delta_{y_j}`, points (m, d).
    max_iter : int, default 1_000_000
        Iteration cap of each network-simplex feasibility test.

    Returns
    -------
    Tensor, shape ()
        :math:`W_\infty(\mu,\nu)`, dtype and device of ``mu.points``; it equals the distance of one
        critical pair, recomputed in torch, so it carries a (sub)gradient to the points.

    Raises
    ------
    TypeError
        If an input is not a :class:`DiracMeasure`.
    ValueError
        On batched measures or a dimension or device mismatch.
    TransportError
        If a feasibility test hits ``max_iter``.

    Notes
    -----
    :math:`W_\infty\le t` iff a coupling supported on :math:`\{\|x_i-y_j\|\le t\}` exists. The value
    is one of the pairwise distances, found by binary search over the sorted distinct distances at
    least :math:`\max(\max_i\min_j\|x_i-y_j\|,\ \max_j\min_i\|x_i-y_j\|)` (every atom must be sent
    somewhere). Atoms of zero mass are dropped first. Feasibility is decided exactly for uniform
    measures of equal size (a perfect matching,
    :func:`scipy.sparse.csgraph.maximum_bipartite_matching`), and otherwise by :func:`ot.emd` with
    the 0/1 cost :math:`\mathbf 1\{\|x_i-y_j\|>t\}`: feasible iff the optimal cost, the least mass
    that must use a longer edge, is at most ``4 (n + m)`` machine epsilons of the coarser input
    dtype: sums of masses are only known to that precision, so smaller imbalances are read as
    rounding (about 1e-13 in float64 and 5e-6 in float32 for ten atoms). The cost is
    :math:`O(nm\log(nm))` plus :math:`O(\log(nm))` transport solves: meant for small problems.
    Positions of causal measures are ignored.
    """
    check_measure_pair(mu, nu, "wasserstein_inf")
    _check_max_iter(max_iter)
    a_all, b_all = _simplex(_np64(mu.weights)), _simplex(_np64(nu.weights))
    rows, cols = np.flatnonzero(a_all > 0), np.flatnonzero(b_all > 0)
    a, b = _simplex(a_all[rows]), _simplex(b_all[cols])
    D = _distances_np(_np64(mu.points)[rows], _np64(nu.points)[cols], None)
    lower = max(D.min(axis=1).max(), D.min(axis=0).max())
    candidates = np.unique(D[D >= lower])
    tol = 4.0 * (mu.n + nu.n) * max(torch.finfo(mu.dtype).eps, torch.finfo(nu.dtype).eps)
    matching = len(a) == len(b) and _is_uniform(a) and _is_uniform(b)

    def feasible(k: int) -> bool:
        support = D <= float(candidates[k])
        if matching:
            from scipy.sparse import csr_matrix
            from scipy.sparse.csgraph import maximum_bipartite_matching

            match = maximum_bipartite_matching(csr_matrix(support), perm_type="column")
            return bool(np.all(match >= 0))
        plan, code = _emd(a, b, (~support).astype(np.float64), max_iter)
        if code != 1:
            raise TransportError(
                f"network simplex did not certify feasibility (POT result code {code}) after "
                f"max_iter={max_iter} iterations (POT numItermax); increase max_iter"
            )
        return float(plan[~support].sum()) <= tol

    # binary search for the first feasible candidate; the last (the max distance) always is
    t = candidates[bisect.bisect_left(range(len(candidates) - 1), True, key=feasible)]
    i, j = np.argwhere(D == t)[0]
    x64 = mu.points[int(rows[i])].to(torch.float64)
    y64 = nu.points[int(cols[j])].to(torch.float64)
    return _safe_root((x64 - y64).square().sum(), 2.0).to(mu.dtype)


# ---------------------------------------------------------------------------------------------
# conditional W_2
# ---------------------------------------------------------------------------------------------
def conditional_wasserstein(
    mu: DiracMeasure,
    nu: DiracMeasure,
    *,
    position_atol: float | None = None,
    max_iter: int = 1_000_000,
) -> Tensor:
    r"""Conditional (position-preserving) Wasserstein distance between causal measures.

    .. math::
        W_c(\mu,\nu)^2=\sum_t\rho(t)\,W_2(\mu_t,\nu_t)^2
                     =\min_{\pi\text{ keeps }t\text{ fixed}}\sum_{ij}\pi_{ij}\|x_i-y_j\|^2,

    where :math:`\rho` is the common position marginal and :math:`\mu_t,\nu_t` are the normalised
    conditionals at position :math:`t`. *Reconstruction* (docs/theory.md §B3). For two sequences of
    equal length, :math:`W_c(\mathrm m(X),\mathrm m(Y))=\|X-Y\|_F/\sqrt n` exactly.

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched causal measure (``positions`` set), points (n, d).
    nu : DiracMeasure
        Unbatched causal measure, points (m, d).
    position_atol : float, optional
        Positions closer than this are the same position. Default: four machine epsilons of the
        coarser dtype of the two measures (positions lie in [0, 1], so this is also relative), i.e.
        exact equality up to rounding; positions ``i/n`` of one sequence length are told apart for
        ``n`` up to ~10^6 in float32.
    max_iter : int, default 1_000_000
        Iteration cap of each per-position network simplex.

    Returns
    -------
    Tensor, shape ()
        :math:`W_c(\mu,\nu)`, dtype and device of ``mu.points``, differentiable in the points.

    Raises
    ------
    TypeError
        If an input is not a :class:`DiracMeasure`.
    ValueError
        If a measure is not causal, on batched measures, a dimension or device mismatch, or when
        the position marginals differ (then :math:`W_c=+\infty`).
    TransportError
        If a per-position network simplex hits ``max_iter``.

    Notes
    -----
    Positions are sorted and grouped by gaps larger than ``position_atol``. The position marginals
    agree when the masses per position differ by at most ``8 max(n, m, 16)`` machine epsilons of the
    coarser dtype; positions of zero mass on both sides are skipped. Each position is an independent
    transport problem solved as in :func:`optimal_transport` with :math:`p=2`.
    """
    check_measure_pair(mu, nu, "conditional_wasserstein")
    if mu.positions is None or nu.positions is None:
        raise ValueError(
            "conditional_wasserstein needs causal measures (positions set), got "
            f"mu causal={mu.is_causal}, nu causal={nu.is_causal}"
        )
    _check_max_iter(max_iter)
    if position_atol is None:
        position_atol = 4.0 * max(torch.finfo(mu.dtype).eps, torch.finfo(nu.dtype).eps)
    elif not position_atol >= 0:
        raise ValueError(f"position_atol must be non-negative, got {position_atol}")
    tol = _mass_tol(mu, nu)
    a, b = _simplex(_np64(mu.weights)), _simplex(_np64(nu.weights))
    x, y = _np64(mu.points), _np64(nu.points)
    s, r = _np64(mu.positions), _np64(nu.positions)

    # group positions: sort all, start a new group after a gap > position_atol
    allpos = np.sort(np.concatenate([s, r]))
    starts = np.concatenate([[True], np.diff(allpos) > position_atol])
    group_of_sorted = np.cumsum(starts) - 1
    labels_mu = group_of_sorted[np.searchsorted(allpos, s)]
    labels_nu = group_of_sorted[np.searchsorted(allpos, r)]

    plan = np.zeros((mu.n, nu.n), dtype=np.float64)
    for g in range(int(group_of_sorted[-1]) + 1):
        ii, jj = np.flatnonzero(labels_mu == g), np.flatnonzero(labels_nu == g)
        rho_mu, rho_nu = float(a[ii].sum()), float(b[jj].sum())
        if abs(rho_mu - rho_nu) > tol:
            t = allpos[np.flatnonzero(group_of_sorted == g)[0]]
            raise ValueError(
                f"position marginals differ: mass {rho_mu:.6g} in mu vs {rho_nu:.6g} in nu at "
                f"position {t:.6g} (W_c is infinite)"
            )
        if rho_mu <= tol and rho_nu <= tol:
            continue
        a_t, b_t = a[ii] / rho_mu, b[jj] / rho_nu
        M = _distances_np(x[ii], y[jj], 2)
        plan_t, _, _ = _solve_plan(a_t, b_t, M, max_iter=max_iter, on_failure="raise")
        plan[np.ix_(ii, jj)] = 0.5 * (rho_mu + rho_nu) * plan_t
    cost = _cost_from_plan(mu.points, nu.points, plan, 2.0)
    return _safe_root(cost, 2.0).to(mu.dtype)


# ---------------------------------------------------------------------------------------------
# entropic W_p (Sinkhorn)
# ---------------------------------------------------------------------------------------------
def _sinkhorn_log(
    log_a: Tensor,
    log_b: Tensor,
    C: Tensor,
    eps: float,
    *,
    max_iter: int,
    tol: float,
    scaling: float | None,
) -> tuple[Tensor, Tensor, Tensor, int]:
    r"""Log-domain Sinkhorn by POT's ``sinkhorn_log`` (torch backend); returns (log_plan, f, g, n_iter).

    POT keeps log-scalings :math:`u, v` with :math:`\pi = e^{u_i + v_j - C_{ij}/\varepsilon}`,
    updates ``v`` then ``u`` (so the returned plan has exact row marginals) and stops when the L2
    norm of the column-marginal error, checked every 10 iterations, is below its threshold; the
    threshold ``tol / sqrt(m)`` makes that L1 error at most ``tol``. The potentials returned are
    those of the module's convention :math:`\pi = a_ib_je^{(f_i + g_j - C_{ij})/\varepsilon}`:
    :math:`f = \varepsilon(u - \log a)`, set to 0 on atoms of zero mass (where they are
    arbitrary). Epsilon-scaling runs one iteration per stage, warm-started with ``f, g`` held.
    """
    ot = _import_ot()
    a, b = log_a.exp(), log_b.exp()
    live_a, live_b = torch.isfinite(log_a), torch.isfinite(log_b)
    u, v = torch.zeros_like(log_a), torch.zeros_like(log_b)
    e = eps

    def run(e: float, iters: int, thr: float, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor, int]:
        _, log = ot.bregman.sinkhorn_log(
            a, b, C, e, numItermax=iters, stopThr=thr, log=True, warn=False, warmstart=(u, v)
        )
        return log["log_u"], log["log_v"], int(log["niter"]) + 1

    def rescale(t: Tensor, log_w: Tensor, live: Tensor, e_old: float, e_new: float) -> Tensor:
        # hold the potential e (t - log w) fixed while e changes
        return torch.where(live, (e_old * (t - log_w)) / e_new + log_w, t)

    n_iter = 0
    if scaling is not None:  # epsilon-scaling: one sweep per stage from the cost scale down to eps
        e = max(float(C.max()), eps)
        while e > eps and n_iter < max_iter - 1:
            u, v, k = run(e, 1, 0.0, u, v)
            n_iter += k
            e_next = max(e * scaling, eps)
            u, v = rescale(u, log_a, live_a, e, e_next), rescale(v, log_b, live_b, e, e_next)
            e = e_next
    if e != eps:  # scaling stopped by max_iter above eps
        u, v = rescale(u, log_a, live_a, e, eps), rescale(v, log_b, live_b, e, eps)
    u, v, k = run(eps, max_iter - n_iter, tol / math.sqrt(C.shape[1]), u, v)
    n_iter += k
    log_plan = u[:, None] + v[None, :] - C / eps
    f = torch.where(live_a, eps * (u - log_a), torch.zeros_like(u))
    g = torch.where(live_b, eps * (v - log_b), torch.zeros_like(v))
    return log_plan, f, g, n_iter


def _cost_matrix(x: Tensor, y: Tensor, p: float) -> Tensor:
    """``||x_i - y_j||^p`` in the dtype of the inputs, without the cancelling expansion."""
    D = torch.cdist(x[None], y[None], compute_mode="donot_use_mm_for_euclid_dist")[0]
    return D.square() if p == 2 else D.pow(p)


def _entropic(
    mu: DiracMeasure,
    nu: DiracMeasure,
    dtype: torch.dtype,
    p: float,
    eps: float,
    *,
    max_iter: int,
    tol: float,
    scaling: float | None,
) -> tuple[Tensor, Tensor, Tensor, int, bool, float]:
    """Solve one entropic problem; returns (plan, cost, objective, n_iter, converged, error)."""
    x, y = mu.points.detach().to(dtype), nu.points.detach().to(dtype)
    log_a, log_b = mu.log_weights.detach().to(dtype), nu.log_weights.detach().to(dtype)
    C = _cost_matrix(x, y, p)
    log_plan, f, g, n_iter = _sinkhorn_log(
        log_a, log_b, C, eps, max_iter=max_iter, tol=tol, scaling=scaling
    )
    plan = log_plan.exp()
    # marginal error of the plan actually returned, summed in float64
    p64 = plan.to(torch.float64)
    err = float((p64.sum(1) - log_a.exp().to(torch.float64)).abs().sum())
    err += float((p64.sum(0) - log_b.exp().to(torch.float64)).abs().sum())
    cost = (plan * C).sum()
    # <pi, C> + eps KL(pi | a x b) = sum_ij pi_ij (f_i + g_j) + eps (1 - sum pi); log(pi/ab) is
    # (f + g - C)/eps on the support of a x b
    objective = (plan.sum(1) * f).sum() + (plan.sum(0) * g).sum() + eps * (1 - plan.sum())
    return plan, cost, objective, n_iter, err <= tol, err


def sinkhorn_wasserstein(
    mu: DiracMeasure,
    nu: DiracMeasure,
    *,
    eps: float,
    p: float = 2,
    max_iter: int = 1000,
    tol: float | None = None,
    debiased: bool = False,
    scaling: float | None = None,
    return_plan: bool = True,
) -> SinkhornResult:
    r"""Entropic approximation of :math:`W_p^p` by log-domain Sinkhorn iterations.

    Computes the plan :math:`\pi_\varepsilon=\arg\min_{\pi\in\Pi(a,b)}\langle\pi,M\rangle+
    \varepsilon\,\mathrm{KL}(\pi\,|\,a\otimes b)` with :math:`M_{ij}=\|x_i-y_j\|^p`, through the
    dual potentials

    .. math::
        g_j\leftarrow-\varepsilon\log\sum_i a_i e^{(f_i-M_{ij})/\varepsilon},\qquad
        f_i\leftarrow-\varepsilon\log\sum_j b_j e^{(g_j-M_{ij})/\varepsilon},\qquad
        \pi_{ij}=a_ib_je^{(f_i+g_j-M_{ij})/\varepsilon},

    and reports ``cost`` :math:`=\langle\pi_\varepsilon,M\rangle`. *Standard* (Cuturi 2013; the
    log-domain form of Peyré & Cuturi, *Computational Optimal Transport*, 2019, §4.4). The
    iterations are POT's ``ot.bregman.sinkhorn_log`` on its torch backend (imported on first use),
    in the promoted dtype of the two measures and on their device.

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched measure :math:`\sum_i a_i\delta_{x_i}`, points (n, d).
    nu : DiracMeasure
        Unbatched measure :math:`\sum_j b_j\delta_{y_j}`, points (m, d).
    eps : float
        Regularisation :math:`\varepsilon>0`, absolute, in the units of :math:`M` (length^p).
    p : float, default 2
        Exponent ``1 <= p < inf``.
    max_iter : int, default 1000
        Maximum number of Sinkhorn iterations (one ``g`` and one ``f`` update each) per problem.
    tol : float, optional
        Stop when the column-marginal error :math:`\|\pi^\top\mathbf 1-b\|_1`, checked every 10
        iterations, is at most ``tol`` (the rows are exact after each iteration); ``converged``
        then compares the error measured on the returned plan with ``tol``. Default ``1e-9`` in float64 and ``1e-5`` in lower precisions. Errors below about
        :math:`(\max M/\varepsilon)` machine epsilons are out of reach (see Notes).
    debiased : bool, default False
        Also solve the problems :math:`(a,a)` and :math:`(b,b)` and report the Sinkhorn divergence
        :math:`S_\varepsilon=\mathrm{OT}_\varepsilon(a,b)-\tfrac12(\mathrm{OT}_\varepsilon(a,a)+
        \mathrm{OT}_\varepsilon(b,b))` in ``divergence`` (and in ``distance``). ``cost`` and
        ``plan`` stay those of :math:`(a,b)`.
    scaling : float, optional
        If given, in (0, 1): :math:`\varepsilon`-scaling, one iteration per stage at
        :math:`\varepsilon_k=\max_{ij}M_{ij}\cdot\text{scaling}^k` down to ``eps`` before iterating
        at ``eps`` (these iterations count in ``n_iter``). Much faster for small ``eps``.
    return_plan : bool, default True
        Keep the (n, m) plan in the result.

    Returns
    -------
    SinkhornResult
        ``cost``, ``distance``, ``plan``, ``n_iter``, ``converged``, ``marginal_error``, ``eps``,
        ``objective`` and ``divergence``; tensors in the promoted dtype of the two measures, on
        their device.

    Raises
    ------
    TypeError
        If an input is not a :class:`DiracMeasure`.
    ValueError
        On batched measures, a dimension or device mismatch, ``p < 1``, ``eps <= 0``,
        ``max_iter < 1``, ``tol <= 0`` or ``scaling`` outside (0, 1).

    Notes
    -----
    **Bias.** At convergence :math:`0\le\langle\pi_\varepsilon,M\rangle-W_p^p\le\varepsilon\,
    \min(H(a),H(b))\le\varepsilon\log\min(n,m)`, with :math:`H` the Shannon entropy
    (docs/derivations/entropic_bias.md): the lower bound because :math:`\pi_\varepsilon` is a
    coupling, the upper one by comparing the entropic objective at :math:`\pi_\varepsilon` and at an
    exact plan. Before convergence the marginals are off by ``marginal_error`` and these bounds hold
    only approximately. The debiased divergence is a different quantity: it contains the entropic
    terms, is not :math:`W_p^p`, and can be slightly negative.

    **Numerics.** Every update is a ``logsumexp`` of :math:`(f\oplus g-M)/\varepsilon`, so nothing
    overflows for large costs and small ``eps`` (e.g. radius 100, ``eps=1e-3``), though many
    iterations (or ``scaling``) are then needed. The plain iteration needs roughly
    :math:`\max M/\varepsilon` iterations. The potentials are of the size of :math:`\max M`, so
    their rounding error is about :math:`\max M` times the machine epsilon; the exponents are
    meaningful only when ``eps`` is well above it (in float32 with radius 100, :math:`\max M\approx
    4\cdot10^4`, ``eps=1e-3`` is below the resolution: the result stays finite but is not an
    entropic plan; use float64). The computation runs under ``torch.no_grad``: the
    result carries no gradient. The full (n, m) cost matrix is formed (no chunking).
    """
    check_measure_pair(mu, nu, "sinkhorn_wasserstein")
    p = _check_p(p)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite number, got {eps}")
    _check_max_iter(max_iter)
    dtype = torch.promote_types(mu.dtype, nu.dtype)
    if tol is None:
        tol = 1e-9 if dtype == torch.float64 else 1e-5
    elif not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    if scaling is not None and not 0 < scaling < 1:
        raise ValueError(f"scaling must lie in (0, 1), got {scaling}")
    eps = float(eps)
    kw: dict[str, Any] = {"max_iter": max_iter, "tol": tol, "scaling": scaling}
    with torch.no_grad():
        plan, cost, objective, n_iter, converged, err = _entropic(mu, nu, dtype, p, eps, **kw)
        divergence = None
        distance = _safe_root(cost.clamp_min(0), p)
        if debiased:
            _, _, ot_aa, n_aa, conv_aa, err_aa = _entropic(mu, mu, dtype, p, eps, **kw)
            _, _, ot_bb, n_bb, conv_bb, err_bb = _entropic(nu, nu, dtype, p, eps, **kw)
            divergence = objective - 0.5 * (ot_aa + ot_bb)
            distance = _safe_root(divergence.clamp_min(0), p)
            n_iter += n_aa + n_bb
            converged = converged and conv_aa and conv_bb
            err = max(err, err_aa, err_bb)
    return SinkhornResult(
        cost=cost,
        distance=distance,
        plan=plan if return_plan else None,
        n_iter=n_iter,
        converged=converged,
        marginal_error=err,
        eps=eps,
        objective=objective,
        divergence=divergence,
    )
