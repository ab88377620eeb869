r"""The certified local Lipschitz estimator of attention: :func:`local_lipschitz`.

At a sequence or a weighted atomic measure, in the Euclidean, Wasserstein or mass-splitting
geometry, it returns a :class:`LipschitzEstimate` whose bracket ``lower <= exact <= upper``
includes the rounding margin. The geometries, the bracket and the margin are described in the
package docstring (:mod:`meanfield.lipschitz`).

:func:`local_lipschitz` composes the steps, each in its own private module: parse the input
(:mod:`~meanfield.lipschitz._operators`), make the option objects, which reject invalid
combinations when constructed (:mod:`~meanfield.lipschitz._options`), linearise and resolve the
options at the input, make the operators (precisions and power-of-two scales), solve
(:mod:`~meanfield.lipschitz._solve`; the width rule reads the rounding margins of
:mod:`~meanfield.lipschitz._margins` while it runs), then certify
(:mod:`~meanfield.lipschitz._certify`: the bracket, ``upper_prob`` and the
:class:`LipschitzEstimate`, defined in :mod:`~meanfield.lipschitz._estimate`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import torch
from torch import Tensor

from .._typing import Geometry, Method, Params, UpperMethod
from ..jacobian import (
    AttentionLinearization,
    StreamingLinearization,
    linearize,
    linearize_streaming,
)
from ..jacobian.streaming import default_block_sizes
from ..measures import DiracMeasure
from ._certify import certify_solution
from ._estimate import LipschitzEstimate
from ._margins import Margins
from ._operators import parse_input, prepare
from ._options import DEFAULT_MEMORY_BUDGET as DEFAULT_MEMORY_BUDGET
from ._options import DEFAULT_PROB_RTOL as DEFAULT_PROB_RTOL
from ._options import DEFAULT_TOL as DEFAULT_TOL
from ._options import DENSE_AUTO_MAX as DENSE_AUTO_MAX
from ._options import CertificateOptions, EstimateOptions, Plan, SolverOptions
from ._options import stored_bytes as stored_bytes
from ._solve import solve

__all__ = ["LipschitzEstimate", "local_lipschitz", "stored_bytes"]


def local_lipschitz(
    x: Tensor | DiracMeasure,
    params: Params,
    *,
    geometry: Geometry = "euclidean",
    masked: bool | None = None,
    method: Method = "auto",
    tol: float | None = None,
    max_iter: int | None = None,
    krylov_dim: int = 32,
    seed: int | None = 0,
    upper: UpperMethod = "auto",
    chunk_size: int | None = None,
    token_index: Tensor | None = None,
    delta: float | None = 1e-6,
    prob_rtol: float | Literal["auto"] | None = "auto",
    start: Tensor | Literal["kronecker"] | None = None,
    certify: bool = True,
    path: Literal["auto", "stored", "streaming"] = "auto",
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> LipschitzEstimate:
    r"""Local Lipschitz constant of attention at a sequence or a measure, with a certified bracket.

    Parameters
    ----------
    x : Tensor, shape (..., n, d), or DiracMeasure
        A sequence (uniform weights) or a batch of them, or a weighted measure. A causal measure
        implies ``masked=True`` with its positions (docs/theory.md §B2).
    params : AttentionParams or MultiHeadParams
    geometry : {"euclidean", "wasserstein", "split"}, default "euclidean"
        The constant (module docstring; docs/theory.md §16). For sequences and uniform
        weights ``"wasserstein"`` equals ``"euclidean"``.
    masked : bool, optional
        Causal attention. Default: ``x.is_causal`` for a measure, ``False`` for a tensor.
    method : {"auto", "dense", "lanczos", "power"}, default "auto"
        ``"dense"`` assembles :math:`J` and takes an SVD (float64); ``"lanczos"`` is matrix-free
        Golub–Kahan–Lanczos; ``"power"`` is the baseline power iteration. Both stop on the
        residual rule below. ``"auto"``: dense when ``n * d <= 1500``.
    tol : float, optional
        Relative residual tolerance :math:`\|J^\top Jv-\sigma^2v\|\le\mathrm{tol}\,\sigma^2`
        of the residual rule (docs/rounding.md §7). Given explicitly, the call stops on it (and
        on the width too when ``prob_rtol`` is a number). Default: the width rule where it
        applies, else the residual rule with ``tol = 1e-6``. For float32 inputs use
        ``tol >= 1e-4``.
    max_iter : int, optional
        Iteration cap of the solver (defaults: 300 Lanczos steps, 1000 power steps).
    krylov_dim : int, default 32
        Lanczos basis size before a restart.
    seed : int or None, default 0
        Seed of the random start, the estimate's one random source (a CPU generator seeded
        with it draws the start in float64; ``None``: torch's global generator).
    upper : {"auto", "gram", "block", "none"}, default "auto"
        Upper-bound certificate. ``"auto"``: ``"gram"`` for the dense method, ``"block"``
        otherwise. ``"gram"`` needs ``method="dense"``.
    chunk_size : int, optional
        Query-block size of the matrix-free products.
    token_index : Tensor, optional
        Integer token positions of rotary heads.
    delta : float or None, default 1e-6
        Failure probability of the probabilistic certificate ``upper_prob`` (confidence
        :math:`1-\delta`), docs/certificates.md. For ``method="lanczos"`` it costs nothing: it
        reuses the run's Krylov space, whose first cycle starts from the seeded Gaussian vector
        (uniform on the sphere). The guarantee is over that draw: do not pick the seed after
        looking at results. ``None``: no probabilistic certificate.
    prob_rtol : float, "auto" or None, default "auto"
        The width rule: run one unrestarted Lanczos cycle until the certified bracket satisfies
        ``upper_prob <= (1 + prob_rtol) * lower``, then stop. ``upper_prob`` is the smaller of a
        gap-aware bound from the Lanczos polynomial and the Kuczyński–Woźniakowski bound, at
        failure probability ``delta / 2`` each, the latter spread over the steps where the run may
        stop (docs/certificates.md §1–2). ``"auto"``: ``0.05`` where the width rule applies
        (see "Stopping rules"), else the residual rule. A number needs the random start and
        ``certify=True``; ``None``: the residual rule.
    start : Tensor, shape (..., n, d), or "kronecker", optional
        Start vector of the matrix-free methods in place of the seeded random one: a warm start,
        e.g. the ``vector`` of an estimate at a neighbouring input (the previous length of a
        sweep over prefixes, zero-padded, or the previous window shifted by the stride). On a
        GPT-2 layer this cuts the products of a sweep 3-4 fold. ``"kronecker"``: the top
        singular vector of a Kronecker approximation of the value path plus a seeded Gaussian
        vector of the same norm (:func:`~meanfield.lipschitz.kronecker_start`,
        docs/certificates.md §6); it cuts the products of an estimate 2-4 fold on randomly
        initialised GPT-2 layers and by 0-40 % on trained MiniLM and SmolLM2 layers. ``lower``
        and ``upper`` keep their guarantees whatever the start (only the run's path changes). The probabilistic certificate assumes a uniformly random start, so
        with ``start`` no Kuczyński–Woźniakowski bound is formed: ``upper_prob`` is then
        ``upper``. Not combinable with ``prob_rtol``.
    certify : bool, default True
        ``False``: the estimate alone (``value``, ``vector``, ``residual``, ``converged``), with
        the trivial bracket ``lower = 0``, ``upper = inf`` and no ``upper_prob``. It skips the
        rounding analysis, the magnitude products and, for float32 inputs, the float64
        re-linearisation that certify ``lower`` (docs/rounding.md §9): a float32 estimate of a
        GPT-2 layer then costs about 40 % less. ``upper`` must be ``"auto"`` or ``"none"``,
        and ``prob_rtol`` is not available. The iteration, its stopping rule and ``converged``
        are those of the certified call.
    path : {"auto", "stored", "streaming"}, default "auto"
        How the Jacobian products are computed. ``"stored"`` keeps every head's
        :math:`n\times n` attention matrices; ``"streaming"`` keeps only the head rows and each
        row's log-normaliser and recomputes the attention tile by tile (memory linear in
        :math:`n`, :func:`~meanfield.jacobian.linearize_streaming`). Both give the same
        estimate within the bracket; the streaming path certifies ``lower`` and
        ``upper_prob`` with its own rounding analysis (docs/rounding.md §11); its
        ``upper="block"`` is the per-head structured bound formed from recomputed tiles
        (docs/certificates.md §5.4), and ``upper="auto"`` is ``"none"`` there (the block end
        costs about three products). It has no dense method, Gram certificate, split geometry
        or Kronecker start. ``"auto"``: the stored path when its matrices fit
        ``memory_budget`` by the fixed count :func:`~meanfield.lipschitz.stored_bytes` (never
        the memory free at the moment) or when the call asks for one of those, else
        streaming. Where the stored call's rounding margins make the requested width
        unreachable (``width_reachable`` false, as at large logits, where the streaming
        margins are much the finer: docs/rounding.md §11.1) and the call has no option only
        the stored path has, ``"auto"`` also runs the streaming call, with the stored call's
        ``upper`` method, and returns the estimate whose ``upper_prob / lower`` is the
        smaller (the stored one on a tie). The result records the path in ``path``.
    memory_budget : int, default 2**30
        Bytes the stored matrices may take before ``path="auto"`` streams.

    Returns
    -------
    LipschitzEstimate
        Tensor fields of the batch shape of ``x``, in its dtype.

    Notes
    -----
    **Stopping rules.** The default call (``method="lanczos"``, or ``"auto"`` resolving to it,
    with ``certify=True``, ``delta`` set, the random start and no ``tol``) stops on the *width
    rule*: as soon as the certified bracket ``[lower, upper_prob]`` is within a factor
    ``1 + prob_rtol`` (1.05 by default), with the rounding margins of both ends known before the
    run. Where that width is unreachable (the margins alone are wider, e.g. float32 at large n),
    ``width_reachable`` is false and the call stops on the residual rule instead; it never runs
    to ``max_iter`` chasing the width. Calls that form no ``upper_prob`` (``start=``,
    ``certify=False``, ``method="power"``, ``delta=None``) and calls with an explicit ``tol``
    stop on the residual rule. ``stop_rule`` records which rule was used.

    Products are batched over the leading dimensions, so a (B, n, d) input costs one batched
    product per iteration. Heads with a rotary embedding use autograd products; the block bound
    is then replaced by :func:`~meanfield.jacobian.head_structured_upper` (Euclidean operator;
    ``upper = inf`` for the weighted Wasserstein one) and ``geometry="split"`` is not supported
    for them.
    """
    options = EstimateOptions(
        geometry=geometry,
        solver=SolverOptions(
            method=method,
            tol=tol,
            max_iter=max_iter,
            krylov_dim=krylov_dim,
            start=start,
            seed=seed,
            path=path,
            memory_budget=memory_budget,
        ),
        certificate=CertificateOptions(
            upper=upper, delta=delta, prob_rtol=prob_rtol, certify=certify
        ),
    )
    X, log_weights, positions, is_masked = parse_input(x, masked, params)
    # a tensor start, checked against the points
    options = dataclasses.replace(options, solver=options.solver.at_input(X))
    aux = [t.shape[:-1] for t in (log_weights, positions) if t is not None]
    chosen = options.solver.choose_path(
        X.shape[-2],
        len(params.heads),
        math.prod(torch.broadcast_shapes(X.shape[:-2], *aux)),
        X.dtype,
        certify=certify,
        weighted=log_weights is not None,
        needs_stored=options.needs_stored,
        variants=tuple(dict.fromkeys(v for h in params.heads for v in h.variants)),
    )
    inputs = (X, params, log_weights, positions, is_masked, token_index, chunk_size)
    estimate, plan = _estimate_on(chosen, options, inputs)
    if _width_out_of_reach(options, estimate):
        # "auto" at large logits: the streaming margins (docs/rounding.md §11.1) are the finer
        cert = options.certificate
        streaming = dataclasses.replace(
            options,
            solver=dataclasses.replace(options.solver, path="streaming"),
            certificate=dataclasses.replace(cert, upper=plan.upper)
            if cert.upper == "auto"
            else cert,
        )
        other, _ = _estimate_on("streaming", streaming, inputs)
        if _widest(other) < _widest(estimate):
            estimate = other
    return estimate


_Inputs = tuple[
    Tensor, Params, "Tensor | None", "Tensor | None", bool, "Tensor | None", "int | None"
]


def _estimate_on(
    chosen: Literal["stored", "streaming"], options: EstimateOptions, inputs: _Inputs
) -> tuple[LipschitzEstimate, Plan]:
    """Linearise on the path ``chosen``, resolve the options there, solve, then certify."""
    X, params, log_weights, positions, is_masked, token_index, chunk_size = inputs
    lin: AttentionLinearization | StreamingLinearization
    common: dict[str, Any] = dict(
        log_weights=log_weights, masked=is_masked, positions=positions, token_index=token_index
    )
    if chosen == "streaming":
        block = None
        if chunk_size is not None:  # the query-block size keeps its meaning
            block = (int(chunk_size), default_block_sizes(X.shape[-2], len(params.heads))[1])
        lin = linearize_streaming(X, params, block_size=block, **common)
    else:
        lin = linearize(X, params, chunk_size=chunk_size, **common)
    plan = options.resolve(lin)  # "auto" resolved at this size, the stopping rule chosen
    ops = prepare(lin, plan)  # float64 copy, power-of-two scales, the solver's operator
    margins = Margins(ops, plan.op_geometry) if plan.certify else None
    solution = solve(ops, plan, margins)
    return certify_solution(ops, plan, margins, solution), plan


def _width_out_of_reach(options: EstimateOptions, estimate: LipschitzEstimate) -> bool:
    """Whether ``path="auto"`` kept the stored path and its margins made the width unreachable.

    Only where the streaming path can run the same call (no option only the stored path has).
    """
    reachable = estimate.width_reachable
    return (
        options.solver.path == "auto"
        and estimate.path == "stored"
        and not options.needs_stored
        and reachable is not None
        and not bool(reachable.all())
    )


def _widest(estimate: LipschitzEstimate) -> float:
    """The largest ``upper_prob / lower`` over the batch (``inf`` where ``lower`` is 0)."""
    assert estimate.upper_prob is not None  # a width was asked for, so upper_prob was formed
    return float((estimate.upper_prob / estimate.lower).max())
