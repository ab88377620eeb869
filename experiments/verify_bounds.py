r"""Verification harness: every bound of :mod:`theory.bounds` against the certified engine.

For random instances and adversarial constructions (dimensions :math:`d \in \{1, \dots, 4\}`,
:math:`n` up to 14 tokens, radii from 0.3 to 100, masked and unmasked, one head or several heads
with or without :math:`W^O`, uniform sequences and weighted measures) the harness computes the
certified bracket ``lower <= exact <= upper`` of the relevant local constant with
:func:`meanfield.lipschitz.local_lipschitz` (``method="dense"``, float64; Gram iteration
certified by Cholesky, THEORY.md §13.2) and checks

* every **upper** bound: ``bound >= lower`` (the engine's certified lower end), and
* every **lower** bound, evaluated at the very input it is a lower bound for (the eigenvector
  construction at that sequence, :math:`g(\varepsilon)` at that two-Dirac measure, the off-axis
  value at that two-atom measure, ...): ``bound <= upper`` (the certified upper end),

both up to :data:`BOUND_RTOL`, the float64 evaluation error of the closed forms. Kim et al.'s L2
bounds are checked against :func:`meanfield.lipschitz.local_lipschitz_fn` on
:func:`meanfield.attention.l2_self_attention` (2-norm) and against the exact
:math:`\infty`-norm of the dense Jacobian.

Every bound is registered (:data:`BOUNDS`) with a *status*:

``theorem``
    A result with a complete derivation (THEORY.md labels *standard*, *derived*, *derived and
    checked numerically*). A failure is a **violation**: it is listed with the full instance
    (seed, index, kind, d, n, R, masked, matrices, input) and the CLI exits non-zero.
``candidate``
    A reconstruction whose constant is not known to be right (THEORY.md *recollection,
    unverified* or an unproved repair), or a deliberate probe. A failure **refutes** the
    candidate: it is recorded as a finding with its examples, never as a harness failure.
``heuristic``
    A quantity known not to be a bound (the released data-dependent quantity, THEORY.md §6.2);
    its failures are counted for information.
``reported``
    A limit, not an inequality (the large-radius limit of §8): only the ratio is recorded.

For every bound the report gives the number of checks, the violations, the tightness ratio
``bound / engine value`` (min, median, max) and the worst instance (smallest margin
``bound / lower`` for an upper bound, ``upper / bound`` for a lower bound).

Instances are reproducible: instance ``index`` of a run with seed ``seed`` is drawn from
``numpy.random.default_rng([seed, index])`` (see :func:`make_targets`).

Provenance: the harness is ours; the bounds are those of :mod:`theory.bounds` (their docstrings
carry the THEORY.md labels), plus the certified data-dependent bound of THEORY.md §6.2, which
:mod:`theory.bounds` does not implement and which is evaluated here from its formula.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._threads import torch_threads
from .results import load_json, run_metadata, write_json
from .runner import preset_config

__all__ = [
    "BOUNDS",
    "BOUND_RTOL",
    "KINDS",
    "PRESETS",
    "BoundSpec",
    "Target",
    "add_parser",
    "make_targets",
    "report_section",
    "run",
    "summary",
    "verify",
]

log = logging.getLogger("meanfield.verify_bounds")

NAME = "verify_bounds"

#: Relative slack granted to a closed-form bound for its own float64 evaluation (values up to
#: ``exp(350)`` are computed as ``exp(log value)``, which loses up to ~1e-13 relative). The engine's
#: bracket carries its own certified margins; nothing else is tolerated.
BOUND_RTOL = 1e-10

#: Instance kinds, in the order of the schedule (see :data:`SCHEDULE`).
KINDS = (
    "random_sequence",
    "weighted_measure",
    "construction",
    "k_copies",
    "two_dirac",
    "off_axis",
    "equal_tokens",
    "large_radius",
    "kim_l2",
    "off_axis_opt",
    "worst_case",
)

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


def _interleave(weights: Mapping[str, int]) -> tuple[str, ...]:
    """Spread every kind evenly over one period (kind k at positions (j + 1/2) / w_k)."""
    slots = [((j + 0.5) / w, i, k) for i, (k, w) in enumerate(weights.items()) for j in range(w)]
    return tuple(k for _, _, k in sorted(slots))


#: One period of the instance schedule: instance ``i`` has kind ``SCHEDULE[i % len(SCHEDULE)]``
#: (restricted to the requested kinds).
SCHEDULE = _interleave(KIND_WEIGHTS)

#: Radii drawn by the random kinds (large radii included on purpose: the large-radius regime).
RADII = (0.3, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 20.0, 50.0, 100.0)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"n_instances": 30, "seed": 0},
    "quick": {"n_instances": 600, "seed": 0},
    "paper": {"n_instances": 5000, "seed": 0},
}

#: Version of the instance generators and checks; part of the Sweep configuration, so a change
#: here recomputes every instance.
HARNESS_VERSION = 1


# =============================================================================================
# targets and bound registry
# =============================================================================================
@dataclass
class Target:
    r"""One certified engine value and the context the bounds need.

    Attributes
    ----------
    label : str
        What was measured (e.g. ``"sequence"``, ``"two_dirac_opt[+]"``).
    geometry : str
        ``"euclidean"``, ``"wasserstein"``, ``"split"`` (engine geometries), ``"l2_inf"``
        (:math:`\infty`-norm of Kim's L2 attention) or ``"softmax_cost"`` (Kim's lemma).
    lower, value, upper : float
        Certified bracket ``lower <= exact <= upper`` and the engine's estimate.
    ctx : dict
        ``what`` (``"sequence"``, ``"measure"``, ``"kim"``, ``"softmax_cost"``), ``masked``,
        ``n``, ``R`` (largest token norm), ``heads`` (list of ``(A, V, W)`` numpy arrays, ``W``
        the column block of :math:`W^O` or ``None``), ``WO`` and, for constructions,
        ``construction`` with its parameters (``gamma``, ``Vu_norm``, ``eps``, ...), plus the
        input arrays (``X``; or ``points``, ``log_weights``, ``positions``).
    """

    label: str
    geometry: str
    lower: float
    value: float
    upper: float
    ctx: dict[str, Any] = field(default_factory=dict)


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
        Provenance and THEORY.md section.
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
        out = []
        for A, V, W in t.ctx["heads"]:
            WV = V if W is None else W @ V
            out.append(
                {
                    "A": float(np.linalg.norm(A, 2)),
                    "V": float(np.linalg.norm(V, 2)),
                    "W": 1.0 if W is None else float(np.linalg.norm(W, 2)),
                    "WV": float(np.linalg.norm(WV, 2)),
                }
            )
        t.ctx["_norms"] = out
    return t.ctx["_norms"]


def _per_head_sum(t: Target, head_bound: Callable[[dict[str, float]], float]) -> float:
    r""":math:`\sum_h\|W_h\|_2\,b_h` (THEORY.md §2.3, ``multihead_upper(rule="sum")``)."""
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
    return t.ctx.get("what") in ("sequence", "measure") and t.geometry in (
        "euclidean",
        "wasserstein",
        "split",
    )


# ------------------------------------------------------------------ upper bounds
def _sqrt_n(form: str) -> Callable[[Target], float | None]:
    def ev(t: Target) -> float | None:
        if not _is_sequence(t):
            return None
        from theory import bounds

        R, n = t.ctx["R"], t.ctx["n"]
        return _per_head_sum(
            t, lambda h: float(bounds.sqrt_n_upper(h["A"], h["V"], R, n, form=form))
        )

    return ev


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


def _softmax_rows(S: np.ndarray) -> np.ndarray:
    """Row softmax of logits with ``-inf`` entries (masked keys)."""
    m = S.max(axis=1, keepdims=True)
    E = np.exp(S - m)
    return E / E.sum(axis=1, keepdims=True)


def _certified_local(t: Target) -> float | None:
    if not _is_sequence(t):
        return None
    from theory.bounds import certified_local_upper

    return certified_local_upper(t.ctx["X"], t.ctx["heads"], masked=t.ctx["masked"])


def _released(fixed: bool) -> Callable[[Target], float | None]:
    def ev(t: Target) -> float | None:
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

    return ev


def _mean_field(c: float, masked: bool) -> Callable[[Target], float | None]:
    def ev(t: Target) -> float | None:
        if not _is_mean_field(t) or bool(t.ctx["masked"]) != masked:
            return None
        from theory import bounds

        R = t.ctx["R"]
        return _per_head_sum(t, lambda h: float(bounds.mean_field_upper(h["A"], h["V"], R, c=c)))

    return ev


def _mean_field_hardy(t: Target) -> float | None:
    r"""Masked repair: :math:`\|V\|(\theta + 2(1 + 2\theta)e^{\theta})` (Hardy factor 2, ours)."""
    if not _is_mean_field(t) or not t.ctx["masked"]:
        return None
    from theory import bounds

    R = t.ctx["R"]

    def head(h: dict[str, float]) -> float:
        theta = h["A"] * R**2
        return 2.0 * float(bounds.mean_field_upper(h["A"], h["V"], R, c=1.0)) - h["V"] * theta

    return _per_head_sum(t, head)


def _kim(p: Any, squared: bool = False) -> Callable[[Target], float | None]:
    def ev(t: Target) -> float | None:
        want = "euclidean" if p == 2 else "l2_inf"
        if t.ctx.get("what") != "kim" or t.geometry != want:
            return None
        from theory import bounds

        WQ, WV, WO = t.ctx["WQ"], t.ctx["WV"], t.ctx["WO"]
        H, D = WQ.shape[0], WQ.shape[1]
        norms = bounds.kim_l2_norms(WQ, WV, WO, p=p)
        # wq_power=2: ||W^{Q,h}||_2^2, degree 2 in W^Q like the map itself
        extra = {"wq_power": 2} if squared else {}
        return float(bounds.kim_l2_upper(t.ctx["n"], D=D, H=H, p=p, **norms, **extra))

    return ev


def _kim_lemma(t: Target) -> float | None:
    if t.ctx.get("what") != "softmax_cost":
        return None
    from theory import bounds

    return float(bounds.kim_softmax_lemma(t.ctx["n"]))


def _large_radius(sign: int) -> Callable[[Target], float | None]:
    def ev(t: Target) -> float | None:
        if t.ctx.get("construction") != "large_radius":
            return None
        lim, dev = t.ctx["limit"], t.ctx["deviation"]
        return lim + dev if sign > 0 else lim - dev

    return ev


def _large_radius_limit(t: Target) -> float | None:
    return t.ctx["limit"] if t.ctx.get("construction") == "large_radius" else None


# ------------------------------------------------------------------ lower bounds
def _at(construction: str, fn: Callable[[Target], float]) -> Callable[[Target], float | None]:
    def ev(t: Target) -> float | None:
        return fn(t) if t.ctx.get("construction") == construction else None

    return ev


def _trivial(t: Target) -> float | None:
    if t.ctx.get("construction") not in ("equal_tokens", "dirac"):
        return None
    from theory import bounds

    return float(bounds.trivial_lower(t.ctx["V_eff_norm"]))


def _sqrt_n_lower(t: Target) -> float | None:
    if t.ctx.get("construction") != "one_token" or t.ctx["masked"]:
        return None
    from theory import bounds

    c = t.ctx
    return float(bounds.sqrt_n_lower(c["gamma"], c["n"], c["Vu_norm"]))


def _masked_sqrt_n_lower(t: Target) -> float | None:
    if t.ctx.get("construction") != "one_token" or not t.ctx["masked"]:
        return None
    from theory import bounds

    c = t.ctx
    return float(bounds.masked_sqrt_n_lower(c["gamma"], c["n"], c["Vu_norm"]))


def _bound_fn(name: str, **kw: Any) -> Callable[[Target], float]:
    def fn(t: Target) -> float:
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

    return fn


_S61 = "THEORY.md §6.1"
BOUNDS: tuple[BoundSpec, ...] = (
    # ---- √n regime, uniform sequences (masked too), multi-head by the sum rule of §2.3
    BoundSpec(
        "sqrt_n_upper[sqrt3]",
        "upper",
        "theorem",
        f"{_S61}; constant a recollection of the paper's, as a bound derived",
        _sqrt_n("sqrt3"),
    ),
    BoundSpec(
        "sqrt_n_upper[sharp]", "upper", "theorem", f"{_S61}; ours, derived", _sqrt_n("sharp")
    ),
    BoundSpec(
        "sqrt_n_upper[triangle]", "upper", "theorem", f"{_S61}; ours, derived", _sqrt_n("triangle")
    ),
    BoundSpec(
        "multihead_upper[l2,triangle]",
        "upper",
        "theorem",
        "THEORY.md §2.3 (standard) with the triangle form of §6.1",
        _multihead_l2,
    ),
    BoundSpec(
        "certified_local",
        "upper",
        "theorem",
        "THEORY.md §6.2 certified data-dependent bound (derived); evaluated by the harness",
        _certified_local,
    ),
    BoundSpec(
        "released_data_dependent",
        "upper",
        "heuristic",
        "THEORY.md §6.2, from the authors' released code; known not to be a bound",
        _released(False),
    ),
    BoundSpec(
        "released_data_dependent+max_Ax",
        "upper",
        "candidate",
        "THEORY.md §6.2 repair (R_h + max_i ||A x_i||): evidence only, no proof",
        _released(True),
    ),
    # ---- mean field (sequences via Lip(f|B_R^n) <= Lip(F), measures via L_W and L_split)
    BoundSpec(
        "mean_field_upper[c'=2]",
        "upper",
        "theorem",
        "THEORY.md §7.1, c'=2: derived (Kantorovich-Rubinstein route)",
        _mean_field(2.0, False),
    ),
    BoundSpec(
        "mean_field_upper[c'=1]",
        "upper",
        "candidate",
        "THEORY.md §7.1, c'=1: derived along W2 geodesics; the paper's c' is unknown",
        _mean_field(1.0, False),
    ),
    BoundSpec(
        "mean_field_upper[c'=1/2]",
        "upper",
        "candidate",
        "probe below every derivation (THEORY.md §7.2 'matching' predicts failure)",
        _mean_field(0.5, False),
    ),
    BoundSpec(
        "mean_field_upper[c'=2,masked]",
        "upper",
        "candidate",
        "THEORY.md §9: masked mean-field constant finite, constant unknown",
        _mean_field(2.0, True),
    ),
    BoundSpec(
        "mean_field_upper[c'=1,masked]",
        "upper",
        "candidate",
        "THEORY.md §9: masked mean-field constant finite, constant unknown",
        _mean_field(1.0, True),
    ),
    BoundSpec(
        "mean_field_upper[c'=1,masked,Hardy]",
        "upper",
        "candidate",
        "ours: interaction term of the c'=1 form times 2, the Hardy constant of the causal "
        "running average (THEORY.md §9); no proof",
        _mean_field_hardy,
    ),
    # ---- lower bounds at their constructions
    BoundSpec("trivial_lower", "lower", "theorem", "THEORY.md §5.2 (derived)", _trivial),
    BoundSpec(
        "sqrt_n_lower",
        "lower",
        "theorem",
        "THEORY.md §6.3: construction from the released code, bound derived",
        _sqrt_n_lower,
    ),
    BoundSpec(
        "masked_sqrt_n_lower", "lower", "theorem", "THEORY.md §9 (derived)", _masked_sqrt_n_lower
    ),
    BoundSpec(
        "sequence_lower",
        "lower",
        "theorem",
        "ours (k copies), derived",
        _at("k_copies", _bound_fn("sequence_lower")),
    ),
    BoundSpec(
        "two_dirac_lower",
        "lower",
        "theorem",
        "THEORY.md §7.2 exact optimum (derived)",
        _at("two_dirac_opt", _bound_fn("two_dirac_lower")),
    ),
    BoundSpec(
        "two_dirac_g",
        "lower",
        "theorem",
        "THEORY.md §7.2 at a given mass (derived)",
        _at("two_dirac_eps", _bound_fn("two_dirac_g")),
    ),
    BoundSpec(
        "two_dirac_half",
        "lower",
        "theorem",
        "THEORY.md §7.2, w = 1/2 (derived)",
        _at("two_dirac_half", _bound_fn("two_dirac_half")),
    ),
    BoundSpec(
        "two_dirac_asymptote",
        "lower",
        "theorem",
        "THEORY.md §7.2 asymptote (derived)",
        _at("two_dirac_opt", _bound_fn("two_dirac_asymptote")),
    ),
    BoundSpec(
        "mean_field_lower",
        "lower",
        "theorem",
        "THEORY.md §7.2 global lower bound max(||V||, sup g), both cases (derived)",
        _at("two_dirac_best", _bound_fn("mean_field_lower")),
    ),
    BoundSpec(
        "off_axis_two_atom",
        "lower",
        "theorem",
        "THEORY.md §7.3 (derived; not in any source)",
        _at("off_axis", _bound_fn("off_axis_two_atom")),
    ),
    # ---- large radius (§8)
    BoundSpec(
        "large_radius[limit+deviation]",
        "upper",
        "theorem",
        "THEORY.md §8 limit with the deviation bound of theory.bounds (ours, derived)",
        _large_radius(+1),
    ),
    BoundSpec(
        "large_radius[limit-deviation]",
        "lower",
        "theorem",
        "THEORY.md §8 limit with the deviation bound of theory.bounds (ours, derived)",
        _large_radius(-1),
    ),
    BoundSpec(
        "large_radius_limit",
        "limit",
        "reported",
        "THEORY.md §8 (derived): ||V|| sqrt(max_j N_j), the R -> inf limit",
        _large_radius_limit,
    ),
    # ---- Kim, Papamakarios & Mnih (§10)
    BoundSpec(
        "kim_l2_upper[p=2]",
        "upper",
        "candidate",
        "THEORY.md §10.3: Kim et al. Thm 3.2 as recalled, unverified",
        _kim(2),
    ),
    BoundSpec(
        "kim_l2_upper[p=2,WQ^2]",
        "upper",
        "candidate",
        "ours: the p=2 form with ||W^{Q,h}||_2 squared (the map is quadratic in W^Q)",
        _kim(2, squared=True),
    ),
    BoundSpec(
        "kim_l2_upper[p=inf]",
        "upper",
        "candidate",
        "THEORY.md §10.3: Kim et al. Thm 3.2 as recalled, unverified",
        _kim("inf"),
    ),
    BoundSpec("kim_softmax_lemma", "upper", "theorem", "THEORY.md §10.4 (derived)", _kim_lemma),
)


# =============================================================================================
# the engine
# =============================================================================================


def _t(a: np.ndarray) -> Any:
    import torch

    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def _params(heads: Sequence[tuple], WO: np.ndarray | None) -> Any:
    from meanfield import AttentionParams, MultiHeadParams

    ps = [AttentionParams(_t(A), _t(V)) for A, V, _ in heads]
    if len(ps) == 1 and WO is None:
        return ps[0]
    return MultiHeadParams(tuple(ps), W_O=None if WO is None else _t(WO))


def _engine(
    x: Any, params: Any, *, geometry: str = "euclidean", masked: bool = False
) -> tuple[float, float, float]:
    """Certified bracket (lower, value, upper) of the local constant (dense, float64)."""
    from meanfield.lipschitz import local_lipschitz

    est = local_lipschitz(x, params, geometry=geometry, masked=masked, method="dense")
    return float(est.lower), float(est.value), float(est.upper)


def _measure(points: np.ndarray, log_weights: np.ndarray, positions: np.ndarray | None = None):
    from meanfield import DiracMeasure

    return DiracMeasure.from_log_weights(
        _t(points), _t(log_weights), None if positions is None else _t(positions)
    )


# =============================================================================================
# instance generators
# =============================================================================================
def _random_A(rng: np.random.Generator, d: int, a_norm: float) -> np.ndarray:
    """Non-symmetric score matrix with ||A||_2 = a_norm (sometimes a structured one)."""
    u = rng.random()
    if u < 0.08:
        A = -np.eye(d)  # the "matching" case lambda = -||A|| (THEORY.md §7.2)
    elif u < 0.14:
        A = np.eye(d)
    elif u < 0.2 and d >= 2:
        A = np.zeros((d, d))
        A[0, 1] = 1.0  # e_1 e_2^T, the counterexample of §6.2
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
    heads = []
    for h, (A, V) in enumerate(heads_AV):
        W = None if WO is None else WO[:, h * d : (h + 1) * d]
        heads.append((A, V, W))
    return heads, WO


def _seq_ctx(X: np.ndarray, heads, WO, masked: bool) -> dict[str, Any]:
    return {
        "what": "sequence",
        "masked": masked,
        "n": X.shape[0],
        "R": float(np.max(np.linalg.norm(X, axis=1))),
        "heads": heads,
        "WO": WO,
        "X": X,
    }


def _kind_random_sequence(rng: np.random.Generator) -> list[Target]:
    d = int(rng.integers(1, 5))
    n = int(rng.integers(1, 9))
    R = float(rng.choice(RADII))
    masked = bool(rng.random() < 0.5)
    heads, WO = _heads(rng, d)
    X = _ball_points(rng, n, d, R, sphere=bool(rng.random() < 0.3))
    if n >= 3 and rng.random() < 0.3:  # some exact copies (ties, THEORY.md §8)
        X[1:3] = X[0]
    if d >= 2 and rng.random() < 0.12:
        # THEORY.md §6.2 counterexample to the released quantity: A = a e_1 e_2^T, one head,
        # tokens on the e_2 axis, so that R_h = max_i ||A^T x_i|| = 0
        A = np.zeros((d, d))
        A[0, 1] = _log_uniform(rng, 0.1, 3.0)
        heads, WO = [(A, _random_V(rng, d), None)], None
        X = np.zeros((n, d))
        X[:, 1] = R * rng.uniform(-1.0, 1.0, n)
        X[0, 1] = R
    lo, val, up = _engine(_t(X), _params(heads, WO), masked=masked)
    return [Target("sequence", "euclidean", lo, val, up, _seq_ctx(X, heads, WO, masked))]


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
    mu = _measure(X, lw, pos)
    params = _params(heads, WO)
    ctx = {
        "what": "measure",
        "masked": masked,
        "n": n,
        "R": float(np.max(np.linalg.norm(X, axis=1))),
        "heads": heads,
        "WO": WO,
        "points": X,
        "log_weights": lw,
        "positions": pos,
    }
    out = [Target("measure", "wasserstein", *_engine(mu, params, geometry="wasserstein"), ctx)]
    if not masked:
        out.append(Target("measure", "split", *_engine(mu, params, geometry="split"), dict(ctx)))
    return out


def _single_head(rng: np.random.Generator, d: int, a_norm: float) -> tuple[np.ndarray, np.ndarray]:
    d_v = d if rng.random() < 0.8 else int(rng.integers(1, d + 1))
    return _random_A(rng, d, a_norm), _random_V(rng, d, d_v)


def _construction_X(rng: np.random.Generator, A: np.ndarray, R: float, n: int) -> np.ndarray:
    """The eigenvector construction (released variant when A has a real eigenvalue)."""
    from meanfield.attacks import adversarial_sequence

    variant = "released" if rng.random() < 0.5 else "symmetric"
    try:
        con = adversarial_sequence(_t(A), R, n, variant=variant)
    except ValueError:  # no real eigenvalue: the released variant does not exist
        con = adversarial_sequence(_t(A), R, n, variant="symmetric")
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
    heads = [(A, V, None)]
    ctx = _seq_ctx(X, heads, None, masked)
    ctx.update(construction="one_token", **_construction_ctx(X, X[0], X[1], A, V))
    lo, val, up = _engine(_t(X), _params(heads, None), masked=masked)
    return [Target("one_token", "euclidean", lo, val, up, ctx)]


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
    heads = [(A, V, None)]
    ctx = _seq_ctx(X, heads, None, False)
    ctx.update(construction="k_copies", k=k, **cc)
    lo, val, up = _engine(_t(X), _params(heads, None))
    return [Target("k_copies", "euclidean", lo, val, up, ctx)]


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
    params = _params([(A, V, None)], None)
    heads = [(A, V, None)]
    out: list[Target] = []
    brackets = []

    def ctx_of(td: Any) -> dict[str, Any]:
        pts = td.measure.points.numpy()
        lw = td.measure.log_weights.numpy()
        c = {
            "what": "measure",
            "masked": False,
            "n": 2,
            "R": float(np.max(np.linalg.norm(pts, axis=1))),
            "heads": heads,
            "WO": None,
            "points": pts,
            "log_weights": lw,
            "positions": None,
        }
        c.update(_construction_ctx(pts, pts[1], pts[0], A, V))  # light atom 1, heavy atom 0
        c["log_eps"] = float(lw[1])
        return c

    from theory import bounds

    ext = bounds.rayleigh_extremes(A)
    for case, ok in (("+", ext.lam_max > 0), ("-", ext.lam_min < 0)):
        if not ok:
            continue
        td = two_dirac(_t(A), R, case=case, V=_t(V))
        c = ctx_of(td)
        c["construction"] = "two_dirac_opt"
        br = _engine(td.measure, params, geometry="wasserstein")
        brackets.append(br)
        out.append(Target(f"two_dirac_opt[{case}]", "wasserstein", *br, c))
        out.append(
            Target(
                f"two_dirac_opt[{case}]",
                "split",
                *_engine(td.measure, params, geometry="split"),
                dict(c, construction=None),
            )
        )
    # single Dirac: the trivial bound ||V|| (F(delta_x) = delta_{Vx})
    x = _ball_points(rng, 1, d, R, sphere=False)
    dirac = _measure(x, np.zeros(1))
    br = _engine(dirac, params, geometry="wasserstein")
    brackets.append(br)
    out.append(
        Target(
            "dirac",
            "wasserstein",
            *br,
            {
                "what": "measure",
                "masked": False,
                "n": 1,
                "R": float(np.linalg.norm(x)),
                "heads": heads,
                "WO": None,
                "points": x,
                "log_weights": np.zeros(1),
                "positions": None,
                "construction": "dirac",
                "V_eff_norm": float(np.linalg.norm(V, 2)),
            },
        )
    )
    # max over the constructions: a bracket of the best value, for mean_field_lower
    best = tuple(max(b[i] for b in brackets) for i in range(3))
    out.append(
        Target(
            "two_dirac_best",
            "wasserstein",
            *best,
            {
                "what": "best",
                "masked": False,
                "R": R,
                "heads": heads,
                "WO": None,
                "construction": "two_dirac_best",
            },
        )
    )
    # a random mass and the w = 1/2 mass, in the case chosen by the -8 rule
    td0 = two_dirac(_t(A), R, V=_t(V))
    gamma = td0.gamma
    opt = bounds.two_dirac_optimal_mass(gamma)
    le = min(float(opt.log_eps) + rng.normal(0.0, 3.0), -1e-3)
    for label, log_eps in (
        ("two_dirac_eps", le),
        ("two_dirac_half", -float(np.logaddexp(0.0, gamma))),
    ):
        if not log_eps < 0:
            continue
        td = two_dirac(_t(A), R, log_eps=log_eps, case=td0.case, V=_t(V))
        c = ctx_of(td)
        c["construction"] = label
        out.append(
            Target(label, "wasserstein", *_engine(td.measure, params, geometry="wasserstein"), c)
        )
    return out


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
    mu = _measure(np.stack([y, x]), lw)
    ctx = {
        "what": "measure",
        "masked": False,
        "n": 2,
        "R": float(np.max(np.linalg.norm(P, axis=1))),
        "heads": heads,
        "WO": None,
        "points": np.stack([y, x]),
        "log_weights": lw,
        "positions": None,
        "construction": "off_axis",
        "x": x,
        "y": y,
        "h": h,
        "w": w,
    }
    return [
        Target(
            "off_axis",
            "wasserstein",
            *_engine(mu, _params(heads, None), geometry="wasserstein"),
            ctx,
        )
    ]


def _kind_off_axis_opt(rng: np.random.Generator) -> list[Target]:
    from meanfield.attacks import off_axis_two_atoms

    d = int(rng.integers(2, 4))
    R = float(rng.choice(RADII[:6]))
    A, V = _single_head(rng, d, _log_uniform(rng, 0.05, 30.0) / R**2)
    heads = [(A, V, None)]
    params = _params(heads, None)
    res = off_axis_two_atoms(params, R, n_restarts=2, steps=40, seed=int(rng.integers(2**31)))
    pts = res.measure.points.numpy()
    lw = res.measure.log_weights.numpy()
    ctx = {
        "what": "measure",
        "masked": False,
        "n": 2,
        "R": float(np.max(np.linalg.norm(pts, axis=1))),
        "heads": heads,
        "WO": None,
        "points": pts,
        "log_weights": lw,
        "positions": None,
        "construction": "off_axis",
        "x": res.x.numpy(),
        "y": res.y.numpy(),
        "h": res.h.numpy(),
        "w": res.w,
    }
    if not 0.0 < res.w < 1.0:
        return []
    return [
        Target(
            "off_axis_opt",
            "wasserstein",
            *_engine(res.measure, params, geometry="wasserstein"),
            ctx,
        )
    ]


def _kind_worst_case(rng: np.random.Generator) -> list[Target]:
    from meanfield.attacks import worst_case_measure

    d = int(rng.integers(1, 3))
    R = float(rng.choice(RADII[:6]))
    A, V = _single_head(rng, d, _log_uniform(rng, 0.05, 8.0) / R**2)
    heads = [(A, V, None)]
    params = _params(heads, None)
    geometry = "wasserstein" if rng.random() < 0.7 else "split"
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
    pts = res.measure.points.numpy()
    lw = res.measure.log_weights.numpy()
    ctx = {
        "what": "measure",
        "masked": False,
        "n": pts.shape[0],
        "R": float(np.max(np.linalg.norm(pts, axis=1))),
        "heads": heads,
        "WO": None,
        "points": pts,
        "log_weights": lw,
        "positions": None,
    }
    return [Target("worst_case", geometry, *_engine(res.measure, params, geometry=geometry), ctx)]


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
    ctx = _seq_ctx(X, heads, WO, masked)
    ctx.update(construction="equal_tokens", V_eff_norm=float(np.linalg.norm(V_eff, 2)))
    lo, val, up = _engine(_t(X), _params(heads, WO), masked=masked)
    return [Target("equal_tokens", "euclidean", lo, val, up, ctx)]


def _kind_large_radius(rng: np.random.Generator) -> list[Target]:
    from theory import bounds

    d = int(rng.integers(1, 4))
    n = int(rng.integers(2, 9))
    R = float(rng.choice((1.0, 3.0, 10.0, 20.0, 50.0, 100.0)))
    masked = bool(rng.random() < 0.5)
    A, V = _single_head(rng, d, _log_uniform(rng, 0.3, 2.0))
    X0 = _ball_points(rng, n, d, 1.0, sphere=False)
    X = R * X0 / np.max(np.linalg.norm(X0, axis=1))
    heads = [(A, V, None)]
    V_norm = float(np.linalg.norm(V, 2))
    counts = bounds.large_radius_counts(X, A, masked=masked)
    gap = bounds.selection_gap(X, A, masked=masked)
    ctx = _seq_ctx(X, heads, None, masked)
    ctx.update(
        construction="large_radius",
        limit=float(bounds.large_radius_limit(counts, V_norm)),
        deviation=float(
            bounds.large_radius_deviation(gap, n, float(np.linalg.norm(A, 2)), V_norm, R)
        ),
        margin=gap,
    )
    lo, val, up = _engine(_t(X), _params(heads, None), masked=masked)
    return [Target("large_radius", "euclidean", lo, val, up, ctx)]


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
    p = L2AttentionParams(_t(WQ), _t(WV), _t(WO))

    def fn(Y: Any) -> Any:
        return l2_self_attention(Y, p)

    Xt = _t(X)
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
    out.append(
        Target(
            "softmax_cost",
            "softmax_cost",
            worst,
            worst,
            worst,
            {"what": "softmax_cost", "n": N, "masked": False},
        )
    )
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


# =============================================================================================
# checking and aggregation
# =============================================================================================
def _margin(side: str, bound: float, lower: float, upper: float) -> float:
    """``bound / lower`` (upper bound) or ``upper / bound`` (lower bound); >= 1 means it holds."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if side == "upper":
            return math.inf if lower <= 0 else bound / lower
        if bound <= 0:
            return math.inf
        return upper / bound


def _holds(side: str, bound: float, lower: float, upper: float) -> bool:
    if side == "upper":
        return bound * (1.0 + BOUND_RTOL) >= lower
    if side == "lower":
        return bound * (1.0 - BOUND_RTOL) <= upper
    return True


def _registry(extra_bounds: Sequence[BoundSpec] | None) -> tuple[BoundSpec, ...]:
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


def _bucket(theta: float | None) -> str | None:
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


def _schedule(n_instances: int, kinds: Sequence[str]) -> list[dict[str, Any]]:
    sched = [k for k in SCHEDULE if k in kinds]
    if not sched:
        raise ValueError(f"no instance kind selected; choose from {', '.join(KINDS)}")
    return [{"index": i, "kind": sched[i % len(sched)]} for i in range(n_instances)]


def _instance_doc(seed: int, index: int, kind: str, target_index: int) -> dict[str, Any]:
    """Full data of one instance (regenerated deterministically) for the report."""
    targets = make_targets(seed, index, kind)
    t = targets[target_index]
    c = t.ctx
    doc: dict[str, Any] = {
        "seed": seed,
        "index": index,
        "kind": kind,
        "target": t.label,
        "geometry": t.geometry,
        "masked": c.get("masked"),
        "n": c.get("n"),
        "R": c.get("R"),
    }
    if "heads" in c:
        doc["d"] = int(c["heads"][0][0].shape[0])
        doc["heads"] = [{"A": A, "V": V} for A, V, _ in c["heads"]]
        doc["W_O"] = c.get("WO")
    for key in (
        "X",
        "points",
        "log_weights",
        "positions",
        "WQ",
        "WV",
        "gamma",
        "Vu_norm",
        "log_eps",
        "k",
        "x",
        "y",
        "h",
        "w",
        "limit",
        "deviation",
        "margin",
    ):
        if c.get(key) is not None:
            doc[key] = c[key]
    if c.get("what") == "kim":
        doc["WO"] = c["WO"]
    return doc


def _stats(x: list[float]) -> dict[str, float | None]:
    if not x:
        return {"min": None, "median": None, "max": None}
    a = np.asarray(x, dtype=np.float64)
    return {"min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}


def _num(x: Any) -> float:
    """A float from a record value (``experiments.results`` writes infinities as strings)."""
    if isinstance(x, str):
        return {"inf": math.inf, "-inf": -math.inf}.get(x, math.nan)
    return math.nan if x is None else float(x)


def aggregate(
    records: Sequence[Mapping[str, Any]],
    specs: Sequence[BoundSpec],
    *,
    seed: int,
    max_examples: int = 20,
) -> dict[str, Any]:
    """Summarise per-instance check records into the report (see :func:`verify`)."""
    per: dict[str, dict[str, Any]] = {
        s.name: {"checks": 0, "fails": [], "ratios": [], "worst": None, "theta": {}} for s in specs
    }
    spec_of = {s.name: s for s in specs}
    kinds: dict[str, int] = {}
    for rec in records:
        kinds[rec["kind"]] = kinds.get(rec["kind"], 0) + 1
        for name, ti, label, geom, b, lo, val, up, theta in rec["checks"]:
            if name not in per:
                continue
            b, lo, val, up = (_num(x) for x in (b, lo, val, up))  # JSONL stores inf as "inf"
            s = spec_of[name]
            p = per[name]
            p["checks"] += 1
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = b / val if val != 0 else (math.inf if b > 0 else 1.0)
            p["ratios"].append(ratio)
            m = _margin(s.side, b, lo, up) if s.side != "limit" else ratio
            item = {
                "index": rec["index"],
                "kind": rec["kind"],
                "target_index": ti,
                "target": label,
                "geometry": geom,
                "bound": b,
                "lower": lo,
                "value": val,
                "upper": up,
                "margin": m,
            }
            if s.side == "limit":
                key = abs(math.log(m)) if m > 0 and math.isfinite(m) else math.inf
                if p["worst"] is None or key > p["worst"]["_key"]:
                    p["worst"] = dict(item, _key=key)
            elif p["worst"] is None or m < p["worst"]["margin"]:
                p["worst"] = item
            if not _holds(s.side, b, lo, up):
                p["fails"].append(item)
            bk = _bucket(theta)
            if bk is not None and s.side != "limit":
                tb = p["theta"].setdefault(bk, {"n": 0, "min_margin": math.inf, "ratios": []})
                tb["n"] += 1
                tb["min_margin"] = min(tb["min_margin"], m)
                tb["ratios"].append(ratio)

    bounds_doc: dict[str, Any] = {}
    violations: list[dict[str, Any]] = []
    candidates: dict[str, Any] = {}
    heuristics: dict[str, Any] = {}
    for s in specs:
        p = per[s.name]
        worst = p["worst"]
        if worst is not None:
            worst = {k: v for k, v in worst.items() if k != "_key"}
            worst["instance"] = _instance_doc(
                seed, worst["index"], worst["kind"], worst["target_index"]
            )
        entry = {
            "side": s.side,
            "status": s.status,
            "source": s.source,
            "n_checked": p["checks"],
            "n_violations": len(p["fails"]) if s.side != "limit" else None,
            "tightness": _stats(p["ratios"]),
            "min_margin": None if worst is None or s.side == "limit" else worst["margin"],
            "by_theta": {
                k: {
                    "n": v["n"],
                    "min_margin": v["min_margin"],
                    "median_tightness": float(np.median(v["ratios"])),
                }
                for k, v in sorted(
                    p["theta"].items(), key=lambda kv: float(kv[0][1:].split(",")[0])
                )
            },
            "worst": worst,
        }
        bounds_doc[s.name] = entry
        examples = []
        for item in p["fails"][:max_examples]:
            ex = dict(item, name=s.name, side=s.side)
            ex["instance"] = _instance_doc(seed, item["index"], item["kind"], item["target_index"])
            examples.append(ex)
        if s.status == "theorem":
            violations.extend(examples)
            entry["n_violations_listed"] = len(examples)
        elif s.status == "candidate":
            candidates[s.name] = {
                "verdict": "refuted" if p["fails"] else ("survived" if p["checks"] else "untested"),
                "n_checked": p["checks"],
                "n_refuted": len(p["fails"]),
                "min_margin": entry["min_margin"],
                "source": s.source,
                "examples": examples[:3],
            }
        elif s.status == "heuristic":
            heuristics[s.name] = {
                "n_checked": p["checks"],
                "n_fail": len(p["fails"]),
                "min_margin": entry["min_margin"],
                "examples": examples[:2],
            }
    n_theorem_fail = sum(len(per[s.name]["fails"]) for s in specs if s.status == "theorem")
    return {
        "n_instances": len(records),
        "instances_by_kind": kinds,
        "bound_rtol": BOUND_RTOL,
        "passed": n_theorem_fail == 0,
        "n_theorem_violations": n_theorem_fail,
        "violations": violations,
        "candidates": candidates,
        "known_invalid": heuristics,
        "bounds": bounds_doc,
    }


def verify(
    n_instances: int = 200,
    seed: int = 0,
    kinds: Sequence[str] | None = None,
    progress: bool = True,
    *,
    extra_bounds: Sequence[BoundSpec] | None = None,
    sweep_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run the harness on ``n_instances`` instances and return the report.

    Parameters
    ----------
    n_instances : int
        Number of instances (each yields one or more engine brackets).
    seed : int
        Run seed; instance ``i`` is drawn from ``default_rng([seed, i])``.
    kinds : sequence of str, optional
        Subset of :data:`KINDS` (default: all), scheduled by :data:`SCHEDULE`.
    progress : bool
        tqdm progress bar on stderr.
    extra_bounds : sequence of BoundSpec, optional
        Bounds checked in addition to :data:`BOUNDS` (e.g. a deliberately wrong one in the tests).
    sweep_dir : path, optional
        Store one record per instance in ``sweep_dir/instances.jsonl`` through
        :class:`experiments.runner.Sweep` (resumable: finished instances are not recomputed).

    Returns
    -------
    dict
        ``passed`` (no theorem violated), ``n_theorem_violations``, ``violations`` (each with
        the full instance), ``candidates`` (verdict ``survived``/``refuted``, min margin,
        examples), ``known_invalid``, ``bounds`` (per bound: side, status, source, counts,
        tightness ``bound / value`` min/median/max, min margin, worst instance),
        ``instances_by_kind``, ``seconds``.
    """
    n_instances = int(n_instances)
    if n_instances < 1:
        raise ValueError(f"n_instances must be >= 1, got {n_instances}")
    kinds = tuple(KINDS if kinds is None else kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kind(s) {', '.join(bad)}; choose from {', '.join(KINDS)}")
    specs = _registry(extra_bounds)
    points = _schedule(n_instances, kinds)
    t0 = time.perf_counter()

    def compute(point: Mapping[str, Any]) -> dict[str, Any]:
        return check_instance(seed, point["index"], point["kind"], specs)

    if sweep_dir is not None:
        from .runner import Sweep

        config = {
            "harness_version": HARNESS_VERSION,
            "seed": int(seed),
            "bounds": [s.name for s in specs],
        }
        sweep = Sweep(sweep_dir, "instances", config, seed=int(seed), device="cpu", dtype="float64")
        records = sweep.run(points, compute, progress=progress, desc="verify-bounds")
    else:
        from tqdm.auto import tqdm

        records = [
            compute(p)
            for p in tqdm(
                points, desc="verify-bounds", leave=False, disable=None if progress else True
            )
        ]
    report = aggregate(records, specs, seed=int(seed))
    report["seed"] = int(seed)
    report["kinds"] = list(kinds)
    report["seconds"] = time.perf_counter() - t0
    return report


# =============================================================================================
# experiment-module contract
# =============================================================================================
def run(
    results_dir: Path,
    preset: str = "quick",
    *,
    device: str = "cpu",
    progress: bool = True,
    **overrides: Any,
) -> list[Path]:
    """Run the harness for a preset and write ``results_dir/verify_bounds/report.json``.

    Parameters
    ----------
    results_dir : Path
    preset : {"tiny", "quick", "paper"}
        Instance counts 30, 600, 5000.
    device : str
        Only ``"cpu"`` (the certified dense brackets run in float64 on the CPU).
    progress : bool
    **overrides
        ``n_instances``, ``seed`` or ``kinds`` replace the preset's entries.

    Returns
    -------
    list of Path
        The report and the per-instance records (``instances.jsonl``, resumable).
    """
    cfg = preset_config(
        {k: {"kinds": list(KINDS), **v} for k, v in PRESETS.items()},
        preset,
        overrides,
        what=f"{NAME} option(s)",
    )
    cfg.update(overrides)
    if device != "cpu":
        raise ValueError(f"verify_bounds runs on the CPU only, got device={device!r}")
    out = Path(results_dir) / NAME
    report = verify(cfg["n_instances"], cfg["seed"], cfg["kinds"], progress, sweep_dir=out)
    doc = {
        "kind": NAME,
        "metadata": run_metadata(
            seed=cfg["seed"], device=device, dtype="float64", config={"preset": preset, **cfg}
        ),
        **report,
    }
    path = write_json(out / "report.json", doc)
    return [path, out / "instances.jsonl"]


def _load(results_dir: Path) -> dict[str, Any]:
    path = Path(results_dir) / NAME / "report.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the verify_bounds experiment first")
    return load_json(path)


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return "inf"
    return f"{x:.3g}"


def summary(results_dir: Path) -> dict[str, Any]:
    """Compact JSON-able summary of a saved report."""
    rep = _load(results_dir)
    return {
        "n_instances": rep["n_instances"],
        "passed": rep["passed"],
        "n_theorem_violations": rep["n_theorem_violations"],
        "candidates": {k: v["verdict"] for k, v in rep["candidates"].items()},
        "tightness": {k: v["tightness"] for k, v in rep["bounds"].items()},
    }


def _table(rep: Mapping[str, Any]) -> list[str]:
    lines = [
        "| bound | side | status | checks | violations | tightness min | median | max | min margin |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, b in rep["bounds"].items():
        t = b["tightness"]
        nv = b["n_violations"]
        lines.append(
            f"| `{name}` | {b['side']} | {b['status']} | {b['n_checked']} | "
            f"{'–' if nv is None else nv} | {_fmt(t['min'])} | {_fmt(t['median'])} | "
            f"{_fmt(t['max'])} | {_fmt(b['min_margin'])} |"
        )
    return lines


def report_section(results_dir: Path, figures_dir: Path) -> str:
    """Markdown section for report.md: verdict, refuted candidates and the tightness table."""
    rep = _load(results_dir)
    verdict = (
        "no theorem violated"
        if rep["passed"]
        else f"**{rep['n_theorem_violations']} theorem violations**"
    )
    refuted = [k for k, v in rep["candidates"].items() if v["verdict"] == "refuted"]
    survived = [k for k, v in rep["candidates"].items() if v["verdict"] == "survived"]
    lines = [
        "## Verification of the bounds against the certified engine",
        "",
        f"{rep['n_instances']} instances (seed {rep['seed']}): {verdict}. Tightness is "
        "bound / engine value; the margin is bound / certified lower end (upper bounds) or "
        "certified upper end / bound (lower bounds), so a margin below 1 is a failure.",
        "",
        f"Candidates surviving: {', '.join(f'`{k}`' for k in survived) or 'none'}. "
        f"Candidates refuted: {', '.join(f'`{k}`' for k in refuted) or 'none'}.",
        "",
        *_table(rep),
    ]
    fig = Path(figures_dir) / "fig_theory_bounds.png"
    if fig.exists():
        lines += ["", f"![theory bounds](figures/{fig.name})"]
    return "\n".join(lines) + "\n"


# =============================================================================================
# command line
# =============================================================================================
def _cmd(args: argparse.Namespace) -> dict[str, Any]:
    kinds = None if not args.kinds else [k.strip() for k in args.kinds.split(",") if k.strip()]
    report = verify(args.instances, args.seed, kinds, not args.no_progress)
    doc = {
        "kind": NAME,
        "metadata": run_metadata(
            seed=args.seed,
            device="cpu",
            dtype="float64",
            config={"n_instances": args.instances, "kinds": kinds},
        ),
        **report,
    }
    if args.out:
        doc["file"] = str(write_json(args.out, doc))
    if not report["passed"]:
        first = report["violations"][0] if report["violations"] else {}
        raise RuntimeError(
            f"{report['n_theorem_violations']} theorem violation(s), first: "
            f"{first.get('name')} on instance {first.get('index')} ({first.get('kind')})"
            + (f"; report written to {args.out}" if args.out else "")
        )
    return doc


def _print(doc: Mapping[str, Any]) -> None:
    print(
        f"verify-bounds: {doc['n_instances']} instances, "
        f"{'PASSED' if doc['passed'] else 'FAILED'} ({doc['seconds']:.1f} s)"
    )
    for line in _table(doc):
        print("  " + line)
    for name, c in doc["candidates"].items():
        print(f"  candidate {name}: {c['verdict']} (min margin {_fmt(c['min_margin'])})")
    if "file" in doc:
        print(f"  wrote {doc['file']}")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``verify-bounds`` to the ``meanfield`` subcommands."""
    p = subparsers.add_parser(
        "verify-bounds",
        help="check every bound of theory.bounds against certified local constants",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--instances",
        type=int,
        default=PRESETS["quick"]["n_instances"],
        help=f"number of instances (default {PRESETS['quick']['n_instances']})",
    )
    p.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    p.add_argument("--kinds", default=None, help=f"comma-separated subset of: {', '.join(KINDS)}")
    p.add_argument("--out", default=None, help="write the JSON report to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--no-progress", action="store_true", help="disable the progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    p.set_defaults(handler=_cmd, printer=_print)
    return p
