r"""One registry of the bounds of :mod:`theory.bounds`: name, side, status, provenance, section.

Three readers use it:

* the ``meanfield bound`` command: :func:`cli_bounds` maps each command-line name to a
  :class:`Bound`, whose ``function``, ``args``, ``help`` and ``options`` fields are those the
  command needs to parse its options and call the function;
* the verification harness (``meanfield verify-bounds``): :func:`verified` lists, in a fixed
  order, every bound it checks against the certified engine, with the side and status that decide
  how a failure is reported;
* the docs: :func:`markdown_table` renders the table of docs/theory.md §15.

A record is either the plain function (``name == function``) or one *variant* of it, written
``function[variant]`` (e.g. ``sqrt_n_upper[sharp]``), whose keyword options are fixed in
``fixed``. Calling a record calls its function with those options:
``get("mean_field_upper[c'=2]")(A_norm, V_norm, R)`` is ``mean_field_upper(A_norm, V_norm, R,
c=2.0)``. The two records that are not one call of a public function (the masked repair with the
Hardy factor, the large-radius band) carry their own small evaluator in ``compose``.

Sides
-----
``upper``, ``lower``
    An inequality on the local Lipschitz constant named in the docstring of the function.
``limit``
    A limit, not an inequality (the hard-max limit at large radius).
``value``
    An auxiliary quantity (a gap, a radius, a gain, an optimal mass, a count) that is not itself
    a bound on a Lipschitz constant.

Statuses
--------
``theorem``
    A complete derivation (provenance *standard*, *derived* or *derived and checked
    numerically*); a failure in the harness is a violation.
``candidate``
    A reconstruction whose constant is not known to be right (*recollection, unverified*), an
    unproved repair, or a deliberate probe; a failure refutes it and is a finding.
``heuristic``
    A quantity known not to be a bound (the released data-dependent quantity).
``reported``
    A limit: only its ratio to the engine value is recorded.

See docs/theory.md §15 for the provenance labels and how the statuses are used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from theory.bounds._common import checked_choice

__all__ = [
    "BOUNDS",
    "PROVENANCE_LABELS",
    "SIDES",
    "STATUSES",
    "Bound",
    "by_function",
    "cli_bounds",
    "get",
    "markdown_table",
    "verified",
]

Side = Literal["upper", "lower", "limit", "value"]
Status = Literal["theorem", "candidate", "heuristic", "reported"]

SIDES: tuple[str, ...] = ("upper", "lower", "limit", "value")
STATUSES: tuple[str, ...] = ("theorem", "candidate", "heuristic", "reported")

#: The provenance labels of docs/theory.md §15 (a record's ``provenance`` combines them).
PROVENANCE_LABELS: tuple[str, ...] = (
    "stated in the paper (abstract)",
    "from the authors' released code",
    "derived and checked numerically",
    "recollection, unverified",
    "unknown",
    "standard",
)


@dataclass(frozen=True)
class Bound:
    """One registered bound (or auxiliary quantity) of :mod:`theory.bounds`.

    Attributes
    ----------
    name : str
        Unique key: the function name, or ``function[variant]`` for a variant. The verification
        harness reports under this name.
    function : str
        Public function of :mod:`theory.bounds` that evaluates it.
    side : {"upper", "lower", "limit", "value"}
        See the module docstring.
    status : {"theorem", "candidate", "heuristic", "reported"}
        See the module docstring.
    provenance : str
        Provenance label(s) of docs/theory.md §15, with a short qualification.
    section : str
        Where the derivation is written up, e.g. ``"docs/theory.md §1"``.
    args : tuple of str
        Names of the positional inputs, in the function's order (the ``meanfield bound`` command
        uses them as option names).
    help : str
        One line: what the bound says.
    options : tuple of str
        Keyword options a caller may still choose.
    fixed : mapping
        Keyword options that define this variant (empty for the plain function).
    note : str
        How the verification harness applies it, when that is not obvious from the name.
    cli : str or None
        Name under ``meanfield bound``; ``None`` when the command does not offer it.
    cli_options : tuple of str
        The keyword options the command forwards when given (a subset of ``options``).
    verified : bool
        Whether the verification harness checks this record (:func:`verified`).
    compose : callable or None
        Evaluator for the records that are not one call of ``function`` with ``fixed``.
    """

    name: str
    function: str
    side: Side
    status: Status
    provenance: str
    section: str
    args: tuple[str, ...]
    help: str
    options: tuple[str, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    cli: str | None = None
    cli_options: tuple[str, ...] = ()
    verified: bool = False
    compose: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        checked_choice(self.side, "side", SIDES)
        checked_choice(self.status, "status", STATUSES)
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))

    @property
    def func(self) -> Callable[..., Any]:
        """The public function of :mod:`theory.bounds` named by ``function``."""
        return getattr(importlib.import_module("theory.bounds"), self.function)

    @property
    def source(self) -> str:
        """One line for reports: the section and the note (or the provenance)."""
        return f"{self.section}; {self.note or self.provenance}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate: ``function(*args, **fixed, **kwargs)`` (or ``compose``)."""
        if self.compose is not None:
            return self.compose(*args, **kwargs)
        return self.func(*args, **{**self.fixed, **kwargs})


# ------------------------------------------------------------------ composed evaluators
def _mean_field_masked_hardy(A_norm: Any, V_norm: Any, R: Any) -> float:
    r"""Masked repair :math:`\|V\|(\theta + 2(1 + 2\theta)e^{\theta})` (ours, no proof).

    The interaction term of the c' = 1 form times 2, the Hardy constant of the causal running
    average.
    """
    from theory.bounds.mean_field import mean_field_upper

    theta = A_norm * R**2
    return 2.0 * float(mean_field_upper(A_norm, V_norm, R, c=1.0)) - V_norm * theta


def _large_radius_band(sign: int) -> Callable[..., float]:
    def band(X: Any, A: Any, V: Any, *, masked: bool = False) -> float:
        """Large-radius limit plus (``sign = +1``) or minus its deviation bound at ``X``."""
        from theory.bounds.large_radius import (
            large_radius_counts,
            large_radius_deviation,
            large_radius_limit,
            selection_gap,
        )

        X_ = np.asarray(X, dtype=np.float64)
        A_ = np.asarray(A, dtype=np.float64)
        V_norm = float(np.linalg.norm(np.asarray(V, dtype=np.float64), 2))
        R = float(np.max(np.linalg.norm(X_, axis=1)))
        A_norm = float(np.linalg.norm(A_, 2))
        lim = float(large_radius_limit(large_radius_counts(X_, A_, masked=masked), V_norm))
        gap = selection_gap(X_, A_, masked=masked)
        dev = float(large_radius_deviation(gap, X_.shape[0], A_norm, V_norm, R))
        return lim + dev if sign > 0 else lim - dev

    return band


# ------------------------------------------------------------------ the records
_T: Status = "theorem"
_C: Status = "candidate"
_DER = "derived and checked numerically"
_S1, _S2, _S3, _S4 = (f"docs/theory.md §{i}" for i in (1, 2, 3, 4))
_S5, _S6, _S7, _S8 = (f"docs/theory.md §{i}" for i in (5, 6, 7, 8))
_S9, _S10, _S16, _S17, _S18 = (f"docs/theory.md §{i}" for i in (9, 10, 16, 17, 18))
_BL = _DER + " (ours; docs/derivations/bounded_logits.md)"
_QK = ("Q_norm", "K_norm")
_QK_OPTIONS = ("scale", "weight_max")
_NORMS = ("A_norm", "V_norm", "R")
_KIM_OPTIONS = ("D", "H", "WQ_norms", "WV_norms", "WO_norm", "variant")
_MASKED_MF = "masked mean-field constant finite, constant unknown"


def _mean_field_variant(
    variant: str, status: Status, provenance: str, section: str, help_: str, **kw: Any
) -> Bound:
    """The record ``mean_field_upper[variant]``: an upper bound taking ``A_norm, V_norm, R``."""
    name = f"mean_field_upper[{variant}]"
    return Bound(
        name, "mean_field_upper", "upper", status, provenance, section, _NORMS, help_, **kw
    )


BOUNDS: tuple[Bound, ...] = (
    # ---- √n regime: global upper bounds on B_R^n (sequences, masked too)
    Bound(
        "sqrt_n_upper", "sqrt_n_upper", "upper", _T,
        "sqrt3 constant: recollection, unverified; as a bound: " + _DER, _S1,
        (*_NORMS, "n"), "global √n-regime upper bound on B_R^n",
        options=("form", "sharp"), cli="sqrt-n-upper", cli_options=("form",),
        note="plain function; its three forms are the variants below",
    ),
    Bound(
        "sqrt_n_upper[sqrt3]", "sqrt_n_upper", "upper", _T,
        "constant a recollection of the paper's; as a bound " + _DER, _S1,
        (*_NORMS, "n"), "√n bound, √3 form", fixed={"form": "sqrt3"},
        note="constant a recollection of the paper's, as a bound derived", verified=True,
    ),
    Bound(
        "sqrt_n_upper[sharp]", "sqrt_n_upper", "upper", _T, _DER + " (ours)", _S1,
        (*_NORMS, "n"), "√n bound, sharp form", fixed={"form": "sharp"},
        note="ours, derived", verified=True,
    ),
    Bound(
        "sqrt_n_upper[triangle]", "sqrt_n_upper", "upper", _T, _DER + " (ours)", _S1,
        (*_NORMS, "n"), "√n bound, triangle form (the tightest)", fixed={"form": "triangle"},
        note="ours, derived", verified=True,
    ),
    Bound(
        "sqrt_n_constant", "sqrt_n_constant", "upper", _T, "as sqrt_n_upper", _S1,
        (*_NORMS, "n"), "√n-regime constant: sqrt_n_upper / √n, valid for every n' >= n",
        options=("form",),
    ),
    Bound(
        "multihead_upper", "multihead_upper", "upper", _T, "standard", _S1,
        ("head_bounds",), "multi-head bound from per-head bounds (sum rule by default)",
        options=("W_norms", "WO_norm", "rule"),
        note="sum rule: applied to every per-head bound of the harness",
    ),
    Bound(
        "multihead_upper[l2,triangle]", "multihead_upper", "upper", _T, "standard", _S1,
        ("head_bounds",), "multi-head bound, l2 rule over triangle √n bounds",
        options=("WO_norm",), fixed={"rule": "l2"},
        note="standard l2 rule with the triangle form of the √n bound", verified=True,
    ),
    # ---- data-dependent bounds at one sequence
    Bound(
        "certified_local", "certified_local_upper", "upper", _T, _DER, _S2,
        ("X", "heads"), "certified data-dependent upper bound on ||Df(X)|| at one sequence",
        options=("masked",), note="certified data-dependent bound (derived)", verified=True,
    ),
    Bound(
        "released_data_dependent", "released_data_dependent", "upper", "heuristic",
        "from the authors' released code; not a bound (" + _DER + ")", _S2,
        ("V_norms", "R_h", "r", "n"), "released data-dependent quantity (known not to be a bound)",
        note="from the authors' released code; known not to be a bound", verified=True,
    ),
    Bound(
        "released_data_dependent+max_Ax", "released_data_dependent", "upper", _C,
        "repair suggested by the theory notes; evidence only, no proof", _S2,
        ("V_norms", "R_h", "r", "n"), "released quantity with R_h + max_i ||A x_i||",
        note="repair (R_h + max_i ||A x_i||): evidence only, no proof", verified=True,
    ),
    # ---- mean field: sequences via Lip(f|B_R^n) <= Lip(F), measures via L_W and L_split
    Bound(
        "mean_field_upper", "mean_field_upper", "upper", _T,
        "c' >= 1: " + _DER + " (Schur-test proof); c' < 1 is not a bound; the paper's printed "
        "constants: recollection, unverified", _S17,
        _NORMS, "mean-field (W2) upper bound with exponent c' = --c", options=("c", "form"),
        cli="mean-field-upper", cli_options=("c",),
        note="plain function (default c' = 1, proved); variants below",
    ),
    _mean_field_variant(
        "c'=2", _T, "derived (Kantorovich-Rubinstein route)", _S6, "mean-field bound, c' = 2",
        fixed={"c": 2.0}, note="c'=2: derived (Kantorovich-Rubinstein route)", verified=True,
    ),
    _mean_field_variant(
        "c'=1", _T, _DER + " (Schur test with weights sqrt(a_j)); the paper's c' is unknown",
        _S17, "mean-field bound, c' = 1", fixed={"c": 1.0},
        note="c'=1: proved (Schur test, docs/theory.md §17); the paper's c' is unknown",
        verified=True,
    ),
    _mean_field_variant(
        "refined", _T, _DER + " (Schur test, rows 1 + theta)", _S17,
        "||V|| (theta + sqrt((1 + theta)(1 + 2 theta)) e^theta)", fixed={"c": 1.0, "form": "refined"},
        note="c'=1, refined Schur rows: proved (docs/theory.md §17)",
    ),
    Bound(
        "mean_field_upper_cells", "mean_field_upper_cells", "upper", _T,
        _DER + " (Schur columns bounded cell by cell; exponent score_gap_constant R^2 / 2)", _S17,
        ("A", "V", "R"), "mean-field bound with the score-gap exponent kappa R^2 / 2",
    ),
    Bound(
        "score_gap_constant", "score_gap_constant", "value", _T,
        _DER, _S17, ("A",), "upper bound on max_{|x|,|y|<=1} x^T A (y - x)",
    ),
    _mean_field_variant(
        "c'=1/2", _C, "probe below every derivation (expected to fail)", _S5,
        "mean-field form with c' = 1/2 (a probe)", fixed={"c": 0.5},
        note="probe below every derivation (the two-Dirac 'matching' case predicts failure)",
        verified=True,
    ),
    *(
        _mean_field_variant(
            f"c'={c},masked", _C, _MASKED_MF, _S4,
            f"unmasked c' = {c} form applied to masked attention", fixed={"c": float(c)},
            note=_MASKED_MF + "; applied to masked inputs", verified=True,
        )
        for c in (2, 1)
    ),
    _mean_field_variant(
        "c'=1,masked,Hardy", _C, "ours; no proof", _S4,
        "||V|| (theta + 2 (1 + 2 theta) e^theta) for masked attention",
        note="ours: interaction term of the c'=1 form times 2, the Hardy constant of the causal "
        "running average; no proof",
        verified=True, compose=_mean_field_masked_hardy,
    ),
    # ---- lower bounds at their constructions
    Bound(
        "trivial_lower", "trivial_lower", "lower", _T, "derived (elementary)", _S16,
        ("V_norm",), "trivial lower bound ||V||", cli="trivial", note="derived", verified=True,
    ),
    Bound(
        "sqrt_n_lower", "sqrt_n_lower", "lower", _T,
        "construction from the authors' released code; bound " + _DER, _S3,
        ("gamma", "n", "Vu_norm"), "eigenvector-construction lower bound", cli="sqrt-n-lower",
        note="construction from the released code, bound derived", verified=True,
    ),
    Bound(
        "masked_sqrt_n_lower", "masked_sqrt_n_lower", "lower", _T, _DER, _S4,
        ("gamma", "n", "Vu_norm"), "masked construction lower bound, saturating in n",
        cli="masked-sqrt-n-lower", note="derived", verified=True,
    ),
    Bound(
        "sequence_lower", "sequence_lower", "lower", _T, _DER + " (ours)", _S3,
        ("gamma", "n", "Vu_norm"), "k-copy construction lower bound, best k",
        note="ours (k copies), derived", verified=True,
    ),
    Bound(
        "two_dirac_lower", "two_dirac_lower", "lower", _T, _DER, _S5,
        ("gamma", "Vu_norm"), "two-Dirac lower bound at the optimal mass", options=("eps",),
        cli="two-dirac-lower", note="exact optimum (derived)", verified=True,
    ),
    Bound(
        "two_dirac_g", "two_dirac_g", "lower", _T, _DER, _S5,
        ("eps", "gamma", "Vu_norm"), "two-Dirac lower bound at a given light mass",
        note="at a given mass (derived; the harness evaluates exp(two_dirac_log_g))",
        verified=True,
    ),
    Bound(
        "two_dirac_log_g", "two_dirac_log_g", "lower", _T, _DER, _S5,
        ("log_eps", "gamma", "Vu_norm"), "logarithm of two_dirac_g, from log eps",
    ),
    Bound(
        "two_dirac_half", "two_dirac_half", "lower", _T,
        _DER + "; as the paper's form a recollection, unverified", _S5,
        ("gamma", "Vu_norm"), "two-Dirac bound at w = 1/2", cli="two-dirac-half",
        note="w = 1/2 (derived)", verified=True,
    ),
    Bound(
        "two_dirac_asymptote", "two_dirac_asymptote", "lower", _T, _DER, _S5,
        ("gamma", "Vu_norm"), "asymptote (3√3/16) γ e^{γ/2} ||Vu||, a valid lower bound",
        cli="two-dirac-asymptote", note="asymptote (derived)", verified=True,
    ),
    Bound(
        "mean_field_lower", "mean_field_lower", "lower", _T, _DER, _S5,
        ("A", "V", "R"), "global mean-field lower bound max(||V||, sup g), both cases",
        options=("Vu_norm", "variant"),
        note="global lower bound max(||V||, sup g), both cases (derived)", verified=True,
    ),
    Bound(
        "off_axis_two_atom", "off_axis_two_atom", "lower", _T,
        _DER + " (ours; not in any source)", _S5,
        ("x", "y", "h", "w", "A", "V"), "general two-atom lower bound",
        note="derived; not in any source", verified=True,
    ),
    # ---- large radius
    *(
        Bound(
            f"large_radius[limit{op}deviation]", "large_radius_limit",
            "upper" if sign > 0 else "lower", _T, _DER + " (ours)", _S7, ("X", "A", "V"),
            f"hard-max limit {word} the deviation bound", options=("masked",),
            note="limit with the deviation bound of theory.bounds (ours, derived)", verified=True,
            compose=_large_radius_band(sign),
        )
        for op, word, sign in (("+", "plus", +1), ("-", "minus", -1))
    ),
    Bound(
        "large_radius_limit", "large_radius_limit", "limit", "reported", _DER, _S7,
        ("counts", "V_norm"), "||V|| sqrt(max_j N_j), the R -> inf limit", options=("kind",),
        note="derived: ||V|| sqrt(max_j N_j), the R -> inf limit", verified=True,
    ),
    Bound(
        "large_radius_deviation", "large_radius_deviation", "value", _T, _DER + " (ours)", _S7,
        ("gap", "n", "A_norm", "V_norm", "R"),
        "bound on | ||Df(X)|| - large-radius limit | from the logit margin",
    ),
    Bound(
        "large_radius_counts", "large_radius_counts", "value", _T, _DER, _S7,
        ("X", "A"), "queries per arg-max key (N_j)", options=("masked",),
    ),
    Bound(
        "selection_gap", "selection_gap", "value", _T, _DER + " (ours)", _S7,
        ("X", "A"), "smallest logit margin of the arg-max selection", options=("masked",),
    ),
    # ---- Kim, Papamakarios & Mnih
    Bound(
        "kim_l2_upper[p=2]", "kim_l2_upper", "upper", _C, "recollection, unverified", _S8,
        ("N",), "Kim et al.'s Thm 3.2, 2-norm, as recalled",
        options=_KIM_OPTIONS, fixed={"p": 2},
        note="Kim et al. Thm 3.2 as recalled, unverified", verified=True,
    ),
    Bound(
        "kim_l2_upper[p=2,WQ^2]", "kim_l2_upper", "upper", _T,
        _DER + " (ours; proof in docs/derivations/invertible.md §2)", _S8,
        ("N",), "Kim et al.'s 2-norm form with ||W^{Q,h}|| squared",
        options=_KIM_OPTIONS, fixed={"p": 2, "wq_power": 2},
        note="ours: the p=2 form with ||W^{Q,h}||_2 squared, proved "
        "(docs/derivations/invertible.md §2)",
        verified=True,
    ),
    Bound(
        "kim_l2_upper[p=inf]", "kim_l2_upper", "upper", _C, "recollection, unverified", _S8,
        ("N",), "Kim et al.'s Thm 3.2, ∞-norm, as recalled",
        options=_KIM_OPTIONS, fixed={"p": "inf"},
        note="Kim et al. Thm 3.2 as recalled, unverified", verified=True,
    ),
    Bound(
        "kim_softmax_lemma", "kim_softmax_lemma", "upper", _T, _DER, _S8,
        ("N",), "Kim et al.'s softmax lemma W0((N-1)/e)", options=("variant",),
        cli="kim-softmax", note="derived", verified=True,
    ),
    Bound(
        "kim_softmax_lemma_mean_field", "kim_softmax_lemma_mean_field", "upper", _T, _DER, _S8,
        ("q",), "mean-field softmax lemma W0((1-q)/(q e))",
    ),
    Bound(
        "kim_l2_norms", "kim_l2_norms", "value", _T, "standard", _S8,
        ("WQ", "WV", "WO"), "per-head operator norms that kim_l2_upper takes", options=("p",),
    ),
    # ---- constructions: directions, gaps, optimal mass
    Bound(
        "rayleigh_extremes", "rayleigh_extremes", "value", _T,
        "released choice from the authors' released code; symmetric choice standard", _S3,
        ("A",), "extreme Rayleigh quotients and directions of A", options=("variant",),
    ),
    Bound(
        "construction_gap", "construction_gap", "value", _T,
        "released rule from the authors' released code; " + _DER, _S3,
        ("lam_max", "lam_min", "R"), "gap γ and case of the eigenvector construction",
        options=("rule",),
    ),
    Bound(
        "two_dirac_optimal_mass", "two_dirac_optimal_mass", "value", _T, _DER, _S5,
        ("gamma",), "exact maximiser of g over the light mass",
    ),
    # ---- Lambert W inversions
    Bound(
        "gap_for_target", "gap_for_target", "value", _T, _DER, _S9,
        ("L",), "gap γ with γ e^{γ/2} = L, i.e. 2 W0(L/2)", cli="gap-for-target",
    ),
    Bound(
        "radius_for_target", "radius_for_target", "value", _T, _DER, _S9,
        ("L", "lam", "Vu_norm"), "largest radius R for a target constant L", options=("form",),
        cli="radius-for-target", cli_options=("form",),
    ),
    Bound(
        "radius_for_upper", "radius_for_upper", "value", _T, _DER, _S9,
        ("L", "a", "b", "c"), "largest radius with a (1 + b R^2) e^{c R^2} <= L",
        options=("form",),
    ),
    # ---- mass splitting
    Bound(
        "split_gain", "split_gain", "value", _T,
        "phenomenon stated in the paper (abstract, v1); closed form " + _DER, _S10,
        ("k", "s"), "gain G_k of the duplicate-then-move attack", cli="split-gain",
    ),
    Bound(
        "split_gain_general", "split_gain_general", "value", _T, _DER, _S10,
        ("k", "r", "R", "lam"), "gain G_k with the Dirac at r u and the moved copy at R u",
    ),
    Bound(
        "optimal_split_k", "optimal_split_k", "value", _T, _DER + " (ours)", _S10,
        ("s",), "integer number of copies maximising split_gain",
    ),
    # ---- bounded logits: soft-capping, QK-norm, sliding windows
    Bound(
        "bounded_logits_upper", "bounded_logits_upper", "upper", _T, _BL, _S18,
        ("V_norm", "R", "n", "logit_bound", "grad_query", "grad_key"),
        "Lip(f|B_R^n) for logits bounded by B with gradients G_q, G_k",
        options=("masked", "window"),
    ),
    Bound(
        "bounded_logits_local_upper", "bounded_logits_local_upper", "upper", _T, _BL, _S18,
        ("X", "V", "A"), "data-dependent bound on ||Df(X)|| for capped, QK-normed or windowed heads",
        options=("Q", "K", "softcap", "scale", "q_weight", "k_weight", "eps", "masked", "window"),
    ),
    Bound(
        "softcap_logit_bound", "softcap_logit_bound", "value", _T, _BL, _S18,
        ("A_norm", "R", "kappa"), "bound kappa tanh(||A|| R^2 / kappa) on soft-capped logits",
    ),
    Bound(
        "softcap_sqrt_n_upper", "softcap_sqrt_n_upper", "upper", _T, _BL, _S18,
        (*_NORMS, "n", "kappa"), "Lip(f|B_R^n) of a soft-capped head (grows like R^2, bounded in n)",
        options=("masked", "window"),
    ),
    Bound(
        "softcap_mean_field_upper", "softcap_mean_field_upper", "upper", _T, _BL, _S18,
        (*_NORMS, "kappa"), "W2 bound ||V|| (e^B (1 + theta) + theta) of a soft-capped head",
    ),
    Bound(
        "softcap_two_token_lower", "softcap_two_token_lower", "lower", _T, _BL, _S18,
        ("a", "R", "kappa", "V_norm"), "exact ||Df|| at X = (0, R), d = 1: grows like R^2",
    ),
    Bound(
        "qk_norm_logit_bound", "qk_norm_logit_bound", "value", _T, _BL, _S18,
        (*_QK, "R", "eps", "k"), "bound on QK-normed logits (below |scale| weight_max k)",
        options=_QK_OPTIONS,
    ),
    Bound(
        "qk_norm_sqrt_n_upper", "qk_norm_sqrt_n_upper", "upper", _T, _BL, _S18,
        (*_QK, "V_norm", "R", "n", "eps", "k"),
        "Lip(f|B_R^n) of a QK-normed head (grows linearly in R, like 1/sqrt(eps))",
        options=(*_QK_OPTIONS, "masked", "window"),
    ),
    Bound(
        "qk_norm_mean_field_upper", "qk_norm_mean_field_upper", "upper", _T, _BL, _S18,
        (*_QK, "V_norm", "R", "eps", "k"), "W2 bound of a QK-normed head",
        options=_QK_OPTIONS,
    ),
    Bound(
        "qk_norm_two_token_lower", "qk_norm_two_token_lower", "lower", _T, _BL, _S18,
        (*_QK, "R", "eps"), "exact ||Df|| at X = (0, R), d = k = 1: grows like R / sqrt(eps)",
        options=("scale", "V_norm"),
    ),
    Bound(
        "window_sqrt_n_upper", "window_sqrt_n_upper", "upper", _T, _BL, _S18,
        (*_NORMS, "n", "window"), "√n-regime bound with n replaced by the window (min(n, W))",
        options=("masked",),
    ),
)  # fmt: skip

_BY_NAME: dict[str, Bound] = {b.name: b for b in BOUNDS}
if len(_BY_NAME) != len(BOUNDS):  # pragma: no cover - a registry typo
    raise RuntimeError("duplicate names in theory.bounds.registry.BOUNDS")


def get(name: str) -> Bound:
    """Return the record called ``name`` (a ``KeyError`` names the known records)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown bound {name!r}; known: {', '.join(_BY_NAME)}") from None


def by_function(function: str) -> tuple[Bound, ...]:
    """Every record evaluated by the public function ``function`` (plain and variants)."""
    return tuple(b for b in BOUNDS if b.function == function)


def verified() -> tuple[Bound, ...]:
    """The records the verification harness checks, in its report order."""
    return tuple(b for b in BOUNDS if b.verified)


def cli_bounds() -> dict[str, Bound]:
    """``meanfield bound`` names mapped to their records.

    A drop-in for a table of ``(function, args, help, options)`` entries: each returned record has
    those four attributes, ``options`` restricted to the command's (``cli_options``) and ``help``
    ending with the docs section.
    """
    return {
        b.cli: replace(b, help=f"{b.help} ({b.section})", options=b.cli_options)
        for b in BOUNDS
        if b.cli is not None
    }


def markdown_table() -> str:
    """The registry as the markdown table of docs/theory.md §15."""
    rows = ["| name | function | side | status | section |", "|---|---|---|---|---|"]
    for b in BOUNDS:
        sec = b.section.replace("docs/theory.md ", "")
        rows.append(f"| `{b.name}` | `{b.function}` | {b.side} | {b.status} | {sec} |")
    return "\n".join(rows)
