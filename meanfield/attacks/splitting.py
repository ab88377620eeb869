r"""Mass splitting: the splitting constant and the finite-budget attack.

* :func:`split_constant`: the infinitesimal splitting constant :math:`L_{\mathrm{split}}`
  (docs/theory.md §A5);
* :func:`mass_splitting_attack`: move-only against split-then-move perturbations of a measure
  under a :math:`W_2` budget, and perturbations that change the number of tokens
  (docs/theory.md §10, §A5, §A6; docs/derivations/mass_splitting.md), measured with exact
  :math:`W_2` and :math:`W_\infty` on both sides (:mod:`meanfield.distances`).

The closed-form gain :math:`G_k` of the duplicate-then-move attack and its best number of copies
are :func:`theory.bounds.split_gain` and :func:`theory.bounds.optimal_split_k` (docs/theory.md
§10).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .._typing import Params
from .._validation import reject_variants
from ..attention import attention, attention_points
from ..distances import wasserstein, wasserstein_inf
from ..lipschitz import local_lipschitz
from ..measures import DiracMeasure
from ._common import (
    LOG_MASS_FLOOR,
    SearchOptions,
    as_float64,
    batched_jacobian,
    check_radius,
    from_ball,
    measure_constant,
    resolve_options,
    run_single,
    to_ball,
)

__all__ = ["MassSplittingAttack", "Perturbation", "mass_splitting_attack", "split_constant"]

#: Defaults of :func:`mass_splitting_attack` (``meanfield.attacks._common.SearchOptions``).
SPLITTING_DEFAULTS = SearchOptions(n_restarts=3, steps=150, lr=0.05, seed=0)


def split_constant(
    mu: DiracMeasure,
    params: Params,
    *,
    masked: bool | None = None,
    method: Literal["auto", "engine", "jacrev"] = "auto",
) -> Tensor:
    r"""Infinitesimal splitting constant :math:`L_{\mathrm{split}}(\mu)` (docs/theory.md §A5).

    .. math:: L_{\mathrm{split}}(\mu)=\max\Big(L_W(\mu),\ \max_i\Big\|\sum_hW_hV_hC^h_iA_h^\top\Big\|_2\Big),
              \qquad L_W(\mu)=\|D_a^{1/2}JD_a^{-1/2}\|_2 ,

    with :math:`C^h_i` the covariance of head :math:`h`'s attention kernel at atom :math:`i`: the
    local constant when atoms may also split into pieces that move apart.

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched measure with distinct atoms.
    params : AttentionParams or MultiHeadParams
    masked : bool, optional
        Default ``mu.is_causal``.
    method : {"auto", "engine", "jacrev"}, default "auto"
        ``"engine"``: :func:`meanfield.lipschitz.local_lipschitz` with ``geometry="split"``;
        ``"jacrev"``: the differentiable dense Jacobians the searches ascend (an independent
        check of the engine); ``"auto"``: the engine.

    Returns
    -------
    Tensor, shape ()
        In the dtype of ``mu``.

    Notes
    -----
    Provenance: *derived and checked numerically* (docs/theory.md §A5).
    """
    if mu.points.ndim != 2:
        raise ValueError("split_constant needs an unbatched measure")
    masked = mu.is_causal if masked is None else bool(masked)
    if method not in ("auto", "engine", "jacrev"):
        raise ValueError(f"method must be 'auto', 'engine' or 'jacrev', got {method!r}")
    if method in ("auto", "engine"):
        return local_lipschitz(mu, params, geometry="split", masked=masked, method="dense").value
    p64 = params.to(dtype=torch.float64)
    positions = None
    if masked:
        if mu.positions is None:
            raise ValueError("masked split_constant needs a position-tagged (causal) measure")
        positions = as_float64(mu.positions)
    with torch.no_grad():
        val = measure_constant(
            as_float64(mu.points).unsqueeze(0),
            as_float64(mu.log_weights).unsqueeze(0),
            p64,
            geometry="split",
            masked=masked,
            positions=positions,
        )[0]
    return val.to(mu.dtype)


# ---------------------------------------------------------------------------- exact W2 in torch
def _w2sq(Y: Tensor, a: Tensor, Z: Tensor, b: Tensor) -> Tensor:
    r"""Exact :math:`W_2^2` between :math:`\sum a_i\delta_{y_i}` and :math:`\sum b_j\delta_{z_j}`.

    Differentiable: in the points with the optimal plan held fixed (Danskin), in the masses through
    the dual potentials (envelope theorem). Network simplex of POT in float64.

    Deliberately not :func:`meanfield.distances.wasserstein`: the attack ascends the mass fractions
    of the split copies, which needs this gradient in the masses; the library's distance carries
    gradients to the points only. Every number the attack *reports* is measured with
    :func:`~meanfield.distances.wasserstein` (``emit`` in :func:`mass_splitting_attack`).
    """
    import ot

    M = (Y.unsqueeze(-2) - Z.unsqueeze(-3)).square().sum(-1)
    an = a.detach().cpu().numpy().astype(np.float64)
    bn = b.detach().cpu().numpy().astype(np.float64)
    an, bn = an / an.sum(), bn / bn.sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        G, log = ot.emd(an, bn, np.ascontiguousarray(M.detach().cpu().numpy()), log=True)
    plan = torch.as_tensor(G, dtype=M.dtype, device=M.device)
    f = torch.as_tensor(log["u"], dtype=M.dtype, device=M.device)
    g = torch.as_tensor(log["v"], dtype=M.dtype, device=M.device)
    return (plan * M).sum() + ((a - a.detach()) * f).sum() + ((b - b.detach()) * g).sum()


@dataclass(frozen=True, eq=False)
class Perturbation:
    r"""One perturbation :math:`\nu` of :math:`\mu`, measured exactly on both sides.

    Attributes
    ----------
    kind : str
        ``"move"``, ``"split"``, ``"duplicate"`` or ``"insert"``.
    nu : DiracMeasure
        The perturbed measure.
    input_w2, output_w2 : float
        :math:`W_2(\nu,\mu)` and :math:`W_2(F\nu,F\mu)`, exact (:func:`~meanfield.distances.wasserstein`).
    ratio_w2 : float
        ``output_w2 / input_w2``.
    input_winf, output_winf, ratio_winf : float
        The same with :func:`~meanfield.distances.wasserstein_inf`.
    cost_bound : float
        Upper bound on ``input_w2`` from the construction: the budget
        :math:`(\sum_ia_i\|\delta_i\|^2)^{1/2}` for moves and splits, the docs/theory.md §A6 plan
        for duplicating and inserting a token.
    k : int or None
        Copies of the split atom (``"split"``).
    atom : int or None
        The split or duplicated atom.
    fractions : Tensor or None, shape (k,)
        Mass fractions of the copies (``"split"``).
    z : Tensor or None, shape (d,)
        The inserted token (``"insert"``).
    """

    kind: str
    nu: DiracMeasure
    input_w2: float
    output_w2: float
    ratio_w2: float
    input_winf: float
    output_winf: float
    ratio_winf: float
    cost_bound: float
    k: int | None = None
    atom: int | None = None
    fractions: Tensor | None = None
    z: Tensor | None = None


@dataclass(frozen=True, eq=False)
class MassSplittingAttack:
    r"""Result of :func:`mass_splitting_attack`.

    Attributes
    ----------
    budget : float
        :math:`W_2` budget :math:`\varepsilon` of the move and split perturbations.
    move : Perturbation
        Best move-only perturbation (whole atoms move).
    split : Perturbation
        Best split-then-move perturbation over atoms and :math:`k=2..k_{\max}`.
    ks : tuple of int
        The numbers of copies tried, ``2..k_max``.
    split_by_k : tuple of Perturbation
        The best split-then-move perturbation for every :math:`k` (over atoms and starts),
        measured exactly; ``split`` is the one with the largest exact :math:`W_2` ratio.
    duplicate : tuple of Perturbation
        Duplicating each atom as a token (docs/theory.md §A6), one per atom.
    insert : Perturbation
        Best inserted token :math:`z\in B_R` (docs/theory.md §A6).
    gain : float
        ``split.ratio_w2 / move.ratio_w2``.
    gain_winf : float
        ``split.ratio_winf / move.ratio_winf``.
    """

    budget: float
    move: Perturbation
    split: Perturbation
    ks: tuple[int, ...]
    split_by_k: tuple[Perturbation, ...]
    duplicate: tuple[Perturbation, ...]
    insert: Perturbation
    gain: float
    gain_winf: float


def _split_log_weights(la: Tensor, i: int, f: Tensor) -> tuple[Tensor, Tensor]:
    """Log-fractions ``log_softmax(f)`` (floored) of atom ``i``'s copies, and the split log-masses."""
    frac = torch.log_softmax(f, 0).clamp_min(LOG_MASS_FLOOR)
    return frac, torch.cat([la[:i], la[i] + frac, la[i + 1 :]])


def _budget_move(X: Tensor, g: Tensor, la: Tensor, budget: float, R: float) -> Tensor:
    r"""Points :math:`x_i+\delta_i` projected back into :math:`B_R`.

    Displacements :math:`\delta_i=\varepsilon g_i/(\sqrt{a_i}\|g\|)`: :math:`\sum a_i\|\delta_i\|^2=\varepsilon^2`.
    """
    Xn = X + budget * g * torch.exp(-0.5 * la).unsqueeze(-1) / torch.linalg.vector_norm(g)
    r = torch.linalg.vector_norm(Xn, dim=-1, keepdim=True)
    return Xn * torch.where(r > R, R / r.clamp_min(1e-300), torch.ones_like(r))


def _best_start(
    objective: Callable[[Tensor], Tensor], inits: list[Tensor], lr: float, steps: int, what: str
) -> Tensor:
    """Best parameter of :func:`run_single` ascents from every start in ``inits``.

    A ValueError naming the ``what`` starts when none reaches a finite ratio.
    """
    best_v, best = -math.inf, None
    for x0 in inits:
        v, (x,) = run_single(objective, [x0], [lr], steps)
        if v > best_v:
            best_v, best = v, x
    if best is None:
        raise ValueError(f"mass_splitting_attack: no {what} start reached a finite ratio")
    return best


def mass_splitting_attack(
    mu: DiracMeasure,
    params: Params,
    budget: float,
    *,
    n_restarts: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
    seed: int | None = None,
    k_max: int = 6,
    R: float | None = None,
    atoms: Sequence[int] | None = None,
    insert_steps: int = 60,
) -> MassSplittingAttack:
    r"""Finite :math:`W_2`-budget attack: move-only versus split-then-move (docs/theory.md §10).

    Background in docs/theory.md §A5 (splitting) and §A6 (token-count changes).

    Ratios :math:`W_2(F\nu,F\mu)/W_2(\nu,\mu)` with **exact** :math:`W_2` on both sides.

    * **Move-only**: :math:`\nu=\sum_ia_i\delta_{x_i+\delta_i}`, parametrised on the budget sphere
      :math:`\sum_ia_i\|\delta_i\|^2=\varepsilon^2` (:math:`\delta_i=\varepsilon g_i/(\sqrt{a_i}\|g\|)`),
      which bounds :math:`W_2(\nu,\mu)\le\varepsilon` through the identity coupling.
    * **Split-then-move**: atom :math:`i` is split into :math:`k` copies with mass fractions
      :math:`\mathrm{softmax}(f)` (:meth:`DiracMeasure.split`, the same measure), then every atom and
      copy moves under the same budget (masses of the split measure).
    * **Token-count changes** (docs/theory.md §A6): duplicating atom :math:`i` as a token,
      :math:`\mu'=(1-t)\mu+t\delta_{x_i}` with :math:`t=\frac1{n+1}` (cost bound
      :math:`(t\sum_ja_j\|x_j-x_i\|^2)^{1/2}`, which is :math:`(\frac1{n(n+1)}\sum_j\|x_j-x_i\|^2)^{1/2}`
      for :math:`n` uniform tokens), and inserting a token :math:`z\in B_R`,
      :math:`(1-t)\mu+t\delta_z` (cost bound :math:`(t\sum_ja_j\|x_j-z\|^2)^{1/2}`), :math:`z` optimised.

    The displacements (and fractions, :math:`z`) maximise :math:`W_2(F\nu,F\mu)/\varepsilon` by
    Adam, with the exact output :math:`W_2` differentiated through the optimal plan and dual
    potentials; every reported number is then **measured** with
    :func:`~meanfield.distances.wasserstein` (and :func:`~meanfield.distances.wasserstein_inf` for
    the :math:`W_\infty` comparison of docs/theory.md §A5, where the input cost is
    :math:`\|\delta\|` whatever the mass and the gain disappears). Moved points are projected back
    into :math:`B_R` (non-expansive, so the budget bound still holds).

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched, unmasked input measure.
    params : AttentionParams or MultiHeadParams
        Unmasked attention.
    budget : float
        :math:`\varepsilon>0`.
    k_max : int, default 6
        Largest number of copies (``k = 2..k_max``).
    R : float, optional
        Radius of the ball holding the perturbed measures; default the support radius of ``mu``.
    atoms : sequence of int, optional
        Atoms to split (default all).
    n_restarts : int, default 3
        Starts per (atom, k) and for the move-only attack (the first are structured: the top
        singular vector of the weighted Jacobian for moves; the logit-gain direction
        :math:`A^\top x_i`, the radial direction and the extreme directions of
        :math:`(A+A^\top)/2` for one moved copy).
    steps : int, default 150
    lr : float, default 0.05
    insert_steps : int, default 60
    seed : int, default 0

    Returns
    -------
    MassSplittingAttack

    Notes
    -----
    At a Dirac :math:`\mu=\delta_y` move-only gives exactly :math:`\|V\delta\|/\|\delta\|\le\|V\|`
    while splitting reaches :math:`\frac{\|V\delta\|}{\|\delta\|}G_k` (:func:`theory.bounds.split_gain`); under
    :math:`W_\infty` both are at most :math:`\|V\|` at a Dirac (docs/theory.md §A5). Provenance: the
    phenomenon is *stated in the paper (v1 abstract)*; the attack and its measurements are ours
    (*derived and checked numerically*).
    """
    opts, gen = resolve_options(
        SPLITTING_DEFAULTS, "mass_splitting_attack", n_restarts, steps, lr, seed
    )
    n_restarts, steps, lr = opts.n_restarts, opts.steps, opts.lr
    if not isinstance(mu, DiracMeasure) or mu.points.ndim != 2:
        raise ValueError("mass_splitting_attack needs one unbatched DiracMeasure")
    if mu.is_causal:
        raise ValueError(
            "mass_splitting_attack is for unmasked attention: pass an untagged measure"
        )
    budget = float(budget)
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be a positive number, got {budget}")
    k_max = int(k_max)
    if k_max < 2:
        raise ValueError(f"k_max must be >= 2, got {k_max}")
    p64 = params.to(dtype=torch.float64)
    dev = p64.device
    X = as_float64(mu.points).to(dev)
    la = as_float64(mu.log_weights).to(dev)
    a = la.exp()
    n, d = X.shape
    r_max = float(torch.linalg.vector_norm(X, dim=-1).max())
    R_ = r_max if R is None else check_radius(R)
    if r_max > R_ * (1 + 1e-12):
        raise ValueError("mu must lie in the ball of radius R")
    if not R_ > 0:
        raise ValueError("mu is a Dirac at the origin: pass the radius R of the ball")
    mu64 = DiracMeasure.from_log_weights(X, la)
    with torch.no_grad():
        Y0 = attention_points(X, p64, log_weights=la)
    like = params.heads[0].A
    reject_variants(params, "this attack")

    def out_w2(Xn: Tensor, lan: Tensor) -> Tensor:
        Yn = attention_points(Xn, p64, log_weights=lan)
        return torch.sqrt(_w2sq(Yn, lan.exp(), Y0, a).clamp_min(0.0))

    def emit(kind: str, Xn: Tensor, lan: Tensor, bound: float, **extra) -> Perturbation:
        """The perturbation measured exactly in float64, ``nu`` in the dtype of ``params``."""
        nu64 = DiracMeasure.from_log_weights(Xn.detach(), lan.detach())
        Fmu, Fnu = attention(mu64, p64), attention(nu64, p64)
        iw, ow = float(wasserstein(nu64, mu64)), float(wasserstein(Fnu, Fmu))
        ii, oi = float(wasserstein_inf(nu64, mu64)), float(wasserstein_inf(Fnu, Fmu))
        return Perturbation(
            kind=kind,
            nu=DiracMeasure.from_log_weights(Xn.detach().to(like), lan.detach().to(like.dtype)),
            input_w2=iw,
            output_w2=ow,
            ratio_w2=ow / iw if iw > 0 else math.nan,
            input_winf=ii,
            output_winf=oi,
            ratio_winf=oi / ii if ii > 0 else math.nan,
            cost_bound=bound,
            **extra,
        )

    # ------------------------------------------------------------------ move-only
    with torch.no_grad():
        J = batched_jacobian(
            lambda Y: attention_points(Y, p64, log_weights=la.unsqueeze(0)), X.unsqueeze(0)
        )[0]
        d_out = J.shape[0] // n
        so = (0.5 * la).repeat_interleave(d_out)
        si = (0.5 * la).repeat_interleave(d)
        _, _, Vh = torch.linalg.svd(torch.exp(so[:, None] - si[None, :]) * J)
        top = Vh[0].reshape(n, d)
    move_inits = [top, -top] + [
        torch.randn(n, d, generator=gen, dtype=torch.float64).to(dev) for _ in range(n_restarts)
    ]
    move_inits = move_inits[: max(1, n_restarts)]

    def move_obj(g: Tensor) -> Tensor:
        return out_w2(_budget_move(X, g, la, budget, R_), la) / budget

    best_move_g = _best_start(move_obj, move_inits, lr, steps, "move")
    move = emit("move", _budget_move(X, best_move_g, la, budget, R_), la, budget)

    # ------------------------------------------------------------------ split-then-move
    S = 0.5 * sum((as_float64(h.A) + as_float64(h.A).mT) for h in p64.heads)
    ev = torch.linalg.eigh(S)[1]
    atom_list = list(range(n)) if atoms is None else sorted({int(i) % n for i in atoms})
    ks = tuple(range(2, k_max + 1))
    best_by_k: dict[int, tuple[float, Tensor, Tensor, int]] = {}
    for i in atom_list:
        xi = X[i]
        dirs = []
        logit_dir = sum(as_float64(h.A).mT @ xi for h in p64.heads)
        for v_ in (logit_dir, xi, ev[:, -1], -ev[:, -1], ev[:, 0], -ev[:, 0]):
            if float(torch.linalg.vector_norm(v_)) > 1e-12:
                dirs.append(v_ / torch.linalg.vector_norm(v_))
        for k in ks:
            Xk = as_float64(mu64.split(i, k).points)

            def split_obj(f: Tensor, g: Tensor, Xk: Tensor = Xk, i: int = i) -> Tensor:
                lan = _split_log_weights(la, i, f)[1]
                return out_w2(_budget_move(Xk, g, lan, budget, R_), lan) / budget

            for r in range(max(1, n_restarts)):
                g0 = torch.zeros(n + k - 1, d, dtype=torch.float64, device=dev)
                f0 = torch.zeros(k, dtype=torch.float64, device=dev)
                if r < len(dirs):
                    # docs/theory.md §10: one light copy travels to the sphere along dirs[r];
                    # its mass fraction f spends the whole budget, a_i f D^2 = budget^2
                    e = dirs[r]
                    xe = float(xi @ e)
                    D = -xe + math.sqrt(max(xe * xe - float(xi @ xi) + R_ * R_, 0.0))
                    g0[i + k - 1] = e
                    if D > 1e-12:
                        light = min(budget**2 / (float(a[i]) * D * D), 1.0 / k)
                        f0[:-1] = math.log((1.0 - light) / (k - 1))
                        f0[-1] = math.log(light)
                else:
                    g0 = torch.randn(n + k - 1, d, generator=gen, dtype=torch.float64).to(dev)
                v, (f, g) = run_single(split_obj, [f0, g0], [lr, lr], steps)
                if k not in best_by_k or v > best_by_k[k][0]:
                    best_by_k[k] = (v, f, g, i)
    split_by_k = []
    for k in ks:
        _, f, g, i_s = best_by_k[k]
        frac, lan = _split_log_weights(la, i_s, f)
        Xs = _budget_move(as_float64(mu64.split(i_s, k).points), g, lan, budget, R_)
        fractions = frac.detach().exp().to(like)
        split_by_k.append(emit("split", Xs, lan, budget, k=k, atom=i_s, fractions=fractions))
    split = max(split_by_k, key=lambda q: q.ratio_w2)

    # ------------------------------------------------------------------ token count changes
    t = 1.0 / (n + 1)
    lt, l1t = math.log(t), math.log1p(-t)
    lwi = torch.cat([la + l1t, torch.tensor([lt], dtype=torch.float64, device=dev)])
    dup = []
    for i in range(n):
        Xd = torch.cat([X, X[i : i + 1]])
        bound = math.sqrt(t * float((a * (X - X[i]).square().sum(-1)).sum()))
        dup.append(emit("duplicate", Xd, lwi, bound, atom=i))

    def ins_obj(zz: Tensor) -> Tensor:
        Xi = torch.cat([X, to_ball(zz, R_).unsqueeze(0)])
        return out_w2(Xi, lwi) / torch.sqrt(_w2sq(Xi, lwi.exp(), X, a).clamp_min(1e-300))

    zs = [R_ * dv for dv in _candidate_directions(p64, X)]
    zs += [
        R_ * torch.randn(d, generator=gen, dtype=torch.float64).to(dev) / math.sqrt(d)
        for _ in range(max(0, n_restarts - 1))
    ]
    zz0 = [from_ball(z0.unsqueeze(0), R_)[0] for z0 in zs]
    zb = to_ball(_best_start(ins_obj, zz0, lr * 4, insert_steps, "insertion"), R_).detach()
    Xi = torch.cat([X, zb.unsqueeze(0)])
    bound_i = math.sqrt(t * float((a * (X - zb).square().sum(-1)).sum()))
    insert = emit("insert", Xi, lwi, bound_i, z=zb.to(like))

    return MassSplittingAttack(
        budget=budget,
        move=move,
        split=split,
        ks=ks,
        split_by_k=tuple(split_by_k),
        duplicate=tuple(dup),
        insert=insert,
        gain=split.ratio_w2 / move.ratio_w2,
        gain_winf=split.ratio_winf / move.ratio_winf,
    )


def _candidate_directions(params: Params, X: Tensor) -> list[Tensor]:
    """Unit candidate directions: extreme eigenvectors of every head's symmetric part, atoms."""
    out = []
    for h in params.heads:
        A = as_float64(h.A)
        ev = torch.linalg.eigh(0.5 * (A + A.mT))[1]
        out += [ev[:, -1], -ev[:, -1], ev[:, 0], -ev[:, 0]]
    for x in X:
        nx = float(torch.linalg.vector_norm(x))
        if nx > 1e-12:
            out += [x / nx, -x / nx]
    return out
