r"""Instance generators of the verification harness, one per kind.

Each generator draws one random or adversarial instance from a numpy generator and returns its
:class:`~experiments.verify_bounds._engine.Target` list (the engine's certified brackets and the
context the bounds read). :func:`make_targets` regenerates instance ``index`` of a run with
``seed`` from ``numpy.random.default_rng([seed, index])``, so every reported instance can be
reproduced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

import numpy as np

from ..engine import torch_threads
from ._engine import Target, as_tensor64, engine_of, measure_of, params_of

#: Relative frequency of each kind (the optimisation-based kinds cost ~20 times more).
KIND_WEIGHTS = {
    "random_sequence": 6,
    "weighted_measure": 4,
    "construction": 4,
    "k_copies": 2,
    "two_dirac": 3,
    "off_axis": 2,
    "equal_tokens": 2,
    "large_radius": 3,
    "kim_l2": 2,
    "off_axis_opt": 1,
    "worst_case": 1,
}

#: Instance kinds, in the order of the schedule (see :data:`SCHEDULE`).
KINDS = tuple(KIND_WEIGHTS)


def _interleave(weights: Mapping[str, int]) -> tuple[str, ...]:
    """Spread every kind evenly over one period (kind k at positions (j + 1/2) / w_k)."""
    slots = [((j + 0.5) / w, i, k) for i, (k, w) in enumerate(weights.items()) for j in range(w)]
    return tuple(k for _, _, k in sorted(slots))


#: One period of the instance schedule: instance ``i`` has kind ``SCHEDULE[i % len(SCHEDULE)]``
#: (restricted to the requested kinds).
SCHEDULE = _interleave(KIND_WEIGHTS)

#: Radii drawn by the random kinds (large radii included on purpose: the large-radius regime).
RADII = (0.3, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 20.0, 50.0, 100.0)


def _softmax_rows(S: np.ndarray) -> np.ndarray:
    """Row softmax of logits with ``-inf`` entries (masked keys)."""
    m = S.max(axis=1, keepdims=True)
    E = np.exp(S - m)
    return E / E.sum(axis=1, keepdims=True)


def _random_A(rng: np.random.Generator, d: int, a_norm: float) -> np.ndarray:
    """Non-symmetric score matrix with ||A||_2 = a_norm (sometimes a structured one)."""
    u = rng.random()
    if u < 0.08:
        A = -np.eye(d)  # the "matching" case lambda = -||A|| (docs/theory.md §5)
    elif u < 0.14:
        A = np.eye(d)
    elif u < 0.2 and d >= 2:
        A = np.zeros((d, d))
        A[0, 1] = 1.0  # e_1 e_2^T, the counterexample of docs/theory.md §2
    else:
        A = rng.standard_normal((d, d))
    return A * (a_norm / np.linalg.norm(A, 2))


def _random_V(rng: np.random.Generator, d: int, d_v: int | None = None) -> np.ndarray:
    d_v = d if d_v is None else d_v
    if rng.random() < 0.15 and d_v == d:
        return np.eye(d)
    V = rng.standard_normal((d_v, d)) / math.sqrt(d)
    return V * math.exp(rng.uniform(math.log(0.3), math.log(3.0)))


def _ball_points(rng: np.random.Generator, n: int, d: int, R: float, sphere: bool) -> np.ndarray:
    Z = rng.standard_normal((n, d))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    r = np.full((n, 1), R) if sphere else R * rng.random((n, 1)) ** (1.0 / d)
    X = Z * r
    X[rng.integers(n)] = R * Z[0]  # one token on the sphere: max_i ||x_i|| = R
    return X


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _heads(rng: np.random.Generator, d: int, *, multi: bool = True):
    """1 head (60 %) or 2-3 heads with W^O (70 %) or concatenated."""
    H = 1 if (not multi or rng.random() < 0.6) else int(rng.integers(2, 4))
    a_norm = _log_uniform(rng, 0.05, 3.0)
    heads_AV = [
        (_random_A(rng, d, a_norm * _log_uniform(rng, 0.5, 2.0)), _random_V(rng, d))
        for _ in range(H)
    ]
    WO = None
    if H > 1 and rng.random() < 0.7:
        WO = rng.standard_normal((d, H * d)) / math.sqrt(H * d)
    heads = [
        (A, V, None if WO is None else WO[:, h * d : (h + 1) * d])
        for h, (A, V) in enumerate(heads_AV)
    ]
    return heads, WO


def _seq_target(kind: str, X: np.ndarray, heads, WO, masked: bool, **extra: Any) -> list[Target]:
    """The target of the sequence ``X`` (Euclidean geometry), its context completed by ``extra``."""
    lo, val, up = engine_of(as_tensor64(X), params_of(heads, WO), masked=masked)
    ctx = {
        "what": "sequence",
        "masked": masked,
        "n": X.shape[0],
        "R": float(np.max(np.linalg.norm(X, axis=1))),
        "heads": heads,
        "WO": WO,
        "X": X,
        **extra,
    }
    return [Target(kind, "euclidean", lo, val, up, ctx)]


def _kind_random_sequence(rng: np.random.Generator) -> list[Target]:
    d = int(rng.integers(1, 5))
    n = int(rng.integers(1, 9))
    R = float(rng.choice(RADII))
    masked = bool(rng.random() < 0.5)
    heads, WO = _heads(rng, d)
    X = _ball_points(rng, n, d, R, sphere=bool(rng.random() < 0.3))
    if n >= 3 and rng.random() < 0.3:  # some exact copies (ties, docs/theory.md §7)
        X[1:3] = X[0]
    if d >= 2 and rng.random() < 0.12:
        # docs/theory.md §2 counterexample to the released quantity: A = a e_1 e_2^T, one head,
        # tokens on the e_2 axis, so that R_h = max_i ||A^T x_i|| = 0
        A = np.zeros((d, d))
        A[0, 1] = _log_uniform(rng, 0.1, 3.0)
        heads, WO = [(A, _random_V(rng, d), None)], None
        X = np.zeros((n, d))
        X[:, 1] = R * rng.uniform(-1.0, 1.0, n)
        X[0, 1] = R
    return _seq_target("sequence", X, heads, WO, masked)


def _kind_weighted_measure(rng: np.random.Generator) -> list[Target]:
    d = int(rng.integers(1, 4))
    n = int(rng.integers(1, 7))
    R = float(rng.choice(RADII[:8]))
    masked = bool(rng.random() < 0.35)
    heads, WO = _heads(rng, d)
    # keep theta = max ||A_h|| R^2 <= 60 so that the masses and sqrt(a_i/a_j) stay in float64
    scale = min(1.0, 60.0 / (max(np.linalg.norm(A, 2) for A, _, _ in heads) * R**2))
    heads = [(A * scale, V, W) for A, V, W in heads]
    X = _ball_points(rng, n, d, R, sphere=bool(rng.random() < 0.3))
    decades = rng.uniform(0.0, 12.0)
    lw = -decades * math.log(10.0) * rng.random(n)
    pos = rng.random(n) if masked else None
    mu = measure_of(X, lw, pos)
    params = params_of(heads, WO)
    ctx = _measure_ctx(X, lw, heads, WO, masked=masked, positions=pos)
    out = [_measure_target("measure", mu, params, ctx)]
    if not masked:
        out.append(_measure_target("measure", mu, params, dict(ctx), "split"))
    return out


def _measure_ctx(
    points: np.ndarray,
    log_weights: np.ndarray,
    heads: list,
    WO: np.ndarray | None = None,
    *,
    masked: bool = False,
    positions: np.ndarray | None = None,
) -> dict[str, Any]:
    """Context of a target on a weighted measure (R: the largest atom norm)."""
    return {
        "what": "measure",
        "masked": masked,
        "n": len(points),
        "R": float(np.max(np.linalg.norm(points, axis=1))),
        "heads": heads,
        "WO": WO,
        "points": points,
        "log_weights": log_weights,
        "positions": positions,
    }


def _single_head(rng: np.random.Generator, d: int, a_norm: float) -> tuple[np.ndarray, np.ndarray]:
    d_v = d if rng.random() < 0.8 else int(rng.integers(1, d + 1))
    return _random_A(rng, d, a_norm), _random_V(rng, d, d_v)


def _construction_X(rng: np.random.Generator, A: np.ndarray, R: float, n: int) -> np.ndarray:
    """The eigenvector construction (released variant when A has a real eigenvalue)."""
    from meanfield.attacks import adversarial_sequence

    variant: Literal["released", "symmetric"] = "released" if rng.random() < 0.5 else "symmetric"
    try:
        con = adversarial_sequence(as_tensor64(A), R, n, variant=variant)
    except ValueError:  # no real eigenvalue: the released variant does not exist
        con = adversarial_sequence(as_tensor64(A), R, n, variant="symmetric")
    return con.X.numpy()


def _construction_ctx(X: np.ndarray, light: np.ndarray, heavy: np.ndarray, A, V) -> dict:
    """Gap and ||Vu|| computed from the input itself (independent of meanfield.attacks)."""
    diff = light - heavy
    nrm = float(np.linalg.norm(diff))
    u = diff / nrm if nrm > 0 else np.zeros_like(diff)
    return {"gamma": max(float(heavy @ A @ diff), 0.0), "Vu_norm": float(np.linalg.norm(V @ u))}


def _kind_construction(rng: np.random.Generator) -> list[Target]:
    d = int(rng.integers(1, 4))
    n = int(rng.integers(2, 13))
    R = float(rng.choice(RADII))
    masked = bool(rng.random() < 0.5)
    A, V = _single_head(rng, d, _log_uniform(rng, 0.05, 3.0))
    X = _construction_X(rng, A, R, n)
    cc = _construction_ctx(X, X[0], X[1], A, V)
    return _seq_target("one_token", X, [(A, V, None)], None, masked, construction="one_token", **cc)


def _kind_k_copies(rng: np.random.Generator) -> list[Target]:
    from theory import bounds

    d = int(rng.integers(1, 4))
    n = int(rng.integers(3, 15))
    R = float(rng.choice(RADII[:7]))
    A, V = _single_head(rng, d, _log_uniform(rng, 0.1, 3.0))
    base = _construction_X(rng, A, R, 2)
    light, heavy = base[0], base[1]
    cc = _construction_ctx(base, light, heavy, A, V)
    # the best k by brute force (independent of sequence_lower's floor/ceil rule)
    ks = np.arange(1, n)
    vals = bounds.two_dirac_log_g(np.log(ks / n), cc["gamma"])
    k = int(ks[int(np.argmax(vals))])
    X = np.vstack([np.repeat(light[None], k, 0), np.repeat(heavy[None], n - k, 0)])
    return _seq_target(
        "k_copies", X, [(A, V, None)], None, False, construction="k_copies", k=k, **cc
    )


def _two_dirac_scale(A: np.ndarray, R: float, gamma_target: float) -> np.ndarray:
    """Rescale A so that the best two-Dirac gap max(lam+ R^2/4, -2 lam- R^2) is gamma_target."""
    from theory import bounds

    ext = bounds.rayleigh_extremes(A)
    g_unit = max(ext.lam_max * R**2 / 4.0, -2.0 * ext.lam_min * R**2)
    return A * (gamma_target / g_unit) if g_unit > 0 else A


def _kind_two_dirac(rng: np.random.Generator) -> list[Target]:
    from meanfield.attacks import two_dirac

    d = int(rng.integers(1, 4))
    R = float(rng.choice(RADII))
    A, V = _single_head(rng, d, 1.0)
    if rng.random() < 0.15:
        A = -np.eye(d)  # the matching case
    A = _two_dirac_scale(A, R, _log_uniform(rng, 0.01, 300.0))
    params = params_of([(A, V, None)], None)
    heads = [(A, V, None)]
    out: list[Target] = []
    brackets = []

    def ctx_of(td: Any, construction: str) -> dict[str, Any]:
        pts = td.measure.points.numpy()
        lw = td.measure.log_weights.numpy()
        c = _measure_ctx(pts, lw, heads)
        c.update(_construction_ctx(pts, pts[1], pts[0], A, V))  # light atom 1, heavy atom 0
        c["log_eps"] = float(lw[1])
        c["construction"] = construction
        return c

    from theory import bounds

    ext = bounds.rayleigh_extremes(A)
    cases: tuple[tuple[Literal["+", "-"], bool], ...] = (
        ("+", ext.lam_max > 0),
        ("-", ext.lam_min < 0),
    )
    for case, ok in cases:
        if not ok:
            continue
        td = two_dirac(as_tensor64(A), R, case=case, V=as_tensor64(V))
        c = ctx_of(td, "two_dirac_opt")
        br = engine_of(td.measure, params, geometry="wasserstein")
        brackets.append(br)
        kind = f"two_dirac_opt[{case}]"
        out.append(Target(kind, "wasserstein", *br, c))
        out.append(_measure_target(kind, td.measure, params, dict(c, construction=None), "split"))
    # single Dirac: the trivial bound ||V|| (F(delta_x) = delta_{Vx})
    x = _ball_points(rng, 1, d, R, sphere=False)
    dirac = measure_of(x, np.zeros(1))
    br = engine_of(dirac, params, geometry="wasserstein")
    brackets.append(br)
    dirac_ctx = {
        **_measure_ctx(x, np.zeros(1), heads),
        "R": float(np.linalg.norm(x)),
        "construction": "dirac",
        "V_eff_norm": float(np.linalg.norm(V, 2)),
    }
    out.append(Target("dirac", "wasserstein", *br, dirac_ctx))
    # max over the constructions: a bracket of the best value, for mean_field_lower
    lo, val, up = (max(ends) for ends in zip(*brackets, strict=True))
    best_ctx = {
        "what": "best",
        "masked": False,
        "R": R,
        "heads": heads,
        "WO": None,
        "construction": "two_dirac_best",
    }
    out.append(Target("two_dirac_best", "wasserstein", lo, val, up, best_ctx))
    # a random mass and the w = 1/2 mass, in the case chosen by the -8 rule
    td0 = two_dirac(as_tensor64(A), R, V=as_tensor64(V))
    gamma = td0.gamma
    opt = bounds.two_dirac_optimal_mass(gamma)
    le = min(float(opt.log_eps) + rng.normal(0.0, 3.0), -1e-3)
    for label, log_eps in (
        ("two_dirac_eps", le),
        ("two_dirac_half", -float(np.logaddexp(0.0, gamma))),
    ):
        if not log_eps < 0:
            continue
        # TwoDirac.case is typed str but is always the case two_dirac chose, "+" or "-"
        case0 = cast(Literal["+", "-"], td0.case)
        td = two_dirac(as_tensor64(A), R, log_eps=log_eps, case=case0, V=as_tensor64(V))
        out.append(_measure_target(label, td.measure, params, ctx_of(td, label)))
    return out


def _measure_target(
    kind: str,
    mu: Any,
    params: Any,
    ctx: dict[str, Any],
    geometry: Literal["wasserstein", "split"] = "wasserstein",
) -> Target:
    """The target of a measure in ``geometry`` (W2 by default): its engine bracket, with ``ctx``."""
    return Target(kind, geometry, *engine_of(mu, params, geometry=geometry), ctx)


def _search_head(
    rng: np.random.Generator, d_range: tuple[int, int], theta_max: float
) -> tuple[float, list[Any], Any]:
    """A radius and a random single head for a search: ``(R, heads, params)``."""
    d = int(rng.integers(*d_range))
    R = float(rng.choice(RADII[:6]))
    A, V = _single_head(rng, d, _log_uniform(rng, 0.05, theta_max) / R**2)
    heads = [(A, V, None)]
    return R, heads, params_of(heads, None)


def _kind_off_axis(rng: np.random.Generator) -> list[Target]:
    d = int(rng.integers(1, 4))
    R = float(rng.choice(RADII[:8]))
    theta = _log_uniform(rng, 0.01, 150.0)
    A, V = _single_head(rng, d, theta / R**2)
    P = _ball_points(rng, 2, d, R, sphere=bool(rng.random() < 0.5))
    x, y = P[0], P[1]
    h = rng.standard_normal(d)
    h /= np.linalg.norm(h)
    w = float(rng.uniform(0.02, 0.98))
    s = float(y @ A @ (x - y))
    t_eps = math.log(w / (1.0 - w)) - s  # logit of the light mass
    lw = np.array([-np.logaddexp(0.0, t_eps), -np.logaddexp(0.0, -t_eps)])  # (1-eps, eps)
    heads = [(A, V, None)]
    points = np.stack([y, x])
    ctx = {
        **_measure_ctx(points, lw, heads),
        "construction": "off_axis",
        "x": x,
        "y": y,
        "h": h,
        "w": w,
    }
    return [_measure_target("off_axis", measure_of(points, lw), params_of(heads, None), ctx)]


def _kind_off_axis_opt(rng: np.random.Generator) -> list[Target]:
    from meanfield.attacks import off_axis_two_atoms

    R, heads, params = _search_head(rng, (2, 4), 30.0)
    res = off_axis_two_atoms(params, R, n_restarts=2, steps=40, seed=int(rng.integers(2**31)))
    ctx = {
        **_measure_ctx(res.measure.points.numpy(), res.measure.log_weights.numpy(), heads),
        "construction": "off_axis",
        "x": res.x.numpy(),
        "y": res.y.numpy(),
        "h": res.h.numpy(),
        "w": res.w,
    }
    if not 0.0 < res.w < 1.0:
        return []
    return [_measure_target("off_axis_opt", res.measure, params, ctx)]


def _kind_worst_case(rng: np.random.Generator) -> list[Target]:
    from meanfield.attacks import worst_case_measure

    R, heads, params = _search_head(rng, (1, 3), 8.0)
    geometry: Literal["wasserstein", "split"] = "wasserstein" if rng.random() < 0.7 else "split"
    res = worst_case_measure(
        params,
        R,
        int(rng.integers(2, 4)),
        n_restarts=2,
        steps=40,
        geometry=geometry,
        seed=int(rng.integers(2**31)),
        certify=False,
    )
    ctx = _measure_ctx(res.measure.points.numpy(), res.measure.log_weights.numpy(), heads)
    return [_measure_target("worst_case", res.measure, params, ctx, geometry)]


def _kind_equal_tokens(rng: np.random.Generator) -> list[Target]:
    d = int(rng.integers(1, 5))
    n = int(rng.integers(1, 9))
    R = float(rng.choice(RADII))
    masked = bool(rng.random() < 0.3)
    heads, WO = _heads(rng, d)
    x = _ball_points(rng, 1, d, R, sphere=bool(rng.random() < 0.5))
    X = np.repeat(x, n, 0)
    V_eff = (
        sum((V if W is None else W @ V) for _, V, W in heads)
        if WO is not None
        else (np.vstack([V for _, V, _ in heads]))
    )
    V_eff_norm = float(np.linalg.norm(V_eff, 2))
    return _seq_target(
        "equal_tokens", X, heads, WO, masked, construction="equal_tokens", V_eff_norm=V_eff_norm
    )


def _kind_large_radius(rng: np.random.Generator) -> list[Target]:
    from theory import bounds

    d = int(rng.integers(1, 4))
    n = int(rng.integers(2, 9))
    R = float(rng.choice((1.0, 3.0, 10.0, 20.0, 50.0, 100.0)))
    masked = bool(rng.random() < 0.5)
    A, V = _single_head(rng, d, _log_uniform(rng, 0.3, 2.0))
    X0 = _ball_points(rng, n, d, 1.0, sphere=False)
    X = R * X0 / np.max(np.linalg.norm(X0, axis=1))
    V_norm = float(np.linalg.norm(V, 2))
    counts = bounds.large_radius_counts(X, A, masked=masked)
    gap = bounds.selection_gap(X, A, masked=masked)
    return _seq_target(
        "large_radius",
        X,
        [(A, V, None)],
        None,
        masked,
        construction="large_radius",
        limit=float(bounds.large_radius_limit(counts, V_norm)),
        deviation=float(
            bounds.large_radius_deviation(gap, n, float(np.linalg.norm(A, 2)), V_norm, R)
        ),
        margin=gap,
    )


def _kind_kim_l2(rng: np.random.Generator) -> list[Target]:
    import torch
    from torch.func import jacrev

    from meanfield.attention import l2_self_attention
    from meanfield.lipschitz import local_lipschitz_fn
    from meanfield.params import L2AttentionParams

    H = int(rng.integers(1, 4))
    D = H * int(rng.integers(1, 3))
    N = int(rng.integers(2, 7))
    k = D // H
    WQ = rng.standard_normal((H, D, k)) * _log_uniform(rng, 0.2, 4.0) / math.sqrt(D)
    WV = rng.standard_normal((H, D, k)) / math.sqrt(D)
    WO = rng.standard_normal((D, D)) / math.sqrt(D)
    X = rng.standard_normal((N, D)) * _log_uniform(rng, 0.1, 10.0)
    p = L2AttentionParams(as_tensor64(WQ), as_tensor64(WV), as_tensor64(WO))

    def fn(Y: Any) -> Any:
        return l2_self_attention(Y, p)

    Xt = as_tensor64(X)
    est = local_lipschitz_fn(fn, Xt, method="dense")
    ctx = {"what": "kim", "n": N, "WQ": WQ, "WV": WV, "WO": WO, "X": X, "masked": False}
    out = [Target("kim_l2", "euclidean", float(est.lower), float(est.value), float(est.upper), ctx)]
    # exact infinity-norm of the flattened Jacobian (max absolute row sum)
    J = jacrev(lambda Y: fn(Y).reshape(-1))(Xt).reshape(-1, N * D)
    v = float(torch.abs(J).sum(1).max())
    margin = 64 * (N * D) * np.finfo(np.float64).eps
    out.append(Target("kim_l2", "l2_inf", v * (1 - margin), v, v * (1 + margin), dict(ctx)))
    # Kim's softmax-variance lemma on the costs t_ij = ||(x_i - x_j)^T W^{Q,h}||^2 / sqrt(D/H)
    worst = 0.0
    for h in range(H):
        Z = X @ WQ[h]
        T = np.sum((Z[:, None, :] - Z[None, :, :]) ** 2, axis=-1) / math.sqrt(k)
        Pm = _softmax_rows(-T)
        worst = max(worst, float(np.max(np.sum(Pm * T, axis=1))))
    cost_ctx = {"what": "softmax_cost", "n": N, "masked": False}
    out.append(Target("softmax_cost", "softmax_cost", worst, worst, worst, cost_ctx))
    return out


_KIND_FN: dict[str, Callable[[np.random.Generator], list[Target]]] = {
    "random_sequence": _kind_random_sequence,
    "weighted_measure": _kind_weighted_measure,
    "construction": _kind_construction,
    "k_copies": _kind_k_copies,
    "two_dirac": _kind_two_dirac,
    "off_axis": _kind_off_axis,
    "equal_tokens": _kind_equal_tokens,
    "large_radius": _kind_large_radius,
    "kim_l2": _kind_kim_l2,
    "off_axis_opt": _kind_off_axis_opt,
    "worst_case": _kind_worst_case,
}


def make_targets(seed: int, index: int, kind: str) -> list[Target]:
    """Regenerate instance ``index`` of a run with ``seed`` and compute its engine brackets.

    Parameters
    ----------
    seed, index : int
        The instance is drawn from ``numpy.random.default_rng([seed, index])``.
    kind : str
        One of :data:`KINDS`.

    Returns
    -------
    list of Target
    """
    if kind not in _KIND_FN:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    rng = np.random.default_rng([int(seed), int(index)])
    with torch_threads(1):
        return _KIND_FN[kind](rng)
