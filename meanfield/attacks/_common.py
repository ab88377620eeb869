r"""Shared machinery of the attacks: float64 helpers, ball parametrisations, the multi-start ascent.

Private. The searches of :mod:`meanfield.attacks` (:func:`~meanfield.attacks.worst_case_measure`,
:func:`~meanfield.attacks.worst_case_sequence`, :func:`~meanfield.attacks.off_axis_two_atoms`,
:func:`~meanfield.attacks.mass_splitting_attack`) share

* :class:`SearchOptions`, the options every multi-start search takes (restarts, steps, step size,
  seed), with :func:`resolve_options` merging it with the per-call keywords;
* :func:`ascend_restarts` (a batch of starts ascended together by Adam, best iterate of every start kept)
  and :func:`run_single` (one start, scalar objective);
* :func:`measure_constant` and :func:`sequence_constant`, the exact local constants as
  *differentiable, batched* functions of the points (``jacrev`` plus a dense ``matrix_norm``).

Why a second dense evaluation next to :func:`meanfield.lipschitz.local_lipschitz`: the ascent
differentiates the constant with respect to the points and log-masses of a whole batch of starts,
which the engine (an estimator returning a bracket, detached) does not do. The reported brackets
come from the engine (:func:`engine_bracket`), and tests/meanfield/test_attacks_search.py checks that both give
the same number (docs/theory.md, "Local constants on measures").
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor
from torch.func import jacrev

from .._typing import Geometry, Params
from .._validation import reject_variants
from ..attention import attention_points
from ..lipschitz import local_lipschitz
from ..measures import DiracMeasure
from ..params import AttentionParams, MultiHeadParams

#: Smallest log-mass used by the searches: e^-700 ~ 1e-304 stays a normal float64, so
#: sqrt(a_i / a_j) <= e^350 never overflows. Far below any moderate floor such as 1e-14.
LOG_MASS_FLOOR = -700.0
#: Atoms on the sphere of radius R are pulled inside by this relative amount before inverting the
#: ball parametrisation x = R tanh(|z|) z/|z| (atanh(1) is infinite).
_BALL_SHRINK = 1e-7


# =============================================================================================
# search options
# =============================================================================================
@dataclass(frozen=True)
class SearchOptions:
    """Options shared by the multi-start searches.

    Attributes
    ----------
    n_restarts : int
        Random starts, in addition to the structured starts of each search.
    steps : int
        Adam steps per start.
    lr : float
        Adam step size, a positive number.
    seed : int
        Seed of the CPU generator drawing the random starts.

    Each search has its own defaults (``worst_case_measure``: 16 restarts, 300 steps;
    ``worst_case_sequence``: 8, 300; ``off_axis_two_atoms``: 16, 400; ``mass_splitting_attack``:
    3, 150; all ``lr = 0.05`` and ``seed = 0``). The searches take the fields as keywords; a
    field left at ``None`` takes the search's default.
    """

    n_restarts: int | None = None
    steps: int | None = None
    lr: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_restarts", "steps"):
            v = getattr(self, name)
            if v is not None and int(v) < 0:
                raise ValueError(f"{name} must be non-negative, got {v}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr}")


@dataclass(frozen=True)
class ResolvedOptions:
    """The options of one search call, every field set (returned by :func:`resolve_options`)."""

    n_restarts: int
    steps: int
    lr: float
    seed: int


def resolve_options(
    defaults: SearchOptions,
    what: str,
    n_restarts: int | None,
    steps: int | None,
    lr: float | None,
    seed: int | None,
) -> tuple[ResolvedOptions, torch.Generator]:
    """The options of a search: its defaults, replaced by the values given (``None``: default).

    Returns the complete options, checked (a one-line ValueError naming ``what`` and the field),
    and the generator of the random starts (a CPU generator seeded with ``seed``).
    """
    given: dict[str, Any] = {"n_restarts": n_restarts, "steps": steps, "lr": lr, "seed": seed}
    opts = replace(defaults, **{k: v for k, v in given.items() if v is not None})
    if opts.n_restarts is None or opts.steps is None or opts.lr is None or opts.seed is None:
        raise ValueError(f"{what}: the defaults {defaults} leave an option unset")
    resolved = ResolvedOptions(
        int(opts.n_restarts), int(opts.steps), float(opts.lr), int(opts.seed)
    )
    return resolved, torch.Generator(device="cpu").manual_seed(resolved.seed)


# =============================================================================================
# small helpers
# =============================================================================================
def as_float64(t: Tensor) -> Tensor:
    return t.detach().to(torch.float64)


def check_radius(R: float) -> float:
    R = float(R)
    if not (math.isfinite(R) and R > 0):
        raise ValueError(f"R must be a positive finite number, got {R}")
    return R


def log_sigmoid(x: float) -> float:
    """``log(1 / (1 + e^-x))`` without overflow (x may be +-inf)."""
    if x == math.inf:
        return 0.0
    if x >= 0:
        return -math.log1p(math.exp(-x))
    return x - math.log1p(math.exp(x))


def fix_sign(v: Tensor) -> Tensor:
    """Unit vector with its largest-magnitude entry positive (a deterministic sign)."""
    v = v / torch.linalg.vector_norm(v)
    return v if v[v.abs().argmax()] >= 0 else -v


def to_ball(Z: Tensor, R: float) -> Tensor:
    r"""Points :math:`R\tanh(\|z\|)z/\|z\|` of the open ball (smooth at 0)."""
    r = torch.sqrt(Z.square().sum(-1, keepdim=True) + 1e-200)
    return R * (torch.tanh(r) / r) * Z


def from_ball(X: Tensor, R: float) -> Tensor:
    r = torch.linalg.vector_norm(X, dim=-1, keepdim=True)
    rr = (r / R).clamp(max=1.0 - _BALL_SHRINK)
    scale = torch.where(r > 0, torch.atanh(rr) / torch.where(r > 0, r, torch.ones_like(r)), 0.0)
    return X * scale


def to_sphere(Z: Tensor, R: float) -> Tensor:
    return R * Z / torch.sqrt(Z.square().sum(-1, keepdim=True) + 1e-200)


def single_head_matrices(params: Params, what: str) -> tuple[Tensor, Tensor]:
    reject_variants(params, what)
    if isinstance(params, AttentionParams):
        return params.A, params.V
    if isinstance(params, MultiHeadParams) and params.n_heads == 1:
        return params.heads[0].A, params.head_output_matrix(0)
    raise ValueError(f"{what} is a single-head bound: pass AttentionParams (or one head)")


# =============================================================================================
# generic multi-start ascent
# =============================================================================================
def _adam_step(opt: torch.optim.Optimizer, params: list[Tensor], loss: Tensor) -> None:
    """One step of ``opt`` down ``loss``, non-finite gradient entries set to zero."""
    opt.zero_grad()
    loss.backward()
    for p in params:
        if p.grad is not None:
            torch.nan_to_num_(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
    opt.step()


def ascend_restarts(
    objective: Callable[..., Tensor],
    init: list[Tensor],
    lrs: list[float],
    steps: int,
    *,
    log_objective: bool = False,
    progress: bool = False,
    desc: str = "search",
) -> tuple[Tensor, list[Tensor], Tensor, Tensor]:
    """Adam ascent of a batch-separable objective; keeps the best iterate of every start.

    ``objective(*params)`` returns one value per start (first dimension). Maximises the value
    (``log_objective=True``) or its logarithm. Returns (best values (S,), best parameters, history
    (S, T) of the values at the recorded steps, recorded step indices (T,): every
    ``max(1, steps // 60)``-th step and the last). Values are on the
    objective's scale (log when ``log_objective``).
    """
    params = [p.detach().clone().requires_grad_(True) for p in init]
    opt = torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])
    S = params[0].shape[0]
    best = torch.full((S,), -math.inf, dtype=torch.float64, device=params[0].device)
    best_p = [p.detach().clone() for p in params]
    every = max(1, steps // 60)
    hist, rec = [], []
    it = range(steps + 1)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=desc, leave=False)
    for step in it:
        vals = objective(*params)
        score = vals if log_objective else torch.log(vals)
        v = torch.nan_to_num(score.detach(), nan=-math.inf)
        better = v > best
        if bool(better.any()):
            best = torch.where(better, v, best)
            for bp, p in zip(best_p, params):
                bp[better] = p.detach()[better]
        if step % every == 0 or step == steps:
            hist.append(v.clone())
            rec.append(step)
        if step == steps:
            break
        loss = -torch.where(torch.isfinite(score), score, torch.zeros_like(score)).sum()
        _adam_step(opt, params, loss)
    return best, best_p, torch.stack(hist, dim=1), torch.tensor(rec)


# =============================================================================================
# exact local constants from jacrev (small dense problems)
# =============================================================================================
def batched_jacobian(fn: Callable[[Tensor], Tensor], X: Tensor) -> Tensor:
    """J[b] = d fn(X)[b] / d X[b], shape (B, n*d_out, n*d), for a batch-separable ``fn``."""
    B, n, d = X.shape
    J = jacrev(lambda Y: fn(Y).sum(0))(X)  # (n, d_out, B, n, d)
    return J.permute(2, 0, 1, 3, 4).reshape(B, -1, n * d)


def measure_constant(
    X: Tensor,
    la: Tensor,
    params: Params,
    *,
    geometry: str,
    masked: bool,
    positions: Tensor | None,
) -> Tensor:
    r"""Exact :math:`L_W` (or :math:`L_{\mathrm{split}}`) for a batch of measures, differentiable.

    ``X`` (B, n, d), ``la`` (B, n) log-masses. :math:`L_W=\|D_a^{1/2}JD_a^{-1/2}\|_2` with the
    fixed-mass Jacobian :math:`J` from ``jacrev`` of :func:`attention_points`.

    Deliberately not :func:`meanfield.lipschitz.local_lipschitz`: the searches differentiate this
    value with respect to the points and log-masses of a batch of starts. It equals the engine's
    dense value (tests/meanfield/test_attacks_search.py), which supplies the reported brackets.
    """
    B, n, d = X.shape

    def fn(Y: Tensor) -> Tensor:
        return attention_points(Y, params, log_weights=la, masked=masked, positions=positions)

    J = batched_jacobian(fn, X)
    d_out = J.shape[1] // n
    so = (0.5 * la).repeat_interleave(d_out, -1)
    si = (0.5 * la).repeat_interleave(d, -1)
    val = torch.linalg.matrix_norm(torch.exp(so[:, :, None] - si[:, None, :]) * J, ord=2)
    if geometry == "split":

        def gq(Q: Tensor) -> Tensor:
            return attention_points(
                X,
                params,
                log_weights=la,
                masked=masked,
                positions=positions,
                queries=Q,
                query_positions=positions,
            ).sum(0)

        S = jacrev(gq)(X)  # (n, d_out, B, n, d)
        idx = torch.arange(n, device=X.device)
        S = S[idx, :, :, idx, :].permute(2, 0, 1, 3)  # (B, n, d_out, d)
        val = torch.maximum(val, torch.linalg.matrix_norm(S, ord=2).amax(-1))
    return val


def sequence_constant(X: Tensor, params: Params, *, masked: bool) -> Tensor:
    r"""Exact :math:`\|Df(X)\|_2` for a batch of sequences (B, n, d), differentiable."""

    def fn(Y: Tensor) -> Tensor:
        return attention_points(Y, params, masked=masked)

    return torch.linalg.matrix_norm(batched_jacobian(fn, X), ord=2)


def engine_bracket(
    x: Tensor | DiracMeasure,
    params: Params,
    geometry: Geometry,
    masked: bool,
    value: float,
    certify: bool,
) -> tuple[float, float, str]:
    """Certified bracket of the engine (:func:`meanfield.lipschitz.local_lipschitz`, dense).

    ``certify=False`` skips the engine: the bracket is the dense value of the search. Only a
    configuration the engine declares unsupported (``NotImplementedError``: ``"split"`` with
    rotary heads) falls back to that value too, with a warning; any other error propagates.
    """
    if not certify:
        return value, value, "dense SVD"
    try:
        est = local_lipschitz(x, params, geometry=geometry, masked=masked, method="dense")
    except NotImplementedError as err:
        warnings.warn(f"local_lipschitz: {err}; bracket from the dense SVD", stacklevel=3)
        return value, value, "dense SVD"
    return float(est.lower), float(est.upper), f"local_lipschitz ({est.method}, {est.upper_method})"


def run_single(
    objective: Callable[..., Tensor], init: list[Tensor], lrs: list[float], steps: int
) -> tuple[float, list[Tensor]]:
    """Adam ascent of a positive scalar objective from one start; best value and parameters."""
    params = [p.detach().clone().requires_grad_(True) for p in init]
    opt = torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])
    best, best_p = -math.inf, [p.detach().clone() for p in params]
    for step in range(steps + 1):
        val = objective(*params)
        v = float(val.detach())
        if math.isfinite(v) and v > best:
            best, best_p = v, [p.detach().clone() for p in params]
        if step == steps or not (math.isfinite(v) and v > 0):
            break
        _adam_step(opt, params, -torch.log(val))
    return best, best_p
