r"""Checking the bounds against the certified bracket.

The bounds, their sides and statuses come from :mod:`theory.bounds.registry`
(:func:`~theory.bounds.registry.verified`); this module adds one evaluator per record, which reads
a :class:`~experiments.verify_bounds._engine.Target` and returns the bound's value there (or
``None`` when it does not apply), and the rules: an upper bound must be ``>=`` the certified
lower end, a lower bound ``<=`` the certified upper end, both up to :data:`BOUND_RTOL`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ._engine import Target
from .generation import make_targets

if TYPE_CHECKING:
    from theory.bounds import SqrtNForm

#: Relative slack granted to a closed-form bound for its own float64 evaluation (values up to
#: ``exp(350)`` are computed as ``exp(log value)``, which loses up to ~1e-13 relative). The engine's
#: bracket carries its own certified margins; nothing else is tolerated.
BOUND_RTOL = 1e-10


@dataclass(frozen=True)
class BoundSpec:
    r"""A registered bound.

    Attributes
    ----------
    name : str
    side : {"upper", "lower", "limit"}
        ``"upper"``: must be ``>=`` the exact value; ``"lower"``: ``<=``; ``"limit"``: no
        inequality (ratio recorded only).
    status : {"theorem", "candidate", "heuristic", "reported"}
        See the module docstring.
    source : str
        Docs section and provenance (from the registry).
    evaluate : callable
        ``evaluate(target) -> float | None``; ``None`` when the bound does not apply to the target.
    """

    name: str
    side: str
    status: str
    source: str
    evaluate: Callable[[Target], float | None]


# ------------------------------------------------------------------ per-head quantities
def _head_norms(t: Target) -> list[dict[str, float]]:
    """Spectral norms per head: ||A_h||, ||V_h||, ||W_h|| (1 without W^O), ||W_h V_h||."""
    if "_norms" not in t.ctx:
        t.ctx["_norms"] = [
            {
                "A": float(np.linalg.norm(A, 2)),
                "V": float(np.linalg.norm(V, 2)),
                "W": 1.0 if W is None else float(np.linalg.norm(W, 2)),
                "WV": float(np.linalg.norm(V if W is None else W @ V, 2)),
            }
            for A, V, W in t.ctx["heads"]
        ]
    return t.ctx["_norms"]


def _per_head_sum(t: Target, head_bound: Callable[[dict[str, float]], float]) -> float:
    r""":math:`\sum_h\|W_h\|_2\,b_h` (docs/theory.md §1, ``multihead_upper(rule="sum")``)."""
    from theory import bounds

    norms = _head_norms(t)
    b = np.array([head_bound(h) for h in norms])
    if len(norms) == 1 and t.ctx["heads"][0][2] is None:
        return float(b[0])
    if not np.isfinite(b).all():  # an overflowed (exp) bound: the sum is +inf
        return math.inf
    return float(bounds.multihead_upper(b, W_norms=np.array([h["W"] for h in norms])))


def _is_sequence(t: Target) -> bool:
    return t.ctx.get("what") == "sequence" and t.geometry == "euclidean"


def _is_mean_field(t: Target) -> bool:
    geometries = ("euclidean", "wasserstein", "split")
    return t.ctx.get("what") in ("sequence", "measure") and t.geometry in geometries


# ------------------------------------------------------------------ upper bounds
def _sqrt_n(t: Target, form: SqrtNForm) -> float | None:
    if not _is_sequence(t):
        return None
    from theory import bounds

    R, n = t.ctx["R"], t.ctx["n"]
    return _per_head_sum(t, lambda h: float(bounds.sqrt_n_upper(h["A"], h["V"], R, n, form=form)))


def _multihead_l2(t: Target) -> float | None:
    if not _is_sequence(t) or len(t.ctx["heads"]) < 2:
        return None
    from theory import bounds

    R, n = t.ctx["R"], t.ctx["n"]
    norms = _head_norms(t)
    b = np.array([float(bounds.sqrt_n_upper(h["A"], h["V"], R, n, form="triangle")) for h in norms])
    WO = t.ctx["WO"]
    WO_norm = 1.0 if WO is None else float(np.linalg.norm(WO, 2))  # concatenation: W^O = I
    return float(bounds.multihead_upper(b, WO_norm=WO_norm, rule="l2"))


def _certified_local(t: Target) -> float | None:
    if not _is_sequence(t):
        return None
    from theory.bounds import certified_local_upper

    return certified_local_upper(t.ctx["X"], t.ctx["heads"], masked=t.ctx["masked"])


def _released(t: Target, fixed: bool) -> float | None:
    if not _is_sequence(t) or t.ctx["masked"] or t.ctx["WO"] is not None:
        return None
    from theory import bounds

    X = t.ctx["X"]
    n = X.shape[0]
    r = float(np.max(np.linalg.norm(X[:, None, :] - X[None, :, :], axis=-1)))
    V_norms, R_h = [], []
    for A, V, _ in t.ctx["heads"]:
        rh = float(np.max(np.linalg.norm(X @ A, axis=1)))  # ||A_code x_i||, A_code = A^T
        if fixed:
            rh += float(np.max(np.linalg.norm(X @ A.T, axis=1)))  # + max ||A x_i||
        V_norms.append(float(np.linalg.norm(V, 2)))
        R_h.append(rh)
    return float(bounds.released_data_dependent(np.array(V_norms), np.array(R_h), r, n))


def _mean_field(t: Target, c: float, masked: bool) -> float | None:
    if not _is_mean_field(t) or bool(t.ctx["masked"]) != masked:
        return None
    from theory import bounds

    R = t.ctx["R"]
    return _per_head_sum(t, lambda h: float(bounds.mean_field_upper(h["A"], h["V"], R, c=c)))


def _mean_field_hardy(t: Target) -> float | None:
    r"""Masked repair :math:`\|V\|(\theta + 2(1 + 2\theta)e^{\theta})` (evaluated by the registry)."""
    if not _is_mean_field(t) or not t.ctx["masked"]:
        return None
    from theory.bounds import registry

    R = t.ctx["R"]
    hardy = registry.get("mean_field_upper[c'=1,masked,Hardy]")
    return _per_head_sum(t, lambda h: hardy(h["A"], h["V"], R))


def _kim(t: Target, p: Any, squared: bool = False) -> float | None:
    want = "euclidean" if p == 2 else "l2_inf"
    if t.ctx.get("what") != "kim" or t.geometry != want:
        return None
    from theory import bounds

    WQ, WV, WO = t.ctx["WQ"], t.ctx["WV"], t.ctx["WO"]
    H, D = WQ.shape[0], WQ.shape[1]
    norms: dict[str, Any] = bounds.kim_l2_norms(WQ, WV, WO, p=p)  # WQ_norms, WV_norms, WO_norm
    # wq_power=2: ||W^{Q,h}||_2^2, degree 2 in W^Q like the map itself (1: the default)
    bound = bounds.kim_l2_upper(t.ctx["n"], D=D, H=H, p=p, wq_power=2 if squared else 1, **norms)
    return float(bound)


def _kim_lemma(t: Target) -> float | None:
    if t.ctx.get("what") != "softmax_cost":
        return None
    from theory import bounds

    return float(bounds.kim_softmax_lemma(t.ctx["n"]))


def _large_radius(t: Target, sign: int) -> float | None:
    if t.ctx.get("construction") != "large_radius":
        return None
    lim, dev = t.ctx["limit"], t.ctx["deviation"]
    return lim + dev if sign > 0 else lim - dev


def _large_radius_limit(t: Target) -> float | None:
    return t.ctx["limit"] if t.ctx.get("construction") == "large_radius" else None


# ------------------------------------------------------------------ lower bounds
def _trivial(t: Target) -> float | None:
    if t.ctx.get("construction") not in ("equal_tokens", "dirac"):
        return None
    from theory import bounds

    return float(bounds.trivial_lower(t.ctx["V_eff_norm"]))


def _one_token_lower(t: Target, masked: bool) -> float | None:
    """``sqrt_n_lower`` (unmasked) or ``masked_sqrt_n_lower`` at the one-token construction."""
    if t.ctx.get("construction") != "one_token" or bool(t.ctx["masked"]) != masked:
        return None
    from theory import bounds

    c = t.ctx
    lower = bounds.masked_sqrt_n_lower if masked else bounds.sqrt_n_lower
    return float(lower(c["gamma"], c["n"], c["Vu_norm"]))


def _at(t: Target, construction: str, name: str) -> float | None:
    """The lower bound ``name`` at a target built by ``construction`` (``None`` at any other)."""
    if t.ctx.get("construction") != construction:
        return None
    from theory import bounds

    c = t.ctx
    if name == "sequence_lower":
        return float(bounds.sequence_lower(c["gamma"], c["n"], c["Vu_norm"]))
    if name == "two_dirac_lower":
        return float(bounds.two_dirac_lower(c["gamma"], c["Vu_norm"]))
    if name == "two_dirac_asymptote":
        return float(bounds.two_dirac_asymptote(c["gamma"], c["Vu_norm"]))
    if name == "two_dirac_g":
        return float(np.exp(bounds.two_dirac_log_g(c["log_eps"], c["gamma"], c["Vu_norm"])))
    if name == "two_dirac_half":
        return float(bounds.two_dirac_half(c["gamma"], c["Vu_norm"]))
    if name == "mean_field_lower":
        A, V, _ = c["heads"][0]
        return float(bounds.mean_field_lower(A, V, c["R"]))
    if name == "off_axis_two_atom":
        A, V, _ = c["heads"][0]
        return float(bounds.off_axis_two_atom(c["x"], c["y"], c["h"], c["w"], A, V))
    raise KeyError(name)  # pragma: no cover


#: How the harness evaluates each verified record of :mod:`theory.bounds.registry` on a target
#: (``None`` when the bound does not apply). Keys are the registry names.
EVALUATORS: dict[str, Callable[[Target], float | None]] = {
    "sqrt_n_upper[sqrt3]": partial(_sqrt_n, form="sqrt3"),
    "sqrt_n_upper[sharp]": partial(_sqrt_n, form="sharp"),
    "sqrt_n_upper[triangle]": partial(_sqrt_n, form="triangle"),
    "multihead_upper[l2,triangle]": _multihead_l2,
    "certified_local": _certified_local,
    "released_data_dependent": partial(_released, fixed=False),
    "released_data_dependent+max_Ax": partial(_released, fixed=True),
    "mean_field_upper[c'=2]": partial(_mean_field, c=2.0, masked=False),
    "mean_field_upper[c'=1]": partial(_mean_field, c=1.0, masked=False),
    "mean_field_upper[c'=1/2]": partial(_mean_field, c=0.5, masked=False),
    "mean_field_upper[c'=2,masked]": partial(_mean_field, c=2.0, masked=True),
    "mean_field_upper[c'=1,masked]": partial(_mean_field, c=1.0, masked=True),
    "mean_field_upper[c'=1,masked,Hardy]": _mean_field_hardy,
    "trivial_lower": _trivial,
    "sqrt_n_lower": partial(_one_token_lower, masked=False),
    "masked_sqrt_n_lower": partial(_one_token_lower, masked=True),
    "sequence_lower": partial(_at, construction="k_copies", name="sequence_lower"),
    "two_dirac_lower": partial(_at, construction="two_dirac_opt", name="two_dirac_lower"),
    "two_dirac_g": partial(_at, construction="two_dirac_eps", name="two_dirac_g"),
    "two_dirac_half": partial(_at, construction="two_dirac_half", name="two_dirac_half"),
    "two_dirac_asymptote": partial(_at, construction="two_dirac_opt", name="two_dirac_asymptote"),
    "mean_field_lower": partial(_at, construction="two_dirac_best", name="mean_field_lower"),
    "off_axis_two_atom": partial(_at, construction="off_axis", name="off_axis_two_atom"),
    "large_radius[limit+deviation]": partial(_large_radius, sign=+1),
    "large_radius[limit-deviation]": partial(_large_radius, sign=-1),
    "large_radius_limit": _large_radius_limit,
    "kim_l2_upper[p=2]": partial(_kim, p=2),
    "kim_l2_upper[p=2,WQ^2]": partial(_kim, p=2, squared=True),
    "kim_l2_upper[p=inf]": partial(_kim, p="inf"),
    "kim_softmax_lemma": _kim_lemma,
}


def _from_registry() -> tuple[BoundSpec, ...]:
    """One :class:`BoundSpec` per verified record of the registry, in the registry's order."""
    from theory.bounds import registry

    records = registry.verified()
    names = [r.name for r in records]
    if set(names) != set(EVALUATORS):
        missing = sorted(set(names) - set(EVALUATORS))
        extra = sorted(set(EVALUATORS) - set(names))
        raise RuntimeError(f"registry and evaluators differ: missing {missing}, unknown {extra}")
    return tuple(BoundSpec(r.name, r.side, r.status, r.source, EVALUATORS[r.name]) for r in records)


#: Every checked bound: the verified records of :mod:`theory.bounds.registry` with their
#: evaluators.
BOUNDS: tuple[BoundSpec, ...] = _from_registry()


def bound_margin(side: str, bound: float, lower: float, upper: float) -> float:
    """``bound / lower`` (upper bound) or ``upper / bound`` (lower bound); >= 1 means it holds."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if side == "upper":
            return math.inf if lower <= 0 else bound / lower
        if bound <= 0:
            return math.inf
        return upper / bound


def bound_holds(side: str, bound: float, lower: float, upper: float) -> bool:
    """Whether ``bound`` holds against the certified bracket ``[lower, upper]`` (up to BOUND_RTOL)."""
    if side == "upper":
        return bound * (1.0 + BOUND_RTOL) >= lower
    if side == "lower":
        return bound * (1.0 - BOUND_RTOL) <= upper
    return True


def registry_specs(extra_bounds: Sequence[BoundSpec] | None) -> tuple[BoundSpec, ...]:
    """The checked bounds: the registry's and ``extra_bounds``, names unique, sides and statuses known."""
    specs = tuple(BOUNDS) + tuple(extra_bounds or ())
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("bound names must be unique")
    for s in specs:
        if s.side not in ("upper", "lower", "limit"):
            raise ValueError(f"bound {s.name!r}: side must be 'upper', 'lower' or 'limit'")
        if s.status not in ("theorem", "candidate", "heuristic", "reported"):
            raise ValueError(f"bound {s.name!r}: unknown status {s.status!r}")
    return specs


def _theta(t: Target) -> float | None:
    r""":math:`\theta = \max_h\|A_h\|_2R^2` of a target (``None`` for Kim's L2 attention)."""
    if "heads" not in t.ctx or "R" not in t.ctx:
        return None
    return max(h["A"] for h in _head_norms(t)) * float(t.ctx["R"]) ** 2


#: Buckets of theta = max_h ||A_h|| R^2 for the per-bound margins (right-open intervals).
THETA_BUCKETS = ((0.0, 0.1), (0.1, 1.0), (1.0, 10.0), (10.0, math.inf))


def theta_bucket(theta: float | None) -> str | None:
    """The bucket of :data:`THETA_BUCKETS` holding ``theta`` (``None`` without one)."""
    if theta is None:
        return None
    for lo, hi in THETA_BUCKETS:
        if lo <= theta < hi:
            return f"[{lo:g}, {hi:g})"
    return None


def check_instance(seed: int, index: int, kind: str, specs: Sequence[BoundSpec]) -> dict[str, Any]:
    """Generate one instance and evaluate every applicable bound on every target.

    Returns
    -------
    dict
        ``{"index", "kind", "checks": [[bound, target index, target label, geometry, bound
        value, lower, value, upper, theta], ...]}``.
    """
    targets = make_targets(seed, index, kind)
    checks = []
    for ti, t in enumerate(targets):
        theta = _theta(t)
        for s in specs:
            b = s.evaluate(t)
            if b is None:
                continue
            checks.append(
                [s.name, ti, t.label, t.geometry, float(b), t.lower, t.value, t.upper, theta]
            )
    return {"index": int(index), "kind": kind, "checks": checks}
