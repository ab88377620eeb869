r"""Local Lipschitz constant of an arbitrary differentiable map, and the released metric.

:func:`local_lipschitz_fn` brackets :math:`\|Df(X)\|_2` for any map (a whole model, a block)
with the solvers and certificates of :func:`~meanfield.lipschitz.local_lipschitz`, through
automatic-differentiation products; :func:`released_metric` is the cheap one-product estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.func as tfunc
from torch import Tensor

from .._certificates import probabilistic_upper
from .._spectral import spectral_norm_upper, top_singular_value
from .._typing import Method
from ._certify import DENSE_GRAM_STEPS
from ._estimate import LipschitzEstimate
from ._operators import random_start, round_down, round_up
from ._options import DEFAULT_TOL, DENSE_AUTO_MAX, check_one_of
from ._solve import dense_top

# ------------------------------------------------------------------ arbitrary differentiable maps


def _vjp(
    fn: Callable[[Tensor], Tensor], X: Tensor
) -> tuple[Tensor, Callable[[Tensor], tuple[Tensor]]]:
    """``torch.func.vjp`` without auxiliary output: ``fn(X)`` and its pullback."""
    result = tfunc.vjp(fn, X)
    return result[0], result[1]


def _products(
    fn: Callable[[Tensor], Tensor],
    X: Tensor,
    batch: torch.Size,
    products: Literal["forward", "reverse"],
) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    r"""The products :math:`v\mapsto Jv` and :math:`u\mapsto J^\top u` of ``fn`` at ``X``.

    ``"forward"``: :math:`Jv` is the tangent of ``torch.func.jvp``. ``"reverse"``: the pullback
    :math:`g(u) = J^\top u` is linear in :math:`u`, so its own pullback at any point is
    :math:`v\mapsto Jv` (the gradient of :math:`u\mapsto\langle J^\top u, v\rangle`);
    it is taken once, at :math:`u = 0`, by ``torch.func.vjp`` of ``g`` (reverse over reverse), so
    no forward-mode derivative runs through ``fn``. Both are flattened to ``batch + (-1,)``.
    """
    out, pullback = _vjp(fn, X)
    out_shape = out.shape

    def rmatvec(u: Tensor) -> Tensor:
        return pullback(u.reshape(out_shape))[0].reshape(batch + (-1,))

    if products == "forward":

        def matvec(v: Tensor) -> Tensor:
            return tfunc.jvp(fn, (X,), (v.reshape(X.shape),))[1].reshape(batch + (-1,))

        return matvec, rmatvec

    def transpose(u: Tensor) -> Tensor:
        # re-traced under the outer transform, so that the pullback itself is differentiable
        return _vjp(fn, X)[1](u)[0]

    _, pullback2 = _vjp(transpose, torch.zeros_like(out))

    def matvec_rr(v: Tensor) -> Tensor:
        return pullback2(v.reshape(X.shape))[0].reshape(batch + (-1,))

    return matvec_rr, rmatvec


@torch.no_grad()
def local_lipschitz_fn(
    fn: Callable[[Tensor], Tensor],
    X: Tensor,
    *,
    method: Method = "auto",
    tol: float | None = None,
    max_iter: int | None = None,
    krylov_dim: int = 32,
    seed: int | None = 0,
    upper: Literal["auto", "gram", "none"] = "auto",
    batch_dims: int = 0,
    delta: float | None = 1e-6,
    products: Literal["forward", "reverse"] = "forward",
) -> LipschitzEstimate:
    r"""Estimate the local Lipschitz constant of any differentiable torch callable.

    The same estimator as :func:`local_lipschitz`, on a general map.

    Products use ``torch.func.jvp`` — its **tangent** output, element ``[1]`` (the released
    estimator took element ``[0]``, the primal :math:`f(X)`; docs/experiments.md, defect D1) — and
    ``torch.func.vjp``. ``method="dense"`` builds :math:`J` with ``torch.func.jacrev``.
    With ``products="reverse"`` no forward-mode derivative is taken: :math:`Jv` is the pullback
    of the pullback (reverse over reverse), for maps whose operations lack forward-mode rules
    (custom ``autograd.Function`` without ``jvp``; transformers modules,
    :func:`meanfield.models.hf_module_fn`).

    Parameters
    ----------
    fn : callable
        Differentiable map of tensors. With ``batch_dims > 0`` it must act independently on each
        sample of the leading ``batch_dims`` dimensions (as attention does).
    X : Tensor
        Input; ``X.shape[batch_dims:]`` is one sample.
    method : {"auto", "dense", "lanczos", "power"}, default "auto"
        ``"auto"``: dense when a sample has at most 1500 entries.
    tol : float, optional
        Residual tolerance, as in :func:`local_lipschitz`. Default (``None``): ``1e-6``
        (``DEFAULT_TOL``, that of :func:`local_lipschitz`'s residual rule), the
        residual rule being the only one here (the width rule needs the closed-form certificates
        of :func:`local_lipschitz`), so that a call written for either function runs on both.
    max_iter, krylov_dim, seed
        As in :func:`local_lipschitz`.
    upper : {"auto", "gram", "none"}, default "auto"
        Dense: Gram iteration certified by Cholesky. Matrix-free methods have no upper
        certificate for a general map: ``upper = +inf``.
    batch_dims : int, default 0
        Number of leading batch dimensions.
    delta : float or None, default 1e-6
        ``method="lanczos"``: failure probability of ``upper_prob``, the Kuczyński–Woźniakowski
        bound of the run's own Krylov space (free; docs/certificates.md §1). It holds for any
        map, since it only uses products with the Jacobian. ``None``: no ``upper_prob``.
    products : {"forward", "reverse"}, default "forward"
        How the matrix-free methods form :math:`Jv`: ``"forward"``, the tangent of
        ``torch.func.jvp``; ``"reverse"``, ``torch.func.vjp`` of the pullback :math:`u\mapsto
        J^\top u` (linear in :math:`u`, so its pullback is :math:`v\mapsto Jv`), which needs
        only reverse-mode rules (twice differentiable backward passes) and costs about two
        backward passes per product. The same Jacobian either way: same solvers, same
        certificates. ``method="dense"`` uses ``jacrev`` in both.

    Returns
    -------
    LipschitzEstimate
        Fields of shape ``X.shape[:batch_dims]``, in the dtype of ``X``. ``lower`` is
        :math:`\|Jv\|` from an explicit final product in that dtype; the dense upper bound
        includes a relative evaluation margin :math:`64\sqrt N\varepsilon` of the dtype.
        For a general map the bracket is certified for the Jacobian *as autograd computes it*:
        the rounding of ``fn`` itself cannot be analysed here, so unlike :func:`local_lipschitz`
        (docs/rounding.md) it is not a floating-point certificate for the exact map.
        No field carries an autograd graph: the call runs under ``torch.no_grad`` (the
        ``torch.func`` transforms still differentiate ``fn`` inside it), so parameters of
        ``fn`` that require gradients (an ``nn.Module``'s) are constants.
    """
    check_one_of("method", method, ("auto", "dense", "lanczos", "power"))
    check_one_of("upper", upper, ("auto", "gram", "none"))
    check_one_of("products", products, ("forward", "reverse"))
    batch = X.shape[:batch_dims]
    sample = X.shape[batch_dims:]
    N = math.prod(sample)
    dtype, dev = X.dtype, X.device
    resolved = method if method != "auto" else ("dense" if N <= DENSE_AUTO_MAX else "lanczos")
    if resolved == "dense":

        def f(x: Tensor) -> Tensor:  # one sample, flattened
            return fn(x.reshape((1,) * batch_dims + tuple(sample))).reshape(-1)

        Xf = X.reshape((-1, N))
        J = torch.stack([tfunc.jacrev(f)(Xf[k]) for k in range(Xf.shape[0])])
        J64 = J.reshape(batch + J.shape[1:]).to(torch.float64)
        top, v, sigma, residual = dense_top(J64)
        em = 64 * math.sqrt(N) * torch.finfo(dtype).eps
        if upper == "none":
            up64 = torch.full(batch, math.inf, dtype=torch.float64, device=dev)
        else:
            up64 = spectral_norm_upper(J64, candidate=top, max_iter=DENSE_GRAM_STEPS) * (1 + em)
        zeros = torch.zeros(batch, dtype=torch.int64, device=dev)
        return LipschitzEstimate(
            value=top.to(dtype),
            lower=round_down(sigma * (1 - em), dtype),
            upper=round_up(up64, dtype),
            converged=torch.ones(batch, dtype=torch.bool, device=dev),
            n_iter=zeros,
            n_matvec=zeros,
            residual=residual.to(dtype),
            method="dense",
            geometry="euclidean",
            upper_method="none" if upper == "none" else "gram",
            vector=v.reshape(X.shape).to(dtype),
            upper_prob=None if delta is None else round_up(up64, dtype),
            confidence=None if delta is None else 1.0 - float(delta),
        )
    if upper == "gram":
        raise ValueError("upper='gram' needs the assembled Jacobian: use method='dense'")
    matvec, rmatvec = _products(fn, X, batch, products)
    x0 = random_start(batch + (N,), X, seed)
    res = top_singular_value(
        matvec,
        rmatvec,
        x0,
        method=resolved,
        tol=DEFAULT_TOL if tol is None else tol,
        max_iter=max_iter,
        krylov_dim=krylov_dim,
    )
    upper_prob = None
    if delta is not None:
        upper_prob = torch.full(batch, math.inf, dtype=dtype, device=dev)
        if resolved == "lanczos":
            ritz = torch.maximum(res.history[-1], res.sigma)
            k1 = res.n_iter.clamp_max(max(int(krylov_dim), 2))
            u = torch.finfo(dtype).eps / 2
            margin = (64 * math.sqrt(N) + 16 * int(k1.max())) * u
            upper_prob = round_up(probabilistic_upper(ritz, k1, N, delta, margin), dtype)
    return LipschitzEstimate(
        value=res.sigma,
        lower=res.sigma,
        upper=torch.full(batch, math.inf, dtype=dtype, device=dev),
        converged=res.converged,
        n_iter=res.n_iter,
        n_matvec=res.n_matvec,
        residual=res.residual,
        method=resolved,
        geometry="euclidean",
        upper_method="none",
        vector=res.vector.reshape(X.shape),
        history=res.history,
        upper_prob=upper_prob,
        confidence=None if delta is None else 1.0 - float(delta),
    )


def released_metric(fn: Callable[[Tensor], Tensor], X: Tensor, *, batch_dims: int = 0) -> Tensor:
    r"""Reproduce the released estimator's output :math:`\sqrt{\|J(X)^\top f(X)\|}`.

    The released power iteration took ``torch.func.jvp(f, (X,), (u,))[0]``, the **primal**
    :math:`f(X)`, instead of the tangent :math:`Ju`, so every iterate is :math:`J^\top f(X)`,
    independent of :math:`u`, and the loop returns :math:`\sqrt{\|J(X)^\top f(X)\|}`
    (docs/experiments.md, defect D1; *from the authors' released code*). **This is not a Lipschitz
    constant**; it is provided to reproduce and compare with the published y-axes. It is homogeneous
    of degree one in :math:`f` (replacing :math:`f` by :math:`cf` multiplies it by :math:`|c|`,
    since :math:`J^\top f` scales by :math:`c^2`), as a Lipschitz constant would be, but unlike one
    it depends on the values of :math:`f`, not only on its derivative: adding a constant vector to
    :math:`f` changes it (and it is 0 wherever :math:`f(X) = 0`).

    Parameters
    ----------
    fn : callable
        The differentiated map.
    X : Tensor
        Input; ``X.shape[batch_dims:]`` is one sample.
    batch_dims : int, default 0
        Leading dimensions treated as independent samples.

    Returns
    -------
    Tensor, shape ``X.shape[:batch_dims]``
    """
    out, pullback = _vjp(fn, X)
    g = pullback(out)[0]
    return torch.linalg.vector_norm(g.reshape(X.shape[:batch_dims] + (-1,)), dim=-1).sqrt()
