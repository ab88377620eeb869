r"""Solve: the top singular value of the Jacobian at one input, before its certificate.

:func:`solve` runs what the :class:`~meanfield.lipschitz._options.Plan` asks for: the dense SVD
of the assembled Jacobian, or a matrix-free Lanczos or power run on the solver's operator
(:class:`~meanfield.lipschitz._operators.Operators`), and for ``geometry="split"`` the
per-atom self-Jacobian term first. Results stay in the operators' power-of-two units;
:func:`~meanfield.lipschitz._certify.certify_solution` brings them back and builds the bracket.

The solver reads the certificate in one place: the width rule (the default stopping rule)
stops the Lanczos run once the certified ends it predicts from the rounding margins
(:func:`~meanfield.lipschitz._margins.width_rule`) are close enough.

**Progress.** A run reports itself to the standard :mod:`logging` module, logger
``"meanfield.lipschitz"`` (the ``"meanfield"`` logger has a :class:`logging.NullHandler`, so
nothing is printed unless the application configures logging). One line when the run starts,
then while it runs at most one line every :data:`PROGRESS_INTERVAL` seconds (products done and
their cap, the Ritz value, the predicted width ``upper_prob / lower`` while the width rule is in
force, else the residual relative to ``tol``, the elapsed time), and one line when it ends (the
stopping rule, products, value, width or residual). Lines are INFO once the run has lasted
:data:`PROGRESS_INTERVAL`: the start line is then repeated at INFO before the first progress
line. A shorter run logs its start and end lines at DEBUG only. The figures are read from what
the solver has computed anyway (:func:`~meanfield._spectral.observe_steps`, the width rule's
own test, a count of the operator's calls): no product is added and the estimate is the same,
bit for bit, with logging on or off. With no handler enabled for INFO nothing is watched at all.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import _rounding as _rnd
from .._certificates import golub_kahan_certified, krylov_rounding_margin
from .._numerics import iter_chunks
from .._spectral import (
    SpectralResult,
    observe_steps,
    spectral_norm_upper,
    top_singular_value,
)
from ..jacobian import AttentionLinearization
from ..jacobian.products import dense_from_linearization, self_blocks
from ._margins import Margins, width_rule
from ._operators import Operator, Operators, eval_margin, flat_ops, random_start, self_ops
from ._options import Plan
from .starts import kronecker_start

#: Per-atom self-Jacobians are formed explicitly below this many flops (n * d_out * d * min).
_EXPLICIT_SELF_FLOPS = 2e9
#: Entries of explicit self-Jacobian blocks held at once (atoms are processed in chunks).
_EXPLICIT_SELF_ENTRIES = 2**22
#: Seconds between two progress lines of a running estimate; a run shorter than this logs at
#: DEBUG only (module docstring, "Progress").
PROGRESS_INTERVAL = 5.0
#: The clock of the progress lines (a test replaces it).
_clock = time.monotonic

logger = logging.getLogger("meanfield.lipschitz")


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


Op = Callable[[Tensor], Tensor]

#: The messages of :class:`_Progress` (module docstring, "Progress"), %-formatted lazily.
_START = (
    "local_lipschitz start: n=%d d=%d heads=%d batch=%d dtype=%s solve_dtype=%s method=%s "
    "geometry=%s path=%s rule=%s max_products=%s"
)
_STEP_WIDTH = "local_lipschitz %s: %d/%d products, ritz %.6g, width %.6g (target %.6g), %.1f s"
_STEP_RESIDUAL = "local_lipschitz %s: %d/%d products, ritz %.6g, residual %.2e (tol %.2e), %.1f s"
_END_WIDTH = (
    "local_lipschitz done: stop=%s, %d products, value %.6g, width %.6g (target %.6g), "
    "converged=%s, %.1f s"
)
_END_RESIDUAL = (
    "local_lipschitz done: stop=%s, %d products, value %.6g, residual %.2e (tol %.2e), "
    "converged=%s, %.1f s"
)
_END_DENSE = "local_lipschitz done: stop=dense, value %.6g, %.1f s"


def _top(x: Tensor) -> float:
    """The largest entry of ``x`` as a float (NaN for an empty tensor or a NaN entry)."""
    return float(x.detach().max()) if x.numel() else math.nan


class _Progress:
    """The progress lines of one :func:`solve` (module docstring, "Progress").

    Made only when the logger is enabled for INFO. It reads what the solver computes anyway:
    the Ritz values and residual estimates of each step (:meth:`observe`, through
    :func:`~meanfield._spectral.observe_steps`), the width rule's arguments (:meth:`watch_accept`)
    and the number of calls of the operator (:meth:`count`); it changes no tensor.
    """

    def __init__(self, ops: Operators, plan: Plan) -> None:
        self.interval = float(PROGRESS_INTERVAL)
        self.t0 = _clock()
        self.next = self.t0 + self.interval
        self.loud = False  # whether the INFO start line was written
        self.phase: str = plan.method
        self.products = 0
        self.shift = ops.e_solve  # the solver's units, 2**e_solve, to those of J
        self.tol = plan.tol
        self.tol_given = plan.tol_given
        self.target = math.nan if plan.width is None else float(plan.width)
        max_iter = plan.solver.max_iter
        if plan.method == "lanczos":
            self.cap = 2 * (300 if max_iter is None else int(max_iter)) + 2
        elif plan.method == "power":
            self.cap = 2 * (1000 if max_iter is None else int(max_iter))
        else:
            self.cap = 0
        lin = ops.lin
        if plan.method == "dense":
            rule = "dense"
        elif plan.rtol is not None:
            rule = f"width<={1.0 + plan.rtol:g}"
        else:
            rule = f"residual<={plan.tol:g}"
        self.header = (
            lin.n,
            lin.d,
            len(lin.params.heads),
            math.prod(ops.batch),
            str(lin.X.dtype).removeprefix("torch."),
            str(ops.lin_solve.X.dtype).removeprefix("torch."),
            plan.method,
            plan.geometry,
            plan.path,
            rule,
            self.cap if self.cap else "-",
        )
        logger.debug(_START, *self.header)

    def _promote(self) -> None:
        """The start line again at INFO, once: the run is no longer a short one."""
        if not self.loud:
            self.loud = True
            logger.info(_START, *self.header)

    def _due(self) -> float | None:
        """The elapsed seconds where a progress line is due (the interval has passed), else None."""
        now = _clock()
        if now < self.next:
            return None
        self.next = now + self.interval
        self._promote()
        return now - self.t0

    def count(self, op: Op) -> Op:
        """``op`` counting its calls (one batched product each)."""

        def counted(x: Tensor) -> Tensor:
            self.products += 1
            return op(x)

        return counted

    def ritz(self, sigma: Tensor) -> float:
        """The largest Ritz value of the batch, in the units of J."""
        return _top(_rnd.unscale(sigma.detach().to(torch.float64), self.shift))

    def _step(
        self, template: str, sigma: Tensor, metric: float, target: float, elapsed: float
    ) -> None:
        """A progress line: products, Ritz value, ``metric`` (width or residual) and its target."""
        logger.info(
            template, self.phase, self.products, self.cap, self.ritz(sigma), metric, target, elapsed
        )

    def observe(self, sigma: Tensor, residual: Tensor, done: Tensor) -> None:
        """A step of :func:`lanczos_svd` or :func:`power_iteration`: the residual line when due.

        The residual relative to ``sigma**2`` is the largest among the batch elements still
        running (all of them once every one has stopped).
        """
        elapsed = self._due()
        if elapsed is None:
            return
        s = sigma.detach().to(torch.float64)
        rel = residual.detach().to(torch.float64) / s.square()
        running = ~done
        if bool(running.any()):
            rel = rel[running]
        self._step(_STEP_RESIDUAL, sigma, _top(rel), self.tol, elapsed)

    def watch_accept(
        self,
        accept: Callable[[Tensor, Tensor], Tensor],
        width_of: Callable[[Tensor, Tensor], Tensor],
    ) -> Callable[[Tensor, Tensor], Tensor]:
        """The width rule's test, writing the predicted width when a line is due."""

        def watched(sigma: Tensor, bound: Tensor) -> Tensor:
            out = accept(sigma, bound)
            elapsed = self._due()
            if elapsed is not None:
                self._step(_STEP_WIDTH, sigma, _top(width_of(sigma, bound)), self.target, elapsed)
            return out

        return watched

    def finish(self, solution: Solution, width: float | None) -> None:
        """The end line: INFO once the run has lasted the interval, else DEBUG.

        ``width`` is the predicted ``upper_prob / lower`` of a run stopped on the width rule.
        """
        elapsed = _clock() - self.t0
        if elapsed >= self.interval:
            self._promote()
        level = logging.INFO if self.loud else logging.DEBUG
        run, self_term = solution.run, solution.self_term
        self_value = math.nan if self_term is None else _top(self_term.value)
        # without a self term self_value is NaN, against which max keeps its first argument
        if isinstance(run, DenseSolution):
            logger.log(level, _END_DENSE, max(_top(run.value), self_value), elapsed)
            return
        res = run.result
        value = max(self.ritz(res.sigma), self_value)
        products = int(res.n_matvec.max())
        if self_term is not None:
            products += int(self_term.n_matvec.max())
        converged = bool(res.converged.all())
        if width is not None and run.stop_rule == "width":
            # the estimate's own rule: the width met (and the residual too where tol was given)
            converged = width <= self.target and (converged or not self.tol_given)
        if width is not None:
            template, metric, target = _END_WIDTH, width, self.target
        else:
            rel = (
                res.residual.detach().to(torch.float64)
                / res.sigma.detach().to(torch.float64).square()
            )
            template, metric, target = _END_RESIDUAL, _top(rel), self.tol
        logger.log(
            level, template, run.stop_rule, products, value, metric, target, converged, elapsed
        )


@contextmanager
def _watching(progress: _Progress | None, phase: str) -> Iterator[None]:
    """The solvers' steps reported to ``progress`` as ``phase`` (nothing when it is ``None``)."""
    if progress is None:
        yield
        return
    progress.phase = phase
    with observe_steps(progress.observe):
        yield


def solve(ops: Operators, plan: Plan, margins: Margins | None) -> Solution:
    """Run the solver of ``plan`` on ``ops`` (the self term first, then the main run).

    ``margins`` (certified calls only) is read by the width rule. The run logs its progress
    (module docstring, "Progress").
    """
    # a tracker, or None (nothing watched) where the logger would drop INFO lines
    progress = _Progress(ops, plan) if logger.isEnabledFor(logging.INFO) else None
    self_term = solve_self_term(ops, plan, progress) if plan.geometry == "split" else None
    run: DenseSolution | KrylovSolution
    width: float | None = None
    if plan.method == "dense":
        run = solve_dense(ops, plan)
    else:
        run, width = solve_krylov(ops, plan, margins, progress)
    solution = Solution(run, self_term)
    if progress is not None:
        progress.finish(solution, width)
    return solution


def solve_self_term(ops: Operators, plan: Plan, progress: _Progress | None) -> SelfSolution:
    r""":math:`\max_i\|S_i\|_2`: explicit blocks and their SVDs, or batched per-atom Lanczos.

    ``progress`` (:func:`solve`'s tracker) is told the per-atom run's steps.
    """
    lin, lin64 = ops.lin, ops.lin64
    n, d, d_out = lin.n, lin.d, lin.d_out
    batch, dev = lin64.batch_shape, lin64.X.device
    explicit = plan.method == "dense" or (
        n * d_out * d * min(d_out, d) * max(1, math.prod(batch)) <= _EXPLICIT_SELF_FLOPS
    )
    if explicit:
        sv, low, up = [], [], []
        per_atom = max(1, math.prod(batch)) * lin64.d_out * lin64.d
        assert isinstance(lin, AttentionLinearization)  # the split geometry: stored path only
        assert isinstance(lin64, AttentionLinearization)
        block = lin.chunk_size or max(1, _EXPLICIT_SELF_ENTRIES // per_atom)
        for sl in iter_chunks(lin64.n, block):
            S = self_blocks(lin64, sl)  # (..., c, d_out, d)
            s, _, s_prod, _ = dense_top(S)
            low.append(s_prod)
            sv.append(s)
            up.append(spectral_norm_upper(S, candidate=s, max_iter=0))
        return SelfSolution(
            value=torch.cat(sv, -1).amax(-1),
            converged=torch.ones(batch, dtype=torch.bool, device=dev),
            n_matvec=torch.zeros(batch, dtype=torch.int64, device=dev),
            explicit=True,
            lower_atoms=torch.cat(low, -1),
            upper_atoms=torch.cat(up, -1),
        )
    mv, rmv = self_ops(lin)
    x0 = random_start(lin.batch_shape + (n, d), lin.X, plan.solver.seed)
    if progress is not None:
        mv, rmv = progress.count(mv), progress.count(rmv)
        progress.shift = 0  # the self blocks of lin, in the units of J
    with _watching(progress, "self term"):
        res = _residual_run(mv, rmv, x0, "lanczos" if plan.method == "dense" else plan.method, plan)
    if progress is not None:  # the main run: its own count, in the solver's units
        progress.products, progress.shift = 0, ops.e_solve
    return SelfSolution(
        value=res.sigma.to(torch.float64).amax(-1),
        converged=res.converged.all(-1),
        n_matvec=res.n_matvec.amax(-1),
        explicit=False,
        result=res,
    )


def _residual_run(
    mv: Operator, rmv: Operator, x0: Tensor, method: str, plan: Plan
) -> SpectralResult:
    """:func:`top_singular_value` on the residual rule, with the plan's tolerance and caps."""
    opts = plan.solver
    return top_singular_value(
        mv, rmv, x0, method=method, tol=plan.tol, max_iter=opts.max_iter, krylov_dim=opts.krylov_dim
    )


def dense_top(J: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The top singular value of ``J`` (..., m, N) by SVD, with its right singular vector ``v``.

    Returns the singular value, ``v``, :math:`\|Jv\|` from one explicit product and the residual
    :math:`\|J^\top Jv-\|Jv\|^2v\|`.
    """
    _, S, Vh = torch.linalg.svd(J, full_matrices=False)
    v = Vh[..., 0, :]
    Jv = (J @ v.unsqueeze(-1)).squeeze(-1)
    sigma = torch.linalg.vector_norm(Jv, dim=-1)
    residual = torch.linalg.vector_norm(
        (J.mT @ Jv.unsqueeze(-1)).squeeze(-1) - sigma.square().unsqueeze(-1) * v, dim=-1
    )
    return S[..., 0], v, sigma, residual


def solve_dense(ops: Operators, plan: Plan) -> DenseSolution:
    """Assemble the Jacobian of ``lin64s`` and take its SVD."""
    lin = ops.lin64s
    assert isinstance(lin, AttentionLinearization)  # the dense method: stored path only
    J = dense_from_linearization(lin, plan.op_geometry)
    finite = torch.isfinite(J).flatten(-2).all(-1)
    J = torch.where(finite[..., None, None], J, torch.zeros_like(J))
    value, v, _, residual = dense_top(J)
    vector = v.reshape(ops.batch + (lin.n, lin.d)).to(ops.lin.X.dtype)
    return DenseSolution(
        jacobian=J, finite=finite, v=v, value=value, residual=residual, vector=vector
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


def solve_krylov(
    ops: Operators, plan: Plan, margins: Margins | None, progress: _Progress | None
) -> tuple[KrylovSolution, float | None]:
    """Lanczos or power iteration on ``lin_solve``, stopped by the width or the residual rule.

    Where the width rule applies (``plan.rtol``), one certified Golub–Kahan–Lanczos cycle runs
    until the certified ends predicted from ``margins`` are within the width; where the margins
    alone leave no room for it, the run stops on the residual rule instead. The run reports to
    ``progress``; the predicted width of a width stop is returned beside the solution.
    """
    lin, opts = ops.lin_solve, plan.solver
    n, d = lin.n, lin.d
    mv, rmv = flat_ops(lin, plan.op_geometry)
    if progress is not None:
        mv, rmv = progress.count(mv), progress.count(rmv)
    x0 = _start_vector(ops, plan)
    cap = 300 if opts.max_iter is None else int(opts.max_iter)
    margin = krylov_rounding_margin(n, d, cap, lin.X.dtype) + eval_margin(n, d)
    rtol = plan.rtol
    width_reachable: Tensor | None = None
    if rtol is not None:
        assert margins is not None  # the width rule applies only to certified calls
        accept, reachable, possible, ratio = width_rule(
            1.0 + rtol,
            margin,
            margins,
            n * lin.d_out,
            n * d,
            ops.e_solve - ops.e,
            float32_solve=ops.float32_solve,
        )
        if not bool(possible.any()):  # the relative margins alone are wider than the width
            rtol, width_reachable = None, possible
    if rtol is None:
        with _watching(progress, plan.method):
            res = _residual_run(mv, rmv, x0, plan.method, plan)
        return KrylovSolution(res, "residual", margin, width_reachable=width_reachable), None
    assert plan.delta is not None  # the width rule applies only with a probabilistic end
    assert margins is not None
    width_of = None
    if progress is not None:  # the first cycle reports through the width rule's test
        width_of = ratio
        accept = progress.watch_accept(accept, width_of)
    with _watching(progress, plan.method):  # a restarted continuation on the residual rule
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
    run = KrylovSolution(res, "width", margin, prob=prob, width_reachable=reachable(res.sigma))
    width = None if width_of is None else _top(width_of(res.sigma, prob))
    return run, width
