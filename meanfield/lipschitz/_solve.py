r"""Solve: the top singular value of the Jacobian at one input, before its certificate.

:func:`solve` runs what the :class:`~meanfield.lipschitz._options.Plan` asks for: the dense SVD
of the assembled Jacobian, or a matrix-free Lanczos or power run on the solver's operator
(:class:`~meanfield.lipschitz._operators.Operators`), and for ``geometry="split"`` the
per-atom self-Jacobian term first. Results stay in the operators' power-of-two units;
:func:`~meanfield.lipschitz._certify.certify_solution` brings them back and builds the bracket.

The solver reads the certificate in one place: the width rule (the default stopping rule)
stops the Lanczos run once the certified ends it predicts from the rounding margins
(:func:`~meanfield.lipschitz._margins.width_rule`) are close enough.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._certificates import golub_kahan_certified, krylov_rounding_margin
from .._numerics import iter_chunks
from .._spectral import SpectralResult, spectral_norm_upper, top_singular_value
from ..jacobian import AttentionLinearization
from ..jacobian.products import dense_from_linearization, self_blocks
from ._margins import Margins, width_rule
from ._operators import Operators, eval_margin, flat_ops, random_start, self_ops
from ._options import Plan
from .starts import kronecker_start

#: Per-atom self-Jacobians are formed explicitly below this many flops (n * d_out * d * min).
_EXPLICIT_SELF_FLOPS = 2e9
#: Entries of explicit self-Jacobian blocks held at once (atoms are processed in chunks).
_EXPLICIT_SELF_ENTRIES = 2**22


@dataclass(frozen=True)
class SelfSolution:
    r"""The splitting term :math:`\max_i\|S_i\|_2` as solved, before its margins (float64).

    Explicit blocks (SVD per atom) are not kept, so the raw ends of each block are taken while
    it is at hand: ``lower_atoms`` :math:`\|S_iv_i\|` and ``upper_atoms`` the certified norm
    of the computed block; the per-atom Lanczos run keeps its ``result`` instead (its vectors
    are measured again by the certificate).
    """

    value: Tensor
    converged: Tensor
    n_matvec: Tensor
    explicit: bool
    lower_atoms: Tensor | None = None
    upper_atoms: Tensor | None = None
    result: SpectralResult | None = None


@dataclass(frozen=True)
class DenseSolution:
    """SVD of the assembled Jacobian of ``lin64s`` (units of ``2**e``).

    ``jacobian`` has its non-finite batch elements (``finite`` false) replaced by zeros; ``v``
    is the top right singular vector, flattened; ``vector`` the same in the input's shape and
    dtype.
    """

    jacobian: Tensor
    finite: Tensor
    v: Tensor
    value: Tensor
    residual: Tensor
    vector: Tensor


@dataclass(frozen=True)
class KrylovSolution:
    """A matrix-free run on ``lin_solve`` (units of ``2**e_solve``).

    ``prob`` is the run's own probabilistic bound where it stopped on the width, ``margin`` the
    Krylov and evaluation margin it was judged with, ``width_reachable`` whether the width can
    be reached (where one was requested).
    """

    result: SpectralResult
    stop_rule: str
    margin: float
    prob: Tensor | None = None
    width_reachable: Tensor | None = None


@dataclass(frozen=True)
class Solution:
    """What :func:`solve` returns: the main run and the split geometry's self term."""

    run: DenseSolution | KrylovSolution
    self_term: SelfSolution | None


def solve(ops: Operators, plan: Plan, margins: Margins | None) -> Solution:
    """Run the solver of ``plan`` on ``ops`` (the self term first, then the main run).

    ``margins`` (certified calls only) is read by the width rule.
    """
    self_term = solve_self_term(ops, plan) if plan.geometry == "split" else None
    run: DenseSolution | KrylovSolution
    if plan.method == "dense":
        run = solve_dense(ops, plan)
    else:
        run = solve_krylov(ops, plan, margins)
    return Solution(run, self_term)


def solve_self_term(ops: Operators, plan: Plan) -> SelfSolution:
    r""":math:`\max_i\|S_i\|_2`: explicit blocks and their SVDs, or batched per-atom Lanczos."""
    lin, lin64 = ops.lin, ops.lin64
    n, d, d_out = lin.n, lin.d, lin.d_out
    batch = lin64.batch_shape
    dev = lin64.X.device
    explicit = plan.method == "dense" or (
        n * d_out * d * min(d_out, d) * max(1, math.prod(batch)) <= _EXPLICIT_SELF_FLOPS
    )
    if explicit:
        sv, low, up = [], [], []
        per_atom = max(1, math.prod(batch)) * lin64.d_out * lin64.d
        assert isinstance(lin, AttentionLinearization)  # the split geometry: stored path only
        assert isinstance(lin64, AttentionLinearization)
        chunk_size = lin.chunk_size
        block = chunk_size if chunk_size is not None else max(1, _EXPLICIT_SELF_ENTRIES // per_atom)
        for sl in iter_chunks(lin64.n, block):
            S = self_blocks(lin64, sl)  # (..., c, d_out, d)
            _, s, Vh = torch.linalg.svd(S, full_matrices=False)
            v = Vh[..., 0, :]
            low.append(torch.linalg.vector_norm((S @ v.unsqueeze(-1)).squeeze(-1), dim=-1))
            sv.append(s[..., 0])
            up.append(spectral_norm_upper(S, candidate=s[..., 0], max_iter=0))
        return SelfSolution(
            value=torch.cat(sv, -1).amax(-1),
            converged=torch.ones(batch, dtype=torch.bool, device=dev),
            n_matvec=torch.zeros(batch, dtype=torch.int64, device=dev),
            explicit=True,
            lower_atoms=torch.cat(low, -1),
            upper_atoms=torch.cat(up, -1),
        )
    opts = plan.solver
    mv, rmv = self_ops(lin)
    x0 = random_start(lin.batch_shape + (n, d), lin.X, opts.seed)
    res = top_singular_value(
        mv,
        rmv,
        x0,
        method="lanczos" if plan.method == "dense" else plan.method,
        tol=plan.tol,
        max_iter=opts.max_iter,
        krylov_dim=opts.krylov_dim,
    )
    return SelfSolution(
        value=res.sigma.to(torch.float64).amax(-1),
        converged=res.converged.all(-1),
        n_matvec=res.n_matvec.amax(-1),
        explicit=False,
        result=res,
    )


def solve_dense(ops: Operators, plan: Plan) -> DenseSolution:
    """Assemble the Jacobian of ``lin64s`` and take its SVD."""
    lin = ops.lin64s
    assert isinstance(lin, AttentionLinearization)  # the dense method: stored path only
    J = dense_from_linearization(lin, plan.op_geometry)
    finite = torch.isfinite(J).flatten(-2).all(-1)
    J = torch.where(finite[..., None, None], J, torch.zeros_like(J))
    _, S, Vh = torch.linalg.svd(J, full_matrices=False)
    v = Vh[..., 0, :]
    Jv = (J @ v.unsqueeze(-1)).squeeze(-1)
    sigma = torch.linalg.vector_norm(Jv, dim=-1)
    residual = torch.linalg.vector_norm(
        (J.mT @ Jv.unsqueeze(-1)).squeeze(-1) - sigma.square().unsqueeze(-1) * v, dim=-1
    )
    vector = v.reshape(ops.batch + (lin.n, lin.d)).to(ops.lin.X.dtype)
    return DenseSolution(
        jacobian=J, finite=finite, v=v, value=S[..., 0], residual=residual, vector=vector
    )


def _start_vector(ops: Operators, plan: Plan) -> Tensor:
    """The flattened start: seeded Gaussian, Kronecker (docs/certificates.md §6) or chosen."""
    lin, opts = ops.lin_solve, plan.solver
    shape = ops.batch + (lin.n * lin.d,)
    start, seed = opts.start, opts.seed
    if start is None:
        return random_start(shape, lin.X, seed)
    if isinstance(start, str):  # the Kronecker start (stored path only)
        assert isinstance(lin, AttentionLinearization)
        generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        x0 = kronecker_start(lin, geometry=plan.op_geometry, generator=generator)
        return x0.reshape(shape)
    # a chosen start: the probabilistic certificate needs a random one (none is formed)
    return start.reshape(shape).to(lin.X)


def solve_krylov(ops: Operators, plan: Plan, margins: Margins | None) -> KrylovSolution:
    """Lanczos or power iteration on ``lin_solve``, stopped by the width or the residual rule.

    Where the width rule applies (``plan.rtol``), one certified Golub–Kahan–Lanczos cycle runs
    until the certified ends predicted from ``margins`` are within the width; where the margins
    alone leave no room for it, the run stops on the residual rule instead.
    """
    lin, opts = ops.lin_solve, plan.solver
    n, d = lin.n, lin.d
    mv, rmv = flat_ops(lin, plan.op_geometry)
    x0 = _start_vector(ops, plan)
    cap = 300 if opts.max_iter is None else int(opts.max_iter)
    margin = krylov_rounding_margin(n, d, cap, lin.X.dtype) + eval_margin(n, d)
    rtol = plan.rtol
    width_reachable: Tensor | None = None
    if rtol is not None:
        assert margins is not None  # the width rule applies only to certified calls
        accept, reachable, possible = width_rule(
            1.0 + rtol,
            margin,
            margins.mag_norm(),
            margins.model,
            margins.rope,
            n * lin.d_out,
            n * d,
            ops.e_solve - ops.e,
            float32_solve=ops.float32_solve,
            solve_model=margins.solve_model,
        )
        if not bool(possible.any()):  # the relative margins alone are wider than the width
            rtol, width_reachable = None, possible
    if rtol is None:
        res = top_singular_value(
            mv,
            rmv,
            x0,
            method=plan.method,
            tol=plan.tol,
            max_iter=opts.max_iter,
            krylov_dim=opts.krylov_dim,
        )
        return KrylovSolution(res, "residual", margin, width_reachable=width_reachable)
    assert plan.delta is not None  # the width rule applies only with a probabilistic end
    res, prob, _ = golub_kahan_certified(
        mv,
        rmv,
        x0,
        delta=plan.delta,
        rtol=rtol,
        margin=margin,
        tol=plan.tol,
        max_iter=cap,
        krylov_dim=opts.krylov_dim,
        accept=accept,
        reachable=reachable,
        require_residual=plan.tol_given,
    )
    return KrylovSolution(res, "width", margin, prob=prob, width_reachable=reachable(res.sigma))
