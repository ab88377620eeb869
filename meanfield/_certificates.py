r"""Probabilistic upper certificates for matrix-free spectral norms (docs/certificates.md).

A Krylov method started from a random vector cannot certify :math:`\|J\|_2` deterministically,
but it can with a stated probability: for :math:`A = J^\top J` (symmetric positive semidefinite,
of size :math:`N`) and a start :math:`b` uniform on the unit sphere, the largest Ritz value
:math:`\theta_k` of :math:`A` on the Krylov space :math:`\mathcal K_k(A, b)` of dimension
:math:`k` satisfies (Kuczyński & Woźniakowski 1992, Lanczos case, exact arithmetic)

.. math:: \Pr\big[\theta_k < (1-\varepsilon)\lambda_{\max}(A)\big]
          \le 1.648\sqrt N\,e^{-\sqrt\varepsilon\,(2k-1)},\qquad 0<\varepsilon<1 .

Golub–Kahan–Lanczos bidiagonalisation with :math:`k` steps from :math:`v_1 = b` spans exactly
:math:`\mathcal K_k(J^\top J, b)` with its right basis, and the top singular value of the
bidiagonal :math:`B_k` is :math:`\theta_k^{1/2}`. Solving the bound for :math:`\varepsilon` at a
failure probability :math:`\delta` gives, with probability at least :math:`1-\delta` over the
start vector,

.. math:: \|J\|_2\le\theta_k^{1/2}/\sqrt{1-\varepsilon_k(\delta)},\qquad
          \sqrt{\varepsilon_k(\delta)} = \frac{\ln(1.648\sqrt N/\delta)}{2k-1}.

Restarting from the Ritz vector can only raise the Ritz value, so the certificate may use the
final Ritz value with the dimension of the *first* cycle.

The theorem holds for a step count fixed in advance, but a run chooses where it stops (the
residual rule, or the width of the bracket). The bound at step :math:`k` is therefore taken at
failure probability :math:`\delta_k = \delta/(k(k+1))` (:func:`kw_delta`): the events of all
steps together fail with probability at most :math:`\sum_k\delta_k = \delta`, so the bound at
whichever step the run stops holds with probability at least :math:`1-\delta`
(docs/certificates.md §1).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._spectral import SpectralResult, lanczos_svd, reorthogonalize

Operator = Callable[[Tensor], Tensor]

#: Constant of the Kuczyński–Woźniakowski Lanczos failure bound.
KW_CONSTANT = 1.648


def kw_epsilon(N: int, k: int, delta: float) -> float:
    r"""Relative eigenvalue error :math:`\varepsilon` certified after ``k`` Lanczos steps.

    The smallest :math:`\varepsilon` with :math:`1.648\sqrt N e^{-\sqrt\varepsilon(2k-1)}\le
    \delta`; ``inf`` when it is not below 1 (no certificate) or when ``k < 2``.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if k < 2 or N < 1:
        return math.inf
    if N == 1:
        return 0.0  # the Ritz value of a 1 x 1 matrix is exact
    root = math.log(KW_CONSTANT * math.sqrt(N) / delta) / (2 * k - 1)
    eps = max(root, 0.0) ** 2
    return eps if eps < 1.0 else math.inf


def kw_factor(N: int, k: int, delta: float) -> float:
    r"""Factor :math:`1/\sqrt{1-\varepsilon_k(\delta)}` on singular values (``inf`` if none)."""
    eps = kw_epsilon(N, k, delta)
    return 1.0 / math.sqrt(1.0 - eps) if eps < 1.0 else math.inf


def kw_delta(delta: float, k: int) -> float:
    r"""Failure probability spent on step ``k`` of a run that stops when it chooses.

    :math:`\delta_k = \delta/(k(k+1))`, whose sum over :math:`k\ge1` is :math:`\delta`: a bound
    taken at :math:`\delta_k` at every step holds at all steps at once, and so at the stopping
    step, with probability at least :math:`1-\delta` (docs/certificates.md §1).
    """
    return delta / (k * (k + 1))


def kw_union_factor(N: int, k: int, delta: float) -> float:
    r""":func:`kw_factor` at step ``k`` with the union bound over stopping steps (:func:`kw_delta`)."""
    if k < 1:
        return math.inf
    return kw_factor(N, k, kw_delta(delta, k))


def kw_steps(N: int, delta: float, rtol: float, margin: float = 0.0) -> int:
    r"""Fewest Krylov steps whose union-bound factor times ``1 + margin`` is at most ``1 + rtol``.

    The factor is :func:`kw_union_factor` (the step is chosen by the run). Raises
    ``ValueError`` when ``1 + rtol`` cannot absorb the rounding margin.
    """
    if rtol <= 0:
        raise ValueError(f"rtol must be positive, got {rtol!r}")
    target = (1.0 + rtol) / (1.0 + margin)
    if target <= 1.0:
        raise ValueError(f"rtol = {rtol} cannot absorb the rounding margin {margin:.3g}")
    eps = 1.0 - 1.0 / target**2
    root = math.log(KW_CONSTANT * math.sqrt(max(N, 1)) / delta)
    k = max(math.ceil((root / math.sqrt(eps) + 1.0) / 2.0), 2)
    # the union bound raises the log term by ln(k(k+1)): step up to the fixed point
    while kw_union_factor(N, k, delta) * (1.0 + margin) > 1.0 + rtol:
        k += 1
    return k


def krylov_rounding_margin(n: int, d: int, k: int, dtype: torch.dtype) -> float:
    r"""Relative margin on the Ritz singular value for rounding in ``dtype``.

    The first-order model of the products' evaluation (:math:`64(n+d)u`, as for the other
    margins of :mod:`meanfield.lipschitz`) plus :math:`16ku` for a Krylov recursion of ``k``
    steps with full reorthogonalisation (docs/certificates.md §4).
    """
    u = torch.finfo(dtype).eps / 2
    return (64 * (n + d) + 16 * k) * u


def start_component_bound(N: int, delta: float) -> float:
    r"""A :math:`t` with :math:`\Pr[|\langle b, u\rangle| < t]\le\delta` for ``b`` uniform on the sphere.

    For any fixed unit :math:`u`, :math:`\langle b, u\rangle` has density
    :math:`c_N(1-x^2)^{(N-3)/2}\le c_N` on :math:`[-1, 1]` with
    :math:`c_N = \Gamma(N/2)/(\sqrt\pi\,\Gamma((N-1)/2))\le\sqrt{N/(2\pi)}` (Gautschi), so
    :math:`t = \delta\sqrt{\pi/(2N)}` works (:math:`N\ge3`).
    """
    if N < 3:
        raise ValueError("start_component_bound needs N >= 3")
    return delta * math.sqrt(math.pi / (2 * N))


def lanczos_polynomial_upper(
    alphas: Tensor, betas: Tensor, sigmas: Tensor, N: int, delta: float
) -> Tensor:
    r"""Gap-aware probabilistic bound on :math:`\|J\|_2` from one Golub–Kahan cycle.

    With :math:`T_k = B_k^\top B_k` the Lanczos matrix of :math:`A = J^\top J`, its monic
    characteristic polynomial :math:`p_k` (roots :math:`\theta_i = \sigma_i(B_k)^2`) satisfies
    :math:`p_k(A)b = \big(\prod_j\alpha_j\beta_j\big)v_{k+1}`, so
    :math:`|\langle b, u_1\rangle|\,p_k(\lambda_{\max})\le\prod_j\alpha_j\beta_j`. On
    :math:`(\theta_1,\infty)` :math:`p_k` is positive and increasing, hence, when
    :math:`|\langle b, u_1\rangle|\ge t` (probability :math:`\ge1-\delta`,
    :func:`start_component_bound`), :math:`\lambda_{\max}\le\lambda^*` with
    :math:`p_k(\lambda^*) = \prod_j\alpha_j\beta_j/t`. Solved by bisection in the log domain.

    Parameters
    ----------
    alphas, betas : Tensor, shape (*batch, k)
        Diagonal and superdiagonal (the last one is the residual norm) of the bidiagonalisation.
    sigmas : Tensor, shape (*batch, k)
        Singular values of :math:`B_k`, descending.

    Returns
    -------
    Tensor, float64, shape (*batch,): :math:`(\lambda^*)^{1/2}` (``sigmas[..., 0]`` where the
    products vanish).
    """
    f64 = torch.float64
    a, b, s = alphas.to(f64), betas.to(f64), sigmas.to(f64)
    theta = s.square()
    top = theta[..., 0]
    with torch.no_grad():
        L = a.log().sum(-1) + b.log().sum(-1) - math.log(start_component_bound(N, delta))
    k = theta.shape[-1]
    lo = torch.zeros_like(top)
    hi = torch.exp(L / k).clamp_min(0)  # p(top + h) >= h^k, so h* <= exp(L / k)
    hi = torch.where(torch.isfinite(hi), hi, torch.full_like(hi, math.inf))
    # hi stays above the root throughout (it only moves to points where p >= its target), so the
    # loop may stop as soon as hi is known to 2^-44 of top + hi: the bound is then that much
    # looser at most, and is still a bound
    for i in range(200):
        mid = torch.where(torch.isfinite(hi), 0.5 * (lo + hi), 2 * lo + top + 1)
        val = (top.unsqueeze(-1) + mid.unsqueeze(-1) - theta).log().sum(-1)
        above = val >= L
        hi = torch.where(above, mid, hi)
        lo = torch.where(above, lo, mid)
        if i % 8 == 7 and bool(((hi - lo) <= 2.0**-44 * (top + hi)).all()):
            break
    h = torch.where(L == -math.inf, torch.zeros_like(hi), hi)
    return (top + h).sqrt()


def golub_kahan_certified(
    matvec: Operator,
    rmatvec: Operator,
    x0: Tensor,
    *,
    delta: float,
    rtol: float,
    margin: float,
    tol: float,
    max_iter: int,
    krylov_dim: int,
    accept: Callable[[Tensor, Tensor], Tensor] | None = None,
    reachable: Callable[[Tensor], Tensor] | None = None,
    require_residual: bool = True,
) -> tuple[SpectralResult, Tensor, Tensor]:
    r"""Golub–Kahan–Lanczos run until a probabilistic upper bound is tight enough.

    One unrestarted cycle with full (two-pass) reorthogonalisation. After each step :math:`k` two
    bounds are formed: the gap-aware Lanczos-polynomial bound
    (:func:`lanczos_polynomial_upper`) at failure probability :math:`\delta/2` (one event, the
    start's component along the top vector, covers every step) and the Kuczyński–Woźniakowski
    bound at :math:`\delta_k = (\delta/2)/(k(k+1))` (:func:`kw_union_factor`: the union over the
    steps where the run may stop). Their minimum, at whichever step the run stops, fails with
    probability at most :math:`\delta` (docs/certificates.md §1).

    The bound is *tight* when ``accept(sigma, bound)`` holds (default: ``bound <= (1 + rtol) *
    sigma``), with ``sigma`` the Ritz value and ``bound`` the smaller bound times ``1 + margin``.
    A batch element stops once it is tight and, with ``require_residual``, the residual rule
    :math:`\sigma\beta_k|w_k|\le\mathrm{tol}\,\sigma^2` holds too; or, when
    ``reachable(sigma)`` says that no bound could be tight at this Ritz value (the rounding
    margins alone are too wide), once the residual rule holds and the Krylov bound itself is
    within ``1 + rtol`` of the Ritz value (so that the returned bound is as tight as the margins
    allow, not that of the step where the residual first held). Otherwise it runs
    ``max(kw_steps, krylov_dim)`` steps; if some have not stopped, :func:`lanczos_svd` continues
    (restarting) from the Ritz vector on the residual rule, and their bound is the smaller of the
    first cycle's polynomial bound and the KW bound with the final Ritz value.

    Returns
    -------
    result : SpectralResult
        As :func:`lanczos_svd` (``n_iter`` and ``n_matvec`` cover both phases).
    upper : Tensor, float64, shape (*batch,)
        The probabilistic upper bound (margin included), confidence :math:`1-\delta`.
    k1 : Tensor of int64, shape (*batch,)
        Dimension of the first (uniformly started) Krylov space of each batch element.
    """
    v1 = x0 / torch.linalg.vector_norm(x0, dim=-1, keepdim=True)
    batch = v1.shape[:-1]
    dev, dt = v1.device, v1.dtype
    N = v1.shape[-1]
    half = delta / 2
    cap = max(kw_steps(N, half, rtol, margin), int(krylov_dim), 2)
    cap = min(cap, max(int(max_iter), 2), N)
    tiny = torch.finfo(dt).tiny
    f64 = torch.float64

    def safe_div(x: Tensor, s: Tensor) -> Tensor:
        s = s.unsqueeze(-1)
        return torch.where(s > tiny, x / torch.where(s > tiny, s, torch.ones_like(s)), 0 * x)

    # the bases are only ever read up to the vectors written (Vb[..., :k, :]): left
    # uninitialised, their memory is touched step by step, not cap + 1 vectors up front
    Vb = v1.new_empty(batch + (cap + 1, N))
    Vb[..., 0, :] = v1
    p = matvec(v1)
    Ub = p.new_empty(batch + (cap + 1, p.shape[-1]))
    alpha = torch.linalg.vector_norm(p, dim=-1)
    Ub[..., 0, :] = safe_div(p, alpha)
    alphas, betas = [alpha], []
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    k1 = torch.zeros(batch, dtype=torch.int64, device=dev)
    n_mv = torch.ones(batch, dtype=torch.int64, device=dev)
    best = torch.zeros(batch, dtype=dt, device=dev)
    inf = torch.full(batch, math.inf, dtype=f64, device=dev)
    bound = inf
    out_v = v1.clone()
    history = []
    for k in range(1, cap + 1):
        r = rmatvec(Ub[..., k - 1, :]) - alphas[-1].unsqueeze(-1) * Vb[..., k - 1, :]
        r = reorthogonalize(r, Vb[..., :k, :])
        beta = torch.linalg.vector_norm(r, dim=-1)
        betas.append(beta)
        active = ~done
        n_mv = n_mv + active.to(torch.int64)
        k1 = k1 + active.to(torch.int64)
        A_ = torch.stack(alphas, dim=-1)
        B_ = torch.stack(betas, dim=-1)
        Bk = torch.diag_embed(A_) + torch.diag_embed(B_[..., :-1], offset=1)
        Wl, S, Yh = torch.linalg.svd(Bk)
        sigma = S[..., 0]
        est = sigma * beta * Wl[..., -1, 0].abs()
        ritz = (Yh[..., 0, :].unsqueeze(-2) @ Vb[..., :k, :]).squeeze(-2)
        ritz = safe_div(ritz, torch.linalg.vector_norm(ritz, dim=-1))
        best = torch.where(active, sigma, best)
        history.append(best.clone())
        out_v = torch.where(active.unsqueeze(-1), ritz, out_v)
        poly = lanczos_polynomial_upper(A_, B_, S, N, half) if N >= 3 else inf
        factor = kw_union_factor(N, k, half)
        kw = sigma.to(f64) * factor if math.isfinite(factor) else inf
        cand = torch.minimum(poly, kw) * (1 + margin)
        bound = torch.where(active, cand, bound)
        conv = (est <= tol * sigma.square()) | (sigma <= tiny)
        tight = accept(sigma, bound) if accept is not None else bound <= (1 + rtol) * sigma.to(f64)
        stop = tight & conv if require_residual else tight
        if reachable is not None:
            # the rounding margins alone are wider than the width: stop once the Krylov bound
            # itself is within the width and the residual rule holds, so that upper_prob is as
            # tight as the margins allow
            krylov_tight = bound <= (1 + rtol) * sigma.to(f64)
            stop = stop | (conv & ~reachable(sigma) & krylov_tight)
        done = done | (active & stop)
        if bool(done.all()) or k == cap:
            break
        Vb[..., k, :] = safe_div(r, beta)
        p = matvec(Vb[..., k, :]) - beta.unsqueeze(-1) * Ub[..., k - 1, :]
        p = reorthogonalize(p, Ub[..., :k, :])
        n_mv = n_mv + (~done).to(torch.int64)
        alpha = torch.linalg.vector_norm(p, dim=-1)
        alphas.append(alpha)
        Ub[..., k, :] = safe_div(p, alpha)
    del Vb, Ub
    remaining = int(max_iter) - int(k1.max())
    if not bool(done.all()) and remaining > 0:
        res = lanczos_svd(
            matvec, rmatvec, out_v, tol=tol, max_iter=remaining, krylov_dim=krylov_dim
        )
        vec = torch.where(done.unsqueeze(-1), out_v, res.vector)
        cont = torch.maximum(res.history[-1], res.sigma)
        ritz_val = torch.where(done, best, torch.maximum(best, cont))
        kw_final = probabilistic_upper(ritz_val, k1, N, half, margin)
        bound = torch.where(done, bound, torch.minimum(bound, kw_final))
        n_iter = k1 + torch.where(done, 0, res.n_iter)
        n_mv = n_mv + torch.where(done, 0, res.n_matvec - 2)
        history = history + list(torch.where(done, best, res.history))
    else:
        vec, n_iter = out_v, k1
    w = matvec(vec)
    sig = torch.linalg.vector_norm(w, dim=-1)
    residual = torch.linalg.vector_norm(rmatvec(w) - sig.square().unsqueeze(-1) * vec, dim=-1)
    converged = (residual <= tol * sig.square()) | (sig <= tiny)
    result = SpectralResult(
        sigma=sig,
        vector=vec,
        residual=residual,
        converged=converged,
        n_iter=n_iter,
        n_matvec=n_mv + 2,
        history=torch.stack(history),
    )
    return result, bound, k1


def probabilistic_upper(
    ritz: Tensor, k1: Tensor, N: int, delta: float, margin: Tensor | float
) -> Tensor:
    r"""Upper bound holding with probability :math:`\ge1-\delta`, float64, shape of ``ritz``.

    ``ritz`` is the (largest) Ritz singular value, ``k1`` the dimension of the uniformly
    started Krylov space, ``margin`` the relative rounding margin. ``k1`` may be chosen by the
    run (an early stop): the factor is that of :math:`\delta_{k_1}` (:func:`kw_union_factor`).
    """
    factors = torch.tensor(
        [kw_union_factor(N, int(k), delta) for k in k1.reshape(-1).tolist()],
        dtype=torch.float64,
        device=ritz.device,
    ).reshape(k1.shape)
    up = ritz.to(torch.float64) * factors * (1 + margin)
    return torch.where(torch.isinf(factors), torch.full_like(up, math.inf), up)
