r"""Matrix-free spectral drivers and certified spectral-norm bounds (docs/theory.md §B5).

Lower bounds come from iterative solvers that only see an operator through two closures,
``matvec(v) = J v`` and ``rmatvec(u) = J^T u``, acting on flat vectors with leading batch
dimensions: ``v`` has shape ``(*batch, N)`` and ``J v`` shape ``(*batch, M)``, each batch element
being an independent operator. Every iterate :math:`v` gives the certified lower bound
:math:`\|Jv\|/\|v\|\le\|J\|_2`.

Upper bounds need more structure:

* :func:`gram_iteration` for explicit matrices, with :func:`certify_upper`, an a posteriori
  Cholesky check that makes the bound robust to rounding;
* :func:`collatz_wielandt_bound` for nonnegative block-norm matrices (docs/certificates.md §5);
* :func:`rank_one_sigma_max`, the closed form of :math:`\sigma_{\max}(I + ab^\top)`.

Certificates are computed and returned in float64, the reference precision.

A caller may watch the iterative solvers run (:func:`observe_steps`): each step hands the
observer the values the step has already computed, so watching adds no product and changes no
arithmetic (the progress lines of :func:`meanfield.local_lipschitz` are made this way).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "SpectralResult",
    "certify_upper",
    "collatz_wielandt_bound",
    "fro_norm",
    "gram_iteration",
    "gram_sequence",
    "lanczos_svd",
    "observe_steps",
    "power_iteration",
    "rank_one_sigma_max",
    "rank_one_sigma_max_from_stats",
    "reorthogonalize",
    "spectral_norm_upper",
    "top_singular_value",
]

Operator = Callable[[Tensor], Tensor]

#: An observer of the solvers' steps: ``observer(sigma, residual, done)`` after each step, with
#: the step's estimate of :math:`\sigma_1` (``(*batch,)``), its residual
#: :math:`\|J^\top Jv-\sigma^2v\|` (Lanczos: the free estimate :math:`\sigma\beta_k|w_k|`; power:
#: the computed one) and the batch elements whose stopping rule holds. It must not modify them.
StepObserver = Callable[[Tensor, Tensor, Tensor], None]

_observer: ContextVar[StepObserver | None] = ContextVar("meanfield_step_observer", default=None)


@contextmanager
def observe_steps(observer: StepObserver | None) -> Iterator[None]:
    """Call ``observer`` after every step of :func:`lanczos_svd` and :func:`power_iteration`.

    For the solvers run inside the ``with`` block, in this thread (a context variable), nested
    calls included (the restarted Lanczos continuation of a certified run). ``None`` watches
    nothing. The observer only reads what the step computed: the solvers' results are the same,
    bit for bit, with and without it.
    """
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


U64 = torch.finfo(torch.float64).eps / 2  # unit roundoff of float64


def gamma_k(k: int, u: float = U64) -> float:
    r"""Higham's :math:`\gamma_k = ku/(1-ku)`, float64's ``u`` by default (``inf`` when :math:`ku\ge1`)."""
    ku = k * u
    return ku / (1.0 - ku) if ku < 1.0 else math.inf


@dataclass(frozen=True, eq=False)
class SpectralResult:
    r"""Outcome of an iterative top-singular-value solver.

    Attributes
    ----------
    sigma : Tensor, shape (*batch,)
        :math:`\|Jv\|` for the returned unit vector :math:`v`, computed from an explicit final
        product: a lower bound on :math:`\|J\|_2` (up to the rounding of that product).
    vector : Tensor, shape (*batch, N)
        Unit right singular vector estimate :math:`v`.
    residual : Tensor, shape (*batch,)
        :math:`\|J^\top Jv - \sigma^2 v\|`, computed explicitly.
    converged : Tensor of bool, shape (*batch,)
        Whether the solver's stopping rule was met (see the solver).
    n_iter : Tensor of int64, shape (*batch,)
        Iterations until the stopping rule was met (or the cap).
    n_matvec : Tensor of int64, shape (*batch,)
        Products with :math:`J` or :math:`J^\top` spent on this batch element, final checks
        included.
    history : Tensor, shape (n_steps, *batch)
        The estimate of :math:`\sigma_1` after each iteration.
    """

    sigma: Tensor
    vector: Tensor
    residual: Tensor
    converged: Tensor
    n_iter: Tensor
    n_matvec: Tensor
    history: Tensor


def _norm(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x, dim=-1)


def _finite_norm(x: Tensor) -> Tensor:
    """``_norm(x)``, recomputed where the sum of squares overflowed.

    There as ``m * ||x / m||`` with ``m = max|x|`` (no overflow of the squares).
    """
    nrm = _norm(x)
    if bool(torch.isfinite(nrm).all()):
        return nrm
    m = x.abs().amax(-1, keepdim=True)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return torch.where(torch.isfinite(nrm), nrm, _norm(x / safe) * m.squeeze(-1))


def _safe_div(x: Tensor, s: Tensor) -> Tensor:
    """``x / s[..., None]`` with zero where ``s == 0``."""
    s = s.unsqueeze(-1)
    return torch.where(s > 0, x / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(x))


def _check_start(x0: Tensor) -> Tensor:
    if x0.ndim < 1:
        raise ValueError("x0 must have shape (*batch, N)")
    nrm = _norm(x0)
    if bool((nrm == 0).any()) or not bool(torch.isfinite(nrm).all()):
        raise ValueError("x0 must be finite and nonzero in every batch element")
    return x0 / nrm.unsqueeze(-1)


def power_iteration(
    matvec: Operator,
    rmatvec: Operator,
    x0: Tensor,
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
) -> SpectralResult:
    r"""Plain power iteration on :math:`J^\top J` (docs/theory.md §B5), kept as the baseline.

    :math:`v \leftarrow J^\top Jv/\|J^\top Jv\|`, where :math:`Jv` is the *tangent* output of a
    forward-mode product. The estimate :math:`\sigma_k = \|Jv_k\|` is a lower bound at every step.
    The stopping rule is the residual test of :func:`lanczos_svd`,
    :math:`\|J^\top Jv-\sigma^2v\|\le\mathrm{tol}\,\sigma^2`, evaluated on the products the
    iteration computes anyway (docs/rounding.md §7). The released code stopped on the relative
    change :math:`|\sigma_k-\sigma_{k-1}|\le\mathrm{tol}\,\sigma_k`, which can report
    convergence far from :math:`\sigma_1` when the iteration stalls; ``converged`` now means the
    residual test holds for the returned vector. The rate is :math:`(\sigma_2/\sigma_1)^{2k}`.

    Parameters
    ----------
    matvec, rmatvec, x0, tol
        As in :func:`lanczos_svd`.
    max_iter : int, default 1000
        Iteration cap (two products per iteration).

    Returns
    -------
    SpectralResult
        ``sigma`` and ``residual`` refer to the returned vector exactly (no extra products).
    """
    v = _check_start(x0)
    batch = v.shape[:-1]
    dev = v.device
    tiny = torch.finfo(v.dtype).tiny
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    out_v = v.clone()
    out_sigma = torch.zeros(batch, dtype=v.dtype, device=dev)
    out_res = torch.zeros(batch, dtype=v.dtype, device=dev)
    n_iter = torch.zeros(batch, dtype=torch.int64, device=dev)
    history = []
    observer = _observer.get()
    for _ in range(max(int(max_iter), 1)):
        w = matvec(v)
        sigma = _finite_norm(w)
        z = rmatvec(w)
        # in float32 the squares of entries near 1e19 overflow: the norms are then rescaled
        res = _finite_norm(z - sigma.square().unsqueeze(-1) * v)
        history.append(torch.where(done, out_sigma, sigma))
        active = ~done
        n_iter = n_iter + active.to(torch.int64)
        out_v = torch.where(active.unsqueeze(-1), v, out_v)
        out_sigma = torch.where(active, sigma, out_sigma)
        out_res = torch.where(active, res, out_res)
        # residual rule (docs/rounding.md §7): the same test as lanczos_svd, not a relative change
        done = done | (active & ((res <= tol * sigma.square()) | (sigma <= tiny)))
        if observer is not None:
            observer(out_sigma, out_res, done)
        if bool(done.all()):
            break
        v = torch.where(active.unsqueeze(-1), _safe_div(z, _finite_norm(z)), v)
        # an operator with J^T J v = 0 leaves v = 0: the estimate 0 is then exact
        zero = (v == 0).all(-1)
        if bool(zero.any()):
            done = done | zero
            v = torch.where(zero.unsqueeze(-1), out_v, v)
    return SpectralResult(
        sigma=out_sigma,
        vector=out_v,
        residual=out_res,
        converged=done,
        n_iter=n_iter,
        n_matvec=2 * n_iter,
        history=torch.stack(history),
    )


def reorthogonalize(r: Tensor, basis: Tensor) -> Tensor:
    """Remove from ``r`` (*batch, N) its components along the rows of ``basis`` (*batch, k, N)."""
    for _ in range(2):  # classical Gram-Schmidt, twice is enough
        coef = (basis @ r.unsqueeze(-1)).squeeze(-1)
        r = r - (coef.unsqueeze(-2) @ basis).squeeze(-2)
    return r


def lanczos_svd(
    matvec: Operator,
    rmatvec: Operator,
    x0: Tensor,
    *,
    tol: float = 1e-6,
    max_iter: int = 300,
    krylov_dim: int = 32,
) -> SpectralResult:
    r"""Top singular triplet by Golub–Kahan–Lanczos bidiagonalisation (docs/theory.md §B5).

    Builds :math:`JV_k = U_kB_k`, :math:`J^\top U_k = V_kB_k^\top + \beta_kv_{k+1}e_k^\top` with
    full (two-pass) reorthogonalisation of both bases, and takes the top singular triplet
    :math:`(\sigma, w, y)` of the bidiagonal :math:`B_k`. The Ritz vector :math:`v = V_ky`
    satisfies :math:`J^\top Jv - \sigma^2v = \sigma\beta_kw_k\,v_{k+1}`, so the stopping rule

    .. math:: \|J^\top Jv - \sigma^2v\| = \sigma\beta_k|w_k| \le \mathrm{tol}\,\sigma^2

    costs nothing. After ``krylov_dim`` steps without convergence the process restarts from the
    current Ritz vector (explicit restart), so memory is ``krylov_dim x (N + M)`` per batch
    element. At the end the returned vector is checked with two explicit products: ``sigma =
    ||Jv||`` (a true lower bound) and the explicit residual; ``converged`` requires the explicit
    residual to satisfy the rule.

    A residual :math:`r` bounds the distance from :math:`\sigma^2` to *some* eigenvalue of
    :math:`J^\top J` by :math:`r`; Lanczos from a random start converges to the top one.

    Parameters
    ----------
    matvec, rmatvec : callable
        :math:`v\mapsto Jv` on ``(*batch, N)`` and :math:`u\mapsto J^\top u` on ``(*batch, M)``.
    x0 : Tensor, shape (*batch, N)
        Starting vector(s), nonzero.
    tol : float, default 1e-6
        Relative residual tolerance on :math:`J^\top J`.
    max_iter : int, default 300
        Cap on bidiagonalisation steps (two products each), restarts included.
    krylov_dim : int, default 32
        Basis size before a restart.

    Returns
    -------
    SpectralResult
    """
    v1 = _check_start(x0)
    batch = v1.shape[:-1]
    dev, dt = v1.device, v1.dtype
    krylov_dim = max(int(krylov_dim), 2)
    max_iter = max(int(max_iter), 1)
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    out_v = v1.clone()
    n_iter = torch.zeros(batch, dtype=torch.int64, device=dev)
    n_mv = torch.zeros(batch, dtype=torch.int64, device=dev)
    history: list[Tensor] = []
    best = torch.zeros(batch, dtype=dt, device=dev)
    tiny = torch.finfo(dt).tiny
    broken = torch.zeros(batch, dtype=torch.bool, device=dev)
    steps = 0
    observer = _observer.get()
    Vb = v1.new_zeros(batch + (krylov_dim + 1, v1.shape[-1]))  # right basis, rows v_1, v_2, ...
    Ub: Tensor | None = None  # left basis, allocated after the first product
    while steps < max_iter and not bool(done.all()):
        Vb[..., 0, :] = v1
        p = matvec(v1)
        if Ub is None:
            Ub = p.new_zeros(batch + (krylov_dim + 1, p.shape[-1]))
        n_mv = n_mv + (~done).to(torch.int64)
        alpha = _norm(p)
        Ub[..., 0, :] = _safe_div(p, alpha)
        alphas, betas = [alpha], []
        for k in range(1, krylov_dim + 1):
            r = rmatvec(Ub[..., k - 1, :]) - alphas[-1].unsqueeze(-1) * Vb[..., k - 1, :]
            r = reorthogonalize(r, Vb[..., :k, :])
            beta = _norm(r)
            betas.append(beta)
            n_mv = n_mv + (~done).to(torch.int64)
            steps += 1
            n_iter = n_iter + (~done).to(torch.int64)
            # bidiagonal B_k: alpha on the diagonal, beta_1..beta_{k-1} above it
            Bk = torch.diag_embed(torch.stack(alphas, dim=-1))
            Bk = Bk + torch.diag_embed(torch.stack(betas, dim=-1)[..., :-1], offset=1)
            # a non-finite product (overflow in the operator) must not reach LAPACK: such batch
            # elements stop here, unconverged (docs/rounding.md §5)
            bad = ~torch.isfinite(Bk).flatten(-2).all(-1) | ~torch.isfinite(beta)
            if bool(bad.any()):
                broken = broken | bad
                Bk = torch.where(bad[..., None, None], torch.zeros_like(Bk), Bk)
                beta = torch.where(bad, torch.zeros_like(beta), beta)
            Wl, S, Yh = torch.linalg.svd(Bk)
            sigma = S[..., 0]
            est = sigma * beta * Wl[..., -1, 0].abs()
            ritz = (Yh[..., 0, :].unsqueeze(-2) @ Vb[..., :k, :]).squeeze(-2)
            ritz = _safe_div(ritz, _norm(ritz))
            active = ~done
            best = torch.where(active, sigma, best)
            history.append(best.clone())
            out_v = torch.where(active.unsqueeze(-1), ritz, out_v)
            done = done | (active & ((est <= tol * sigma.square()) | (sigma <= tiny) | broken))
            if observer is not None:
                observer(best, est, done)
            if bool(done.all()) or steps >= max_iter or k == krylov_dim:
                break
            Vb[..., k, :] = _safe_div(r, torch.where(beta > tiny, beta, torch.zeros_like(beta)))
            p = matvec(Vb[..., k, :]) - beta.unsqueeze(-1) * Ub[..., k - 1, :]
            p = reorthogonalize(p, Ub[..., :k, :])
            n_mv = n_mv + (~done).to(torch.int64)
            alpha = _norm(p)
            alphas.append(alpha)
            Ub[..., k, :] = _safe_div(p, torch.where(alpha > tiny, alpha, torch.zeros_like(alpha)))
        v1 = out_v
    # explicit sigma = ||J v|| and residual ||J^T J v - sigma^2 v|| for the unit vector returned
    w = matvec(out_v)
    sigma = _norm(w)
    residual = _norm(rmatvec(w) - sigma.square().unsqueeze(-1) * out_v)
    converged = (residual <= tol * sigma.square()) | (sigma <= tiny)
    converged = converged & ~broken & torch.isfinite(sigma) & torch.isfinite(residual)
    return SpectralResult(
        sigma=sigma,
        vector=out_v,
        residual=residual,
        converged=converged,
        n_iter=n_iter,
        n_matvec=n_mv + 2,
        history=torch.stack(history) if history else sigma.unsqueeze(0),
    )


def top_singular_value(
    matvec: Operator,
    rmatvec: Operator,
    x0: Tensor,
    *,
    method: str = "lanczos",
    tol: float = 1e-6,
    max_iter: int | None = None,
    krylov_dim: int = 32,
) -> SpectralResult:
    """Top singular value of a matrix-free operator: ``method`` in {"lanczos", "power"}.

    See :func:`lanczos_svd` and :func:`power_iteration`; ``max_iter`` defaults to 300 and 1000.
    """
    cap = {} if max_iter is None else {"max_iter": max_iter}  # else the solver's own default
    if method == "lanczos":
        return lanczos_svd(matvec, rmatvec, x0, tol=tol, krylov_dim=krylov_dim, **cap)
    if method == "power":
        return power_iteration(matvec, rmatvec, x0, tol=tol, **cap)
    raise ValueError(f"method must be 'lanczos' or 'power', got {method!r}")


# ---------------------------------------------------------------------------- Gram iteration
def fro_norm(G: Tensor) -> Tensor:
    """Frobenius norm over the last two axes without overflow (scaled by the largest entry).

    Real for real or complex ``G``.
    """
    a = G.abs().amax((-2, -1))
    safe = torch.where(a > 0, a, torch.ones_like(a))
    return torch.linalg.matrix_norm(G / safe[..., None, None]) * a


def _smaller_side(W: Tensor) -> Tensor:
    """``W`` (…, p, q) transposed if needed so that ``W^T W`` is (…, min, min)."""
    return W.mT if W.shape[-1] > W.shape[-2] else W


def _gram_step(G: Tensor, ell: Tensor, t: int) -> tuple[Tensor, Tensor, Tensor]:
    """Squaring step ``t`` of the rescaled Gram matrix ``G`` (log-scale ``ell``): (G, ell, bound)."""
    f = fro_norm(G)
    safe = torch.where(f > 0, f, torch.ones_like(f))
    G = G / safe[..., None, None]
    ell = 2 * (ell + torch.log(safe))
    G = G.mT @ G
    scale = 2.0**-t
    val = fro_norm(G).pow(scale) * torch.exp(scale * ell)
    return G, ell, torch.where(f > 0, val, torch.zeros_like(val))


def gram_sequence(W: Tensor, n_iter: int) -> Tensor:
    r"""All Gram-iteration estimates :math:`\hat\sigma_0,\dots,\hat\sigma_T` (docs/theory.md §B5).

    :math:`\hat\sigma_t = \big(\sum_i\sigma_i^{2^{t+1}}\big)^{2^{-(t+1)}}`, the Schatten
    :math:`2^{t+1}` norm: non-increasing in :math:`t` and
    :math:`\sigma_1\le\hat\sigma_t\le r^{2^{-(t+1)}}\sigma_1` (:math:`r` the rank) in exact
    arithmetic. Algorithm (Delattre et al., ICML 2023; public code blaisedelattre/lip4conv):
    transpose to the smaller side, :math:`G\leftarrow W`, :math:`\ell\leftarrow0`; repeat
    :math:`f\leftarrow\|G\|_F`, :math:`G\leftarrow G/f`, :math:`\ell\leftarrow2(\ell+\log f)`,
    :math:`G\leftarrow G^\top G`; return :math:`\|G\|_F^{2^{-t}}\exp(2^{-t}\ell)`. Computed in
    float64 (*standard*; guarantee derived).

    Parameters
    ----------
    W : Tensor, shape (..., p, q)
    n_iter : int
        Number of squaring steps ``T >= 0``.

    Returns
    -------
    Tensor, float64, shape (T + 1, ...)
    """
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    G = _smaller_side(W.to(torch.float64))
    ell = torch.zeros(G.shape[:-2], dtype=torch.float64, device=G.device)
    out = [fro_norm(G)]
    for t in range(1, n_iter + 1):
        G, ell, val = _gram_step(G, ell, t)
        out.append(val)
    return torch.stack(out)


def gram_iteration(W: Tensor, n_iter: int) -> Tensor:
    r"""Gram-iteration upper bound :math:`\hat\sigma_T\ge\|W\|_2` (docs/theory.md §B5).

    See :func:`gram_sequence` for the algorithm and guarantees. The bound holds in exact
    arithmetic; use :func:`certify_upper` (or :func:`spectral_norm_upper`) for a bound that is
    robust to rounding.

    Parameters
    ----------
    W : Tensor, shape (..., p, q)
    n_iter : int
        Number of squaring steps ``T``.

    Returns
    -------
    Tensor, float64, shape (...)
    """
    return gram_sequence(W, n_iter)[-1]


def certify_upper(W: Tensor, s: Tensor | float) -> Tensor:
    r"""Check a posteriori that :math:`s\ge\|W\|_2`, robustly to rounding (docs/theory.md §B5).

    With :math:`m` the smaller side and :math:`k` the larger one, form in float64
    :math:`M = (1-\delta)I - \mathrm{fl}(W_s^\top W_s)`, :math:`W_s = W/s`, and attempt its
    Cholesky factorisation. The margin :math:`\delta` dominates every rounding error:

    * the Gram product: :math:`\|\mathrm{fl}(W_s^\top W_s) - W_s^\top W_s\|_2\le(\gamma_k+4u)
      \|W_s\|_F^2` (scaling by :math:`1/s` included);
    * the diagonal subtraction: :math:`u(1+\max_i G_{ii})`;
    * Cholesky (Demmel): success means :math:`M + \Delta M = \hat R^\top\hat R\succeq0` with
      :math:`\|\Delta M\|_2\le\gamma_{m+1}\|\hat R\|_F^2\le\gamma_{m+1}\operatorname{tr}M/(1-
      \gamma_{m+1})`;

    and :math:`\delta` is twice their sum. Success therefore proves
    :math:`s^2I - W^\top W\succeq0`. The check certifies the matrix *as stored*; the error made in
    computing ``W`` itself is the caller's business.

    Parameters
    ----------
    W : Tensor, shape (..., p, q)
    s : Tensor of shape (...) or float
        Candidate upper bounds.

    Returns
    -------
    Tensor of bool, shape (...)
        ``True`` where the bound is certified. ``s = +inf`` is always certified; ``s <= 0`` only
        for ``W = 0``; NaN never.
    """
    W = _smaller_side(W.to(torch.float64))
    m, k = W.shape[-1], W.shape[-2]
    s = torch.as_tensor(s, dtype=torch.float64, device=W.device).expand(W.shape[:-2])
    finite_pos = torch.isfinite(s) & (s > 0)
    s_safe = torch.where(finite_pos, s, torch.ones_like(s))
    Ws = W / s_safe[..., None, None]
    G = Ws.mT @ Ws
    fro2 = Ws.square().sum((-2, -1))
    eye = torch.eye(m, dtype=torch.float64, device=W.device)
    M0 = eye - G
    tr0 = torch.diagonal(M0, dim1=-2, dim2=-1).sum(-1).clamp_min(0)
    g1 = gamma_k(m + 1)
    err = (
        g1 / (1 - g1) * tr0
        + (gamma_k(k) + 4 * U64) * fro2
        + U64 * (1 + torch.diagonal(G, dim1=-2, dim2=-1).amax(-1))
    )
    delta = 2 * err + 4 * U64
    M = M0 - delta[..., None, None] * eye
    M = torch.where(finite_pos[..., None, None], M, eye.expand_as(M))
    _, info = torch.linalg.cholesky_ex(M)
    ok = (info == 0) & (delta < 1) & torch.isfinite(fro2)
    zero_W = W.abs().amax((-2, -1)) == 0
    ok = torch.where(finite_pos, ok, zero_W & (s >= 0)) | (s == torch.inf)
    return ok & ~torch.isnan(s)


def spectral_norm_upper(
    W: Tensor,
    *,
    candidate: Tensor | None = None,
    rtol: float = 1e-9,
    max_iter: int = 60,
) -> Tensor:
    r"""Certified upper bound on :math:`\|W\|_2`: Gram iteration plus :func:`certify_upper`.

    Gram iteration (:func:`gram_sequence`) runs until its relative decrease falls below
    ``rtol`` (or, with a ``candidate``, until it is within ``rtol`` of it), for at most
    ``max_iter`` steps. Since :math:`\log\hat\sigma_{t+1}-\log\sigma_1\le\frac12(\log\hat
    \sigma_t-\log\sigma_1)`, a decrease :math:`\le\rho` implies a remaining excess
    :math:`\le\rho`, so the rule is rigorous. The smaller of the Gram value and the optional
    ``candidate`` (e.g. an SVD value, which makes the bound tight even when the top singular value
    is degenerate and Gram iteration converges slowly) is inflated by the rounding margin of
    :func:`certify_upper` and certified; on failure the inflation grows geometrically (at most 12
    times), then the Gram value alone is tried, and finally ``+inf`` is returned.

    Parameters
    ----------
    W : Tensor, shape (..., p, q)
    candidate : Tensor, shape (...), optional
        A near-exact value to certify.
    rtol : float, default 1e-9
        Relative stopping rule of the Gram iteration.
    max_iter : int, default 60
        Cap on Gram steps (0: the Frobenius norm is the fallback).

    Returns
    -------
    Tensor, float64, shape (...)
    """
    W64 = _smaller_side(W.to(torch.float64))
    m = W64.shape[-1]
    G = W64
    ell = torch.zeros(G.shape[:-2], dtype=torch.float64, device=G.device)
    gram = fro_norm(G)
    ref = None if candidate is None else candidate.to(torch.float64)
    for t in range(1, int(max_iter) + 1):
        if ref is not None and bool((gram <= ref * (1 + rtol)).all()):
            break
        G, ell, val = _gram_step(G, ell, t)
        dec = (gram - val) / torch.where(gram > 0, gram, torch.ones_like(gram))
        gram = torch.minimum(gram, val)
        if bool((dec <= rtol).all()):
            break
    base = gram if ref is None else torch.minimum(gram, ref)
    infl = 8 * gamma_k(m + 1) * m + 16 * U64
    out = torch.full_like(base, torch.inf)
    pending = torch.ones_like(base, dtype=torch.bool)
    for value in [base] * 12 + [gram]:  # the last try: the Gram value alone
        s = value * (1 + infl)
        ok = certify_upper(W64, s) & pending
        out = torch.where(ok, s, out)
        pending = pending & ~ok
        if not bool(pending.any()):
            break
        infl *= 8
    return out


# ------------------------------------------------------------------- Collatz–Wielandt bound
def collatz_wielandt_bound(N: Tensor, n_steps: int = 64, *, rtol: float = 1e-10) -> Tensor:
    r"""Certified upper bound on :math:`\|N\|_2` for a nonnegative ``N`` (docs/theory.md §B5).

    For nonnegative :math:`M = N^\top N` and any entrywise positive :math:`v`,
    :math:`\rho(M)\le\max_i(Mv)_i/v_i` (Collatz–Wielandt), so
    :math:`\|N\|_2\le\big(\max_i(N^\top Nv)_i/v_i\big)^{1/2}`. Starting from :math:`v=\mathbf 1`,
    a few steps :math:`v\leftarrow N^\top Nv` (floored at a tiny positive value) sharpen the
    bound; the minimum over steps is returned. Iteration stops early once the bound is within
    ``rtol`` of the Rayleigh lower bound :math:`(v^\top Mv/v^\top v)^{1/2}`. Products of
    nonnegative numbers have relative rounding errors at most :math:`\gamma_{p+q}`, so the result
    is inflated by that factor (*standard*).

    Parameters
    ----------
    N : Tensor, shape (..., p, q)
        Nonnegative matrices.
    n_steps : int, default 64
        Power steps after the all-ones vector.
    rtol : float, default 1e-10
        Early-stopping gap.

    Returns
    -------
    Tensor, float64, shape (...)
    """
    N = N.to(torch.float64)
    if bool((N < 0).any()):
        raise ValueError("collatz_wielandt_bound needs an entrywise nonnegative matrix")
    p, q = N.shape[-2], N.shape[-1]
    v = torch.ones(N.shape[:-2] + (q,), dtype=torch.float64, device=N.device)
    best = torch.full(N.shape[:-2], torch.inf, dtype=torch.float64, device=N.device)
    infl = 1 + 4 * gamma_k(p + q + 2)
    floor = 1e-200
    for _ in range(int(n_steps) + 1):
        w = (N.mT @ (N @ v.unsqueeze(-1))).squeeze(-1)
        ratio = (w / v).amax(-1)
        best = torch.minimum(best, (ratio * infl).sqrt() * infl)
        low = ((v * w).sum(-1) / v.square().sum(-1)).sqrt()
        if bool((best <= low * (1 + rtol)).all()):
            break
        top = w.amax(-1, keepdim=True)
        v = torch.where(top > 0, w / torch.where(top > 0, top, torch.ones_like(top)), v)
        v = v.clamp_min(floor)
    return best


# ---------------------------------------------------------------------- rank-one closed form
def rank_one_sigma_max_from_stats(t: Tensor, p: Tensor, d: int) -> Tensor:
    r""":math:`\sigma_{\max}(I+ab^\top)` from :math:`t = a^\top b` and :math:`p = \|a\|^2\|b\|^2`.

    For :math:`d\ge2` (docs/theory.md §B5, *standard*),

    .. math:: \sigma_{\max}^2 = \tfrac12\big(S + \sqrt{S^2 - 4(1+t)^2}\big),\qquad
              S = 2 + 2t + p,

    evaluated through :math:`S^2-4(1+t)^2 = p\,(4 + 4t + p) = p\,\big((2+t)^2 + (p - t^2)\big)
    \ge0`; the other singular values are 1. The value is increasing in both :math:`t` and
    :math:`p`, so over-estimating them gives an upper bound. For :math:`d = 1` it is
    :math:`|1+t|`.

    Parameters
    ----------
    t, p : Tensor, broadcastable
    d : int
        Dimension of :math:`a` and :math:`b`.

    Returns
    -------
    Tensor
    """
    if d == 1:
        return (1 + t).abs()
    disc = p * (4 + 4 * t + p).clamp_min(0)
    s2 = 0.5 * (2 + 2 * t + p + disc.sqrt())
    return s2.clamp_min(1.0).sqrt()


def rank_one_sigma_max(a: Tensor, b: Tensor) -> Tensor:
    r"""Largest singular value of :math:`I + ab^\top` for vectors ``a``, ``b`` (…, d), batched.

    See :func:`rank_one_sigma_max_from_stats` for the closed form (:math:`d\ge2` and
    :math:`d=1` cases).

    Returns
    -------
    Tensor, shape (...)
    """
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"a and b must have the same last dimension, got {a.shape} and {b.shape}")
    t = (a * b).sum(-1)
    p = a.square().sum(-1) * b.square().sum(-1)
    return rank_one_sigma_max_from_stats(t, p, a.shape[-1])
