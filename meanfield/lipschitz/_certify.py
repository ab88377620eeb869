r"""Certify: the bracket around a solved estimate, and the :class:`LipschitzEstimate`.

:func:`certify_solution` takes the :class:`~meanfield.lipschitz._solve.Solution` and builds, in order,
the probabilistic end ``upper_prob`` (the Kuczyński–Woźniakowski bound of the run's Krylov
space, docs/certificates.md), the float64 check of a float32 run's vector, the certified lower
end from an explicit product, the upper end (Gram iteration on the assembled Jacobian, or the
block-norm bound with a Collatz–Wielandt certificate), each with its rounding margin
(docs/rounding.md §4), brings everything back from the power-of-two units (docs/rounding.md §5)
and rounds the ends outwards to the input's dtype. With ``certify=False`` it returns the
estimate with the trivial bracket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import _rounding as _rnd
from .._certificates import krylov_rounding_margin, probabilistic_upper
from .._spectral import collatz_wielandt_bound, spectral_norm_upper
from .._typing import ProductGeometry
from ..jacobian import (
    AttentionLinearization,
    StreamingLinearization,
    block_norm_bounds,
    head_structured_upper,
    self_jvp,
    self_norm_trace_bound,
    structured_block_norms,
)
from ..jacobian.streaming_bounds import streaming_structured_upper
from ._estimate import LipschitzEstimate
from ._margins import Margins
from ._operators import (
    Linearization,
    Operators,
    eval_margin,
    lin_jvp,
    lin_vjp,
    relinearize,
    round_down,
    round_up,
)
from ._options import Plan
from ._solve import DenseSolution, KrylovSolution, SelfSolution, Solution

#: Gram steps run on a dense Jacobian before certification of the SVD value.
DENSE_GRAM_STEPS = 8
#: Relative margin covering the closed-form rank-one norms (square-root cancellation, ~1e-8).
_BLOCK_RTOL = 1e-6


def block_upper(
    lin64: AttentionLinearization, geometry: ProductGeometry, self_norms: Tensor | None, e: int = 0
) -> Tensor:
    """Block-norm bound on ``2**-e ||J||`` (the norm matrix is scaled before Collatz–Wielandt)."""
    if lin64.rope_heads:
        # rotary heads: the per-head structured bound (Euclidean operator only)
        if geometry == "euclidean" or lin64.P_w is None and lin64.log_weights is None:
            blocks = collatz_wielandt_bound(structured_block_norms(lin64)) * (1 + _BLOCK_RTOL)
            bound = torch.minimum(head_structured_upper(lin64), blocks)
            # in the units of 2**e like the other branch; rounded up (exact power-of-two scaling
            # unless it underflows, where 1 + 4u covers the last bit)
            return _rnd.unscale(bound, -e) * (1 + 4 * _rnd.U64) if e != 0 else bound
        return torch.full(lin64.batch_shape, math.inf, dtype=torch.float64, device=lin64.X.device)
    if e != 0:  # the layer scaled by 2**-e (docs/rounding.md §5)
        lin64 = relinearize(lin64, _rnd.scaled_params(lin64.params, e))
        self_norms = None if self_norms is None else _rnd.unscale(self_norms, -e)
    N = block_norm_bounds(lin64, geometry=geometry, self_norms=self_norms)
    N = torch.where(torch.isnan(N), math.inf, N)
    eN = _rnd.scale_of(N)  # no squares of huge entries in Collatz–Wielandt
    up = _rnd.unscale(collatz_wielandt_bound(_rnd.unscale(N, -eN)), eN)
    return up * (1 + _BLOCK_RTOL)


def streaming_block_upper(
    lin64: StreamingLinearization, eps: Tensor, geometry: ProductGeometry, e: int = 0
) -> Tensor:
    """The streaming path's deterministic bound on ``2**-e ||J||`` (docs/certificates.md §5.4).

    :func:`~meanfield.jacobian.streaming_bounds.streaming_structured_upper` on the float64
    rows, with ``eps`` the entrywise error of the recomputed attention. Like the stored path's
    rotary bound it bounds the Euclidean operator: a Wasserstein operator with weights gets
    ``inf``.
    """
    if geometry != "euclidean" and lin64.weighted:
        return torch.full(lin64.batch_shape, math.inf, dtype=torch.float64, device=lin64.X.device)
    bound = streaming_structured_upper(lin64, eps)
    # in the units of 2**e (exact power-of-two scaling unless it underflows: 1 + 4u covers it)
    return _rnd.unscale(bound, -e) * (1 + 4 * _rnd.U64) if e != 0 else bound


def float64_residual_ok(
    lin64s: Linearization,
    Jv: Tensor,
    v64: Tensor,
    s: Tensor,
    geometry: ProductGeometry,
    tol: float | Tensor,
    N: int,
) -> Tensor:
    r"""Whether a float32 solve's vector meets the tolerance on the float64 operator.

    The float32 solver judges convergence on its own operator, whose attention matrices can be
    far from the exact ones where logits are large (rotary heads at distant positions, inputs of
    norm :math:`10^3`): there it has reported convergence to a vector that is no singular vector
    of :math:`J`. One more float64 product gives
    :math:`\|J^\top Jv - s^2v\|\le(\mathrm{tol} + 8\sqrt N u_{32})\,s^2\|v\|` with
    :math:`s = \|Jv\|/\|v\|`, a few times the float32 residual's own rounding level added
    (docs/rounding.md §7).
    """
    g = lin_vjp(lin64s, Jv, geometry).flatten(-2)
    nv = torch.linalg.vector_norm(v64, dim=-1)
    s2 = (s / nv).square()
    r = torch.linalg.vector_norm(g - s2[..., None] * v64, dim=-1) / nv
    u32 = torch.finfo(torch.float32).eps / 2
    return r <= (tol + 8 * math.sqrt(N) * u32) * s2


def _self_bracket(
    ops: Operators, sol: SelfSolution, em: float
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The self term's ends ``(lower, upper, upper_atoms)``, float64, of the batch shape.

    ``upper_atoms`` (..., n) are the certified per-atom bounds where the blocks were explicit,
    else ``None``; ``em`` is a relative margin (first-order model, docs/rounding.md §6).
    """
    if sol.explicit:
        assert sol.lower_atoms is not None and sol.upper_atoms is not None
        up_atoms = sol.upper_atoms * (1 + em)
        return sol.lower_atoms.amax(-1) * (1 - em), up_atoms.amax(-1), up_atoms
    res, lin64 = sol.result, ops.lin64
    assert res is not None
    assert isinstance(lin64, AttentionLinearization)  # the split geometry: stored path only
    if lin64 is ops.lin:
        low = res.sigma
    else:
        low = torch.linalg.vector_norm(self_jvp(lin64, res.vector.to(torch.float64)), dim=-1)
    up_atoms = self_norm_trace_bound(lin64) * (1 + em)
    return (low * (1 - em)).amax(-1), up_atoms.amax(-1), None


@dataclass(frozen=True)
class _Ends:
    """One run's estimate and ends in the units of ``2**e`` (``upper`` set by Gram only)."""

    value: Tensor
    lower: Tensor
    residual: Tensor
    converged: Tensor
    n_iter: Tensor
    n_matvec: Tensor
    vector: Tensor
    upper: Tensor | None = None
    prob: Tensor | None = None
    history: Tensor | None = None


def _dense_ends(ops: Operators, plan: Plan, margins: Margins | None, run: DenseSolution) -> _Ends:
    """Lower end from the product path (whose rounding the model covers); Gram upper end."""
    lin, batch, dev = ops.lin64s, ops.batch, ops.lin.X.device
    lower = torch.zeros_like(run.value)
    if margins is not None:
        s_prod = torch.linalg.vector_norm(
            lin_jvp(lin, run.v.reshape(batch + (lin.n, lin.d)), plan.op_geometry).flatten(-2),
            dim=-1,
        )
        lower = margins.lower(s_prod, run.v, lin.n * lin.d_out)
    upper = None
    if plan.upper == "gram":
        assert margins is not None
        upper = spectral_norm_upper(run.jacobian, candidate=run.value, max_iter=DENSE_GRAM_STEPS)
        upper = torch.where(run.finite, margins.upper(upper), math.inf)
    return _Ends(
        value=run.value,
        lower=torch.where(run.finite, lower, 0.0),
        upper=upper,
        residual=run.residual,
        converged=run.finite,
        n_iter=torch.zeros(batch, dtype=torch.int64, device=dev),
        n_matvec=torch.zeros(batch, dtype=torch.int64, device=dev),
        vector=run.vector,
    )


def _krylov_prob(ops: Operators, plan: Plan, run: KrylovSolution) -> Tensor | None:
    """The run's probabilistic bound, in solver units.

    Its own where it stopped on the width; the Kuczyński–Woźniakowski bound of its first cycle
    for a residual-rule Lanczos run from the random start; else ``None``.
    """
    if run.stop_rule == "width":
        return run.prob
    if plan.method != "lanczos" or plan.delta is None or plan.solver.start is not None:
        return None
    res, lin = run.result, ops.lin_solve
    n, d = lin.n, lin.d
    ritz = torch.maximum(res.history[-1], res.sigma)
    k1 = res.n_iter.clamp_max(max(int(plan.solver.krylov_dim), 2))
    margin = krylov_rounding_margin(n, d, int(k1.max()), lin.X.dtype) + eval_margin(n, d)
    return probabilistic_upper(ritz, k1, n * d, plan.delta, margin)


def _krylov_ends(ops: Operators, plan: Plan, margins: Margins | None, run: KrylovSolution) -> _Ends:
    """The probabilistic end, the float64 check of a float32 run's vector and the lower end."""
    res, geometry = run.result, plan.op_geometry
    n, d, n_out = ops.lin.n, ops.lin.d, ops.lin.n * ops.lin.d_out
    shift = ops.e_solve - ops.e  # solver units (2**e_solve) to those of 2**e
    prob = _krylov_prob(ops, plan, run)
    if prob is not None:  # plus the solver's products' evaluation error (docs/rounding.md §4.2,
        assert margins is not None  # at float32's unit roundoff for a float32 run, §11.3)
        prob = margins.upper_solve(_rnd.unscale(prob.to(torch.float64), shift))
    v64 = res.vector.to(torch.float64)
    checked = None  # float32 solves: whether the float64 residual confirms convergence
    if ops.lin_solve is ops.lin64s or margins is None:  # the solver's operator is the certificate's
        s_prod = res.sigma.to(torch.float64)
    else:
        Jv = lin_jvp(ops.lin64s, v64.reshape(ops.batch + (n, d)), geometry)
        s_prod = torch.linalg.vector_norm(Jv.flatten(-2), dim=-1)
        tol_check: float | Tensor = plan.tol
        if run.stop_rule == "width" and not plan.tol_given:  # no residual target: the check is
            # that the float64 operator's residual on this vector matches the float32 solver's
            # own (per element; a zero operator, whose relative residual is undefined, passes)
            rel = res.residual.to(torch.float64) / res.sigma.to(torch.float64).square()
            rel = torch.where(torch.isnan(rel), math.inf, rel)
            tol_check = torch.clamp(rel + 2 * run.margin, min=plan.tol)
        checked = float64_residual_ok(ops.lin64s, Jv, v64, s_prod, geometry, tol_check, n * d)
    finite = torch.isfinite(s_prod) & torch.isfinite(v64).all(-1)
    lower = torch.zeros_like(s_prod)
    if margins is not None:
        v_safe = torch.where(finite[..., None], v64, 1.0)
        lower = margins.lower(torch.where(finite, s_prod, 0.0), v_safe, n_out)
    value = _rnd.unscale(torch.where(finite, res.sigma.to(torch.float64), 0.0), shift)
    if checked is not None:  # a float32 solve: the float64 value ||Jv|| / ||v|| of its vector
        value = torch.where(finite, s_prod / torch.linalg.vector_norm(v64, dim=-1), 0.0)
    residual = torch.where(finite, res.residual.to(torch.float64), math.inf)
    converged = res.converged & finite
    if checked is not None:  # a float32 operator far from the exact one: not converged,
        converged = converged & checked  # and no probabilistic bound from its Krylov space
        if prob is not None:
            prob = torch.where(checked, prob, math.inf)
    return _Ends(
        value=value,
        lower=lower,
        prob=prob,
        residual=_rnd.unscale(residual, shift, 2),
        converged=converged,
        n_iter=res.n_iter,
        n_matvec=res.n_matvec,
        vector=res.vector.reshape(ops.batch + (n, d)),
        history=_rnd.unscale(res.history.to(torch.float64), ops.e_solve).to(ops.lin.X.dtype),
    )


def certify_solution(
    ops: Operators, plan: Plan, margins: Margins | None, solution: Solution
) -> LipschitzEstimate:
    """The :class:`LipschitzEstimate` of ``solution``: bracket, ``upper_prob``, convergence.

    ``margins`` is ``None`` exactly when ``plan.certify`` is false (the trivial bracket).
    """
    dtype, e, batch = ops.lin.X.dtype, ops.e, ops.batch
    self_term, self_norms = solution.self_term, None
    if self_term is not None:
        em = eval_margin(ops.lin.n, ops.lin.d)
        if margins is not None:  # the self blocks' margin: plus the attention error
            em = em + 4 * float(margins.model.eps_P.amax())
        self_lower, self_upper, self_norms = _self_bracket(ops, self_term, em)
    run = solution.run
    if isinstance(run, DenseSolution):
        ends = _dense_ends(ops, plan, margins, run)
        stop_rule, width_reachable = "dense", None
    else:
        ends = _krylov_ends(ops, plan, margins, run)
        stop_rule, width_reachable = run.stop_rule, run.width_reachable
    upper64 = ends.upper
    if plan.upper == "block":
        assert margins is not None
        if isinstance(ops.lin64, StreamingLinearization):
            bound = streaming_block_upper(ops.lin64, margins.model.eps_s, plan.op_geometry, e)
        else:
            bound = block_upper(ops.lin64, plan.op_geometry, self_norms, e)
        upper64 = margins.upper(bound)
    elif plan.upper == "none":
        upper64 = torch.full(batch, math.inf, dtype=torch.float64, device=ops.lin.X.device)
    assert upper64 is not None
    # back to the units of J (docs/rounding.md §5): overflow gives upper = inf, and a lower end
    # beyond float64's range is clamped to its largest finite number (still a lower bound)
    value64 = _rnd.unscale(ends.value, e)
    lower64 = _rnd.unscale(ends.lower, e).clamp_max(_rnd.F64_MAX)
    upper64 = _rnd.unscale(upper64, e)
    residual = _rnd.unscale(ends.residual.to(torch.float64), e, 2)
    upper64 = torch.where(torch.isnan(upper64), math.inf, upper64)
    prob = ends.prob
    if prob is not None:
        prob = _rnd.unscale(prob, e)
        prob = torch.where(torch.isnan(prob), math.inf, prob)
    upper_prob64 = None
    if plan.delta is not None:
        upper_prob64 = upper64 if prob is None else torch.minimum(upper64, prob)
    converged, n_matvec, self_value = ends.converged, ends.n_matvec, None
    if self_term is not None:
        if upper_prob64 is not None:
            upper_prob64 = torch.maximum(upper_prob64, self_upper)
        value64 = torch.maximum(value64, self_term.value)
        lower64 = torch.maximum(lower64, self_lower)
        upper64 = torch.maximum(upper64, self_upper)
        converged = converged & self_term.converged
        n_matvec = n_matvec + self_term.n_matvec
        self_value = self_term.value.to(dtype)
    if margins is None:  # the trivial bracket: the self term's ends carry no rounding analysis
        lower64, upper64 = torch.zeros_like(lower64), torch.full_like(upper64, math.inf)
    lower_out = round_down(lower64, dtype)
    upper_prob_out = None if upper_prob64 is None else round_up(upper_prob64, dtype)
    width = plan.width
    if stop_rule == "width" and upper_prob_out is not None and width_reachable is not None:
        # converged: the returned bracket meets the width (and the residual rule when tol was
        # given); where the width is out of reach, the residual rule alone
        assert width is not None
        met = upper_prob_out.to(torch.float64) <= width * lower_out.to(torch.float64)
        if plan.tol_given:
            met = met & converged
        converged = torch.where(width_reachable, met, converged)
    return LipschitzEstimate(
        value=value64.to(dtype),
        lower=lower_out,
        upper=round_up(upper64, dtype),
        converged=converged,
        n_iter=ends.n_iter,
        n_matvec=n_matvec,
        residual=residual.to(dtype),
        method=plan.method,
        geometry=plan.geometry,
        upper_method=plan.upper,
        vector=ends.vector,
        history=ends.history,
        self_value=self_value,
        upper_prob=upper_prob_out,
        confidence=None if plan.delta is None else 1.0 - float(plan.delta),
        stop_rule=stop_rule,
        width=width,
        width_reachable=width_reachable,
        path=plan.path,
    )
