r"""Worst-case searches: multi-start ascent of the exact local constant.

* :func:`worst_case_measure`: over weighted atomic measures in the ball :math:`B_R`
  (:math:`L_W` or :math:`L_{\mathrm{split}}`, unmasked or masked; docs/theory.md §A2, §A4);
* :func:`worst_case_sequence`: over sequences in :math:`B_R^n` (:math:`\|Df(X)\|_2`).

Both start from the closed-form constructions of :mod:`meanfield.attacks.constructions`, ascend
with :func:`meanfield.attacks._common.ascend_restarts`, and report the engine's certified bracket
(:func:`meanfield.lipschitz.local_lipschitz`, dense).

Argument order: a search has no input measure; its mathematical inputs are the attention
parameters being attacked and the domain (:math:`R`, :math:`n`), positional in that order; the
search options are keyword-only (``n_restarts``, ``steps``, ``lr``, ``seed``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._numerics import as_float_tensor
from .._typing import MeasureGeometry, Params
from .._validation import reject_variants
from ..measures import DiracMeasure
from ..params import AttentionParams
from ._common import (
    LOG_MASS_FLOOR,
    SearchOptions,
    as_float64,
    ascend_restarts,
    check_radius,
    engine_bracket,
    from_ball,
    measure_constant,
    resolve_options,
    sequence_constant,
    to_ball,
    to_sphere,
)
from .constructions import (
    adversarial_sequence,
    optimal_log_masses,
    score_gap,
    sphere_direction,
    symmetric_directions,
    two_dirac,
    two_positions,
)

__all__ = ["WorstCaseMeasure", "WorstCaseSequence", "worst_case_measure", "worst_case_sequence"]

#: Defaults of the two searches (``meanfield.attacks._common.SearchOptions``).
MEASURE_DEFAULTS = SearchOptions(n_restarts=16, steps=300, lr=0.05, seed=0)
SEQUENCE_DEFAULTS = SearchOptions(n_restarts=8, steps=300, lr=0.05, seed=0)


# =============================================================================================
# 3. worst-case measures and sequences
# =============================================================================================
@dataclass(frozen=True, eq=False)
class WorstCaseMeasure:
    r"""Result of :func:`worst_case_measure`.

    Attributes
    ----------
    measure : DiracMeasure
        The best measure found (``n`` atoms; position-tagged when masked).
    value : float
        Its local constant (dense SVD in float64): :math:`L_W` or :math:`L_{\mathrm{split}}`.
    lower, upper : float
        Certified bracket (``bracket`` says how it was obtained).
    bracket : str
        ``"local_lipschitz (...)"`` or ``"dense SVD"`` (then ``lower = upper = value``).
    geometry : str
    construction_value : float
        Exact local constant of the best construction start (never above ``value``).
    two_dirac_bound : float or None
        Closed-form :math:`\sup_\varepsilon g` (docs/theory.md §5, best gap) for one head,
        unmasked, in the ball.
    restart_values : Tensor, shape (n_starts,)
        Best value reached from every start.
    labels : tuple of str
        Kind of every start (``"two-dirac +"``, ``"two-dirac -"``, ``"init"``, ``"random"``).
    history : Tensor, shape (n_starts, n_records)
        Value per start at the recorded steps.
    history_steps : Tensor, shape (n_records,)
    """

    measure: DiracMeasure
    value: float
    lower: float
    upper: float
    bracket: str
    geometry: str
    construction_value: float
    two_dirac_bound: float | None
    restart_values: Tensor
    labels: tuple[str, ...]
    history: Tensor
    history_steps: Tensor


def _pad(pts: Tensor, lw: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Order atoms by increasing mass and pad to ``n`` by splitting the lightest one.

    Splitting keeps the measure (coincident copies share the mass, geometric ratio 1e-3), and
    the local constant of the split measure is at least that of the original (moving the copies
    together reproduces every perturbation of the original). The heavy atom comes last, so that in
    a causal measure it sees the light ones.
    """
    order = torch.argsort(lw)
    pts, lw = pts[order], lw[order]
    extra = n - pts.shape[0]
    if extra > 0:
        shares = torch.tensor(
            [-3.0 * math.log(10.0) * j for j in range(extra + 1)],
            dtype=torch.float64,
            device=lw.device,
        )
        shares = shares - torch.logsumexp(shares, 0)
        pts = torch.cat([pts[:1].expand(extra + 1, -1), pts[1:]])
        lw = torch.cat([lw[0] + shares, lw[1:]])
    return pts, lw


def _construction_starts(
    params: Params, R: float, n: int, sphere: bool
) -> tuple[list[Tensor], list[Tensor], list[str], float]:
    r"""Construction starts of every head and the best two-Dirac gap.

    * two Diracs (docs/theory.md §5) in both cases at the exact optimal mass (sphere: the sphere
      positions);
    * for :math:`\lambda=u^\top Au>0`, the "balanced" light atom of the small-radius mechanism
      (docs/theory.md §A4): heavy atom at :math:`-Ru`, light atom at :math:`cRu` (:math:`c=0.7`)
      with mass :math:`e^{-\lambda R^2c(1+c)}`, so that the light atom's attention is split evenly;
    * for :math:`\lambda>0` and three atoms or more, the chain (heavy, tiny, tinier) of
      docs/theory.md §A4: :math:`-Ru`, :math:`cRu`, :math:`Ru` (:math:`c=0.5`) with log-masses
      :math:`0`, :math:`-\lambda R^2c(1+c)`, :math:`-2\lambda R^2c`, which balance the middle atom's
      attention across all three (the shape found by random multi-start searches).

    No start (and gap 0) for a single atom: every construction has two atoms or more.
    """
    if n < 2:
        return [], [], [], 0.0
    pts, lws, labels = [], [], []
    best_gap = 0.0
    for h, head in enumerate(params.heads):
        A = as_float64(head.A)
        suffix = f" (head {h})" if len(params.heads) > 1 else ""
        cands: list[tuple[str, float, list[Tensor], list[float]]] = []
        if sphere:
            if A.shape[0] < 2:
                continue
            b, phi = sphere_direction(A)
            Atb = A.mT @ b
            if float(torch.linalg.vector_norm(Atb)) == 0:
                continue
            gamma = R * R * phi
            le, l1m = optimal_log_masses(gamma)
            x_light = R * Atb / torch.linalg.vector_norm(Atb)
            cands.append(("two-dirac sphere", gamma, [R * b, x_light], [l1m, le]))
        else:
            hi, lo = symmetric_directions(A)
            for c, dirn in (("+", hi), ("-", lo)):
                if (c == "+" and dirn.lam > 0) or (c == "-" and dirn.lam < 0):
                    gamma = score_gap(c, dirn.lam, R)
                    x_light, x_heavy = two_positions(c, dirn.u, R)
                    le, l1m = optimal_log_masses(gamma)
                    cands.append((f"two-dirac {c}", gamma, [x_heavy, x_light], [l1m, le]))
            if hi.lam > 0:
                u, lr2 = hi.u, hi.lam * R * R
                cb = 0.7
                cands.append(("balanced +", 0.0, [-R * u, cb * R * u], [0.0, -lr2 * cb * (1 + cb)]))
                cc = 0.5
                chain_lw = [0.0, -lr2 * cc * (1 + cc), -2.0 * lr2 * cc]
                cands.append(("chain +", 0.0, [-R * u, cc * R * u, R * u], chain_lw))
        for name, gamma, xs, ls in cands:
            if len(xs) > n:  # the three-atom chain when n = 2
                continue
            best_gap = max(best_gap, gamma)
            lw = torch.tensor(ls, dtype=torch.float64, device=params.device)
            p, lw = _pad(torch.stack(xs), lw - torch.logsumexp(lw, 0), n)
            pts.append(p)
            lws.append(lw)
            labels.append(name + suffix)
    return pts, lws, labels, best_gap


def _to_points(Z: Tensor, R: float, sphere: bool) -> Tensor:
    """Points of the search variables ``Z``: on the sphere of radius ``R``, or in the open ball."""
    return to_sphere(Z, R) if sphere else to_ball(Z, R)


def _random_starts(
    n_starts: int,
    n: int,
    d: int,
    R: float,
    sphere: bool,
    spread: float,
    gen: torch.Generator,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    D = torch.randn(n_starts, n, d, generator=gen, dtype=torch.float64)
    D = D / torch.linalg.vector_norm(D, dim=-1, keepdim=True)
    if not sphere:
        D = D * torch.rand(n_starts, n, 1, generator=gen, dtype=torch.float64) ** (1.0 / d)
    L = -spread * torch.rand(n_starts, n, generator=gen, dtype=torch.float64)
    return (R * D).to(device), L.to(device)


def _as_init_list(
    init: DiracMeasure | Tensor | Sequence[DiracMeasure] | Sequence[Tensor] | None,
) -> list[DiracMeasure | Tensor]:
    """The starts given as ``init``, as a list (checked by the caller)."""
    if init is None:
        return []
    if isinstance(init, (DiracMeasure, Tensor)):
        return [init]
    return list(init)


def worst_case_measure(
    params: Params,
    R: float,
    n: int,
    *,
    n_restarts: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
    seed: int | None = None,
    lr_mass: float | None = None,
    sphere: bool = False,
    masked: bool | None = None,
    geometry: MeasureGeometry = "wasserstein",
    init: DiracMeasure | Sequence[DiracMeasure] | None = None,
    progress: bool = False,
    certify: bool = True,
) -> WorstCaseMeasure:
    r"""Multi-start gradient ascent of the local constant over weighted atomic measures in :math:`B_R`.

    Maximises over :math:`\mu=\sum_{i=1}^{K}a_i\delta_{x_i}`, :math:`x_i\in B_R` (docs/theory.md
    §A2, §A4):

    .. math:: L_W(\mu)=\big\|D_a^{1/2}\,J\,D_a^{-1/2}\big\|_2,\qquad D_a=\mathrm{diag}(a)\otimes I,

    with :math:`J` the fixed-mass Jacobian of
    :math:`(x_1,\dots,x_K)\mapsto(\Gamma_\mu(x_1),\dots,\Gamma_\mu(x_K))` (``torch.func.jacrev`` of
    :func:`~meanfield.attention.attention_points` with the log-masses held as an input) and the
    top singular value from ``torch.linalg.matrix_norm(ord=2)``, all in float64.
    ``geometry="split"`` maximises :math:`L_{\mathrm{split}}=\max(L_W,\max_i\|\sum_hW_hV_hC^h_iA_h^\top\|_2)`
    instead (the self-Jacobians are ``jacrev`` in the query points).

    Parametrisation: :math:`x=R\tanh(\|z\|)z/\|z\|` (``sphere=True``: :math:`x=Rz/\|z\|`), masses
    :math:`a=\mathrm{softmax}(\ell)` with free log-masses, floored only at :math:`e^{-700}`
    (``LOG_MASS_FLOOR``, the float64 normal range) so that :math:`\sqrt{a_i/a_j}` stays finite. Adam
    maximises :math:`\log L`; the best iterate of every start is kept.

    Starts: the constructions of every head (two Diracs in both cases at the exact optimal mass,
    docs/theory.md §5; for a positive Rayleigh quotient also the balanced light atom and the
    three-atom chain of docs/theory.md §A4; the lightest atom split into copies up to ``n``, the
    same measure), the measures in ``init``, and ``n_restarts`` random measures (uniform in the
    ball, log-masses uniform over :math:`[-1.5\gamma^*,0]`). The exact (unparametrised)
    constructions are candidates too, so the reported value is never below the construction.

    Parameters
    ----------
    params : AttentionParams or MultiHeadParams
    R : float
        Radius of the ball (or sphere).
    n : int
        Number of atoms :math:`K \ge 1`.
    n_restarts : int, default 16
        Random starts (in addition to the construction and ``init`` starts).
    steps : int, default 300
        Adam steps per start (all starts run as one batch).
    lr : float, default 0.05
        Step size on the position variables :math:`z`.
    seed : int, default 0
        Seed of the random starts.
    lr_mass : float, optional
        Step size on the log-masses; default ``lr * max(1, gamma* / 4)`` so that masses can travel
        the :math:`\sim\gamma^*` decades of the optimum.
    sphere : bool, default False
        Atoms on the sphere of radius ``R``.
    masked : bool, optional
        Masked mean-field attention at positions :math:`t_j=j/K` (docs/theory.md §A2): the
        conditional-distance constant. ``None`` (default) means unmasked: a search has no input
        measure whose flag it could follow.
    geometry : {"wasserstein", "split"}, default "wasserstein"
    init : DiracMeasure or sequence of DiracMeasure, optional
        Extra starts with ``n`` atoms.
    progress : bool, default False
        Progress bar on stderr (tqdm).
    certify : bool, default True
        Bracket the best value with :func:`meanfield.lipschitz.local_lipschitz` (dense, Gram
        certificate).

    Returns
    -------
    WorstCaseMeasure
        The measure in the dtype and device of ``params``.

    Notes
    -----
    Provenance: the shape of the maximisers (a few Diracs with masses over many decades) is *stated
    in the paper (v1 abstract)*; the objective is the local constant of docs/theory.md §A2,
    *derived and checked numerically*.
    """
    n = int(n)
    opts, gen = resolve_options(MEASURE_DEFAULTS, "worst_case_measure", n_restarts, steps, lr, seed)
    masked = bool(masked)  # None: unmasked
    R = check_radius(R)
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    if geometry not in ("wasserstein", "split"):
        raise ValueError(f"geometry must be 'wasserstein' or 'split', got {geometry!r}")
    p64 = params.to(dtype=torch.float64)
    d, dev = p64.d, p64.device
    positions = torch.arange(1, n + 1, dtype=torch.float64, device=dev) / n if masked else None

    pts, lws, labels, gap = _construction_starts(p64, R, n, sphere)
    n_cons = len(pts)
    for m in _as_init_list(init):
        if not isinstance(m, DiracMeasure) or m.points.shape != (n, d):
            raise ValueError(f"init measures must be DiracMeasure with {n} atoms in d = {d}")
        P = as_float64(m.points).to(dev)
        if sphere:
            P = R * P / torch.linalg.vector_norm(P, dim=-1, keepdim=True).clamp_min(1e-300)
        elif bool((torch.linalg.vector_norm(P, dim=-1) > R * (1 + 1e-12)).any()):
            raise ValueError("init measures must lie in the ball of radius R")
        pts.append(P)
        lws.append(as_float64(m.log_weights).to(dev))
        labels.append("init")
    spread = max(3.0, min(-LOG_MASS_FLOOR, 1.5 * gap))
    Xr, Lr = _random_starts(opts.n_restarts, n, d, R, sphere, spread, gen, dev)
    labels += ["random"] * opts.n_restarts
    X0 = torch.cat([torch.stack(pts), Xr]) if pts else Xr
    L0 = torch.cat([torch.stack(lws), Lr]) if lws else Lr
    if X0.shape[0] == 0:
        raise ValueError("no start: use n_restarts >= 1 or an init measure")
    Z0 = X0 / R if sphere else from_ball(X0, R)

    def log_masses(Lg: Tensor) -> Tensor:
        return torch.log_softmax(Lg, -1).clamp_min(LOG_MASS_FLOOR)

    def constant(X: Tensor, L: Tensor) -> Tensor:
        return measure_constant(X, L, p64, geometry=geometry, masked=masked, positions=positions)

    def objective(Z: Tensor, Lg: Tensor) -> Tensor:
        return constant(_to_points(Z, R, sphere), log_masses(Lg))

    lrs = [opts.lr, opts.lr * max(1.0, gap / 4.0) if lr_mass is None else float(lr_mass)]
    best, best_p, hist, rec = ascend_restarts(
        objective, [Z0, L0], lrs, opts.steps, progress=progress, desc="worst_case_measure"
    )
    best_vals = best.exp()
    Xb, Lb = _to_points(best_p[0], R, sphere), log_masses(best_p[1])
    # exact construction candidates (not pulled inside the ball)
    cons_value = -math.inf
    if n_cons:
        with torch.no_grad():
            Xc = torch.stack(pts[:n_cons])
            Lc = log_masses(torch.stack(lws[:n_cons]))
            vc = constant(Xc, Lc)
        cons_value = float(vc[int(torch.nan_to_num(vc, nan=-math.inf).argmax())])
        improve = vc >= best_vals[:n_cons]
        best_vals[:n_cons] = torch.maximum(best_vals[:n_cons], vc)
        Xb[:n_cons][improve] = Xc[improve]
        Lb[:n_cons][improve] = Lc[improve]
    k = int(torch.nan_to_num(best_vals, nan=-math.inf).argmax())
    with torch.no_grad():
        value = float(constant(Xb[k : k + 1], Lb[k : k + 1])[0])
    like = params.heads[0].A
    reject_variants(params, "this attack")
    mu = DiracMeasure.from_log_weights(
        Xb[k].detach().to(like),
        Lb[k].detach().to(like.dtype),
        None if positions is None else positions.to(like),
    )
    lower, upper, how = engine_bracket(mu, params, geometry, masked, value, certify)
    bound = None
    if not masked and not sphere and len(params.heads) == 1 and n >= 2:
        try:
            bound = two_dirac(p64, R).g
        except ValueError:
            pass
    return WorstCaseMeasure(
        measure=mu,
        value=value,
        lower=lower,
        upper=upper,
        bracket=how,
        geometry=geometry,
        construction_value=cons_value,
        two_dirac_bound=bound,
        restart_values=best_vals.detach(),
        labels=tuple(labels),
        history=hist.exp(),
        history_steps=rec,
    )


@dataclass(frozen=True, eq=False)
class WorstCaseSequence:
    r"""Result of :func:`worst_case_sequence`.

    Attributes
    ----------
    X : Tensor, shape (n, d)
        Best sequence found (every token in :math:`B_R`, or on the sphere).
    value : float
        :math:`\|Df(X)\|_2` (or :math:`\|Df^m(X)\|_2`), dense SVD in float64.
    lower, upper : float
    bracket : str
    construction_value : float
        Exact constant of the best eigenvector-construction start.
    construction_bound : float or None
        Formula lower bound of the best construction (docs/theory.md §3), one head only.
    restart_values : Tensor, shape (n_starts,)
    labels : tuple of str
    history : Tensor, shape (n_starts, n_records)
    history_steps : Tensor, shape (n_records,)
    """

    X: Tensor
    value: float
    lower: float
    upper: float
    bracket: str
    construction_value: float
    construction_bound: float | None
    restart_values: Tensor
    labels: tuple[str, ...]
    history: Tensor
    history_steps: Tensor


def _sequence_starts(
    params: Params, R: float, n: int, sphere: bool
) -> tuple[list[Tensor], list[str], float | None]:
    X, labels, bound = [], [], None
    single = len(params.heads) == 1
    V1 = None
    if single:
        V1 = params.V if isinstance(params, AttentionParams) else params.head_output_matrix(0)
    for h in range(len(params.heads)):
        A = params.heads[h].A
        suffix = f" (head {h})" if not single else ""
        tries: list[tuple[str, dict]] = []
        if sphere:  # d = 1 raises below: the sphere is two points
            tries.append(("sphere", dict(sphere=True)))
        else:
            for variant in ("released", "symmetric"):
                for c in ("+", "-"):
                    tries.append((f"{variant} {c}", dict(variant=variant, case=c)))
        for name, kw in tries:
            try:
                con = adversarial_sequence(A, R, n, V=V1, **kw)
            except ValueError:
                continue
            X.append(as_float64(con.X))
            labels.append(f"construction {name}{suffix}")
            if con.lower_bound is not None:
                bound = max(bound or 0.0, con.lower_bound)
            if not sphere and n > 2:
                # best k-copy variant: k tokens at the light position, n - k at the heavy one
                log_eps, _ = optimal_log_masses(con.gamma)
                k = min(max(round(n * math.exp(log_eps)), 1), n - 1)
                if k > 1:
                    Xk = as_float64(con.X).clone()
                    Xk[:k] = Xk[0]
                    X.append(Xk)
                    labels.append(f"construction {name} k={k}{suffix}")
    return X, labels, bound


def worst_case_sequence(
    params: Params,
    R: float,
    n: int,
    *,
    n_restarts: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
    seed: int | None = None,
    masked: bool | None = None,
    sphere: bool = False,
    init: Tensor | Sequence[Tensor] | None = None,
    progress: bool = False,
    certify: bool = True,
) -> WorstCaseSequence:
    r"""Multi-start gradient ascent of :math:`\|Df(X)\|_2` over sequences in :math:`B_R^n`.

    .. math:: \mathrm{Lip}(f\,|\,B_R^n)=\sup_{X\in B_R^n}\|Df(X)\|_2

    (docs/theory.md §A2; :math:`B_R^n` is the product of balls, every token in :math:`B_R`; uniform
    weights; Euclidean geometry). Tokens are parametrised as in :func:`worst_case_measure`; the
    Jacobian is ``jacrev`` of :func:`~meanfield.attention.attention_points` and the norm the exact
    top singular value. Starts: the eigenvector construction of every head (released and symmetric
    variants, both cases; sphere variant when ``sphere=True``), its best :math:`k`-copy version
    (:math:`k\approx n\varepsilon^*` tokens at the light position), ``init`` and ``n_restarts``
    random sequences. The exact constructions are candidates, so the result is never below them.

    Parameters
    ----------
    params : AttentionParams or MultiHeadParams
    R : float
    n : int
        Sequence length, ``n >= 1``.
    n_restarts : int, default 8
    steps : int, default 300
    lr : float, default 0.05
    seed : int, default 0
    masked : bool, optional
        Causal attention (:math:`\|Df^m(X)\|_2`); ``None`` (default) means unmasked.
    sphere : bool, default False
        Tokens on the sphere of radius ``R``.
    init : Tensor or sequence of Tensor, optional
        Extra starting sequences of shape (n, d).
    progress : bool, default False
    certify : bool, default True

    Returns
    -------
    WorstCaseSequence

    Notes
    -----
    Provenance: the construction is *from the authors' released code*; the search and the
    :math:`k`-copy start are ours (*derived and checked numerically*).
    """
    opts, gen = resolve_options(
        SEQUENCE_DEFAULTS, "worst_case_sequence", n_restarts, steps, lr, seed
    )
    masked = bool(masked)  # None: unmasked
    R = check_radius(R)
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    p64 = params.to(dtype=torch.float64)
    d, dev = p64.d, p64.device
    pts, labels, bound = _sequence_starts(p64, R, n, sphere)
    n_cons = len(pts)
    for X in _as_init_list(init):
        X = as_float64(as_float_tensor(X, "init")).to(dev)
        if X.shape != (n, d):
            raise ValueError(f"init sequences must have shape ({n}, {d}), got {tuple(X.shape)}")
        pts.append(X)
        labels.append("init")
    Xr, _ = _random_starts(opts.n_restarts, n, d, R, sphere, 1.0, gen, dev)
    labels += ["random"] * opts.n_restarts
    X0 = torch.cat([torch.stack(pts), Xr]) if pts else Xr
    if X0.shape[0] == 0:
        raise ValueError("no start: use n_restarts >= 1 or an init sequence")
    Z0 = X0 / R if sphere else from_ball(X0, R)

    def objective(Z: Tensor) -> Tensor:
        return sequence_constant(_to_points(Z, R, sphere), p64, masked=masked)

    best, best_p, hist, rec = ascend_restarts(
        objective, [Z0], [opts.lr], opts.steps, progress=progress, desc="worst_case_sequence"
    )
    best_vals = best.exp()
    Xb = _to_points(best_p[0], R, sphere)
    cons_value = -math.inf
    if n_cons:
        with torch.no_grad():
            Xc = torch.stack(pts[:n_cons])
            vc = sequence_constant(Xc, p64, masked=masked)
        cons_value = float(torch.nan_to_num(vc, nan=-math.inf).max())
        improve = vc >= best_vals[:n_cons]
        best_vals[:n_cons] = torch.maximum(best_vals[:n_cons], vc)
        Xb[:n_cons][improve] = Xc[improve]
    k = int(torch.nan_to_num(best_vals, nan=-math.inf).argmax())
    with torch.no_grad():
        value = float(sequence_constant(Xb[k : k + 1], p64, masked=masked)[0])
    like = params.heads[0].A
    reject_variants(params, "this attack")
    Xout = Xb[k].to(like)
    lower, upper, how = engine_bracket(Xout, params, "euclidean", masked, value, certify)
    return WorstCaseSequence(
        X=Xout,
        value=value,
        lower=lower,
        upper=upper,
        bracket=how,
        construction_value=cons_value,
        construction_bound=bound,
        restart_values=best_vals.detach(),
        labels=tuple(labels),
        history=hist.exp(),
        history_steps=rec,
    )
