r"""The verdict rules of the report's opening table, and the words it may use.

Every row of the table in ``report.md`` ("Verdict at a glance") gets its verdict from one of the
functions below, one per kind of comparison, and the report prints :data:`RULES` under the table
(docs/experiments.md, "The verdict table"):

* :func:`compare_number`: a number the paper prints (a fitted constant, a curve) against ours;
* :func:`compare_bound`: a bound or an inequality against certified brackets of the constant;
* :func:`compare_limit`: a closed-form limit against the computed constant;
* ``"different quantity"`` and ``"stand-in"``: no comparison is made (see :data:`RULES`).

:data:`TERMS` defines, one line each, the symbols and names a row may use; the report lists those
that occur in its rows (:func:`terms_used`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from .engine import Claim, Claims

__all__ = [
    "Claim",
    "Claims",
    "LIMIT_TOLERANCE",
    "NUMBER_TOLERANCE",
    "RULES",
    "SQRT_N_TOLERANCE",
    "TERMS",
    "VERDICTS",
    "compare_bound",
    "compare_limit",
    "compare_number",
    "plain_configuration",
    "relative_gap",
    "terms_used",
]

#: Every verdict the table may show.
VERDICTS = (
    "reproduced",
    "not reproduced",
    "refuted",
    "refuted (released code)",
    "no counterexample (released code)",
    "different quantity",
    "stand-in",
)

#: A number of the paper is reproduced when ours is within this relative gap of it (for a curve:
#: at every measured n).
NUMBER_TOLERANCE = 0.05

#: A √n constant is fitted only where the free log–log exponent is within this distance of 1/2.
SQRT_N_TOLERANCE = 0.1

#: A closed-form limit is reproduced when the computed constant matches it to this relative error.
LIMIT_TOLERANCE = 1e-6


def relative_gap(ours: float, paper: float) -> float:
    """``|ours / paper - 1|``; ``inf`` when either is not a finite number or ``paper`` is 0."""
    try:
        ours, paper = float(ours), float(paper)
    except (TypeError, ValueError):
        return math.inf
    if not (math.isfinite(ours) and math.isfinite(paper)) or paper == 0.0:
        return math.inf
    return abs(ours / paper - 1.0)


def compare_number(gap: float | None, *, same_model: bool, same_quantity: bool = True) -> str:
    """Rule 1 (and rule 4): a number of the paper against ours.

    Parameters
    ----------
    gap : float or None
        The relative gap ``|ours / paper - 1|`` (for a curve, the largest over the measured n);
        ``None`` when we have no comparable number (e.g. no √n growth, hence no √n constant).
    same_model : bool
        Whether our model is the paper's own (same architecture and initialisation). Otherwise
        the row is a stand-in and nothing is compared.
    same_quantity : bool
        Whether the paper's number measures what we measure. The paper's numbers on real models
        were read off the authors' released estimator (√‖Jᵀf‖, not a Lipschitz constant): ours
        of ‖J‖₂ are then a *different quantity* and nothing is compared either.
    """
    if not same_model:
        return "stand-in"
    if not same_quantity:
        return "different quantity"
    if gap is None or not math.isfinite(gap):
        return "not reproduced"
    return "reproduced" if gap <= NUMBER_TOLERANCE else "not reproduced"


def compare_bound(n_violations: int, n_checked: int, *, released_code: bool = False) -> str:
    """Rule 2: a bound against certified brackets of the constant.

    A violation is a certified bracket entirely on the wrong side of the bound (so rounding can not
    cause one). ``released_code``: the bound is the authors' released code's, not the paper's.
    """
    if n_violations:
        return "refuted (released code)" if released_code else "refuted"
    if n_checked <= 0:
        return "not reproduced"
    return "no counterexample (released code)" if released_code else "reproduced"


def compare_limit(rel_error: float | None, *, bound_holds: bool = True) -> str:
    """Rule 3: a closed-form limit against the computed constant (largest relative error)."""
    if rel_error is None or not math.isfinite(rel_error) or not bound_holds:
        return "not reproduced"
    return "reproduced" if rel_error <= LIMIT_TOLERANCE else "not reproduced"


def _power_of_ten(x: float) -> str:
    """``1e-06`` → ``10⁻⁶`` (for the printed rules)."""
    e = round(math.log10(x))
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    return f"10{str(e).translate(sup)}" if math.isclose(x, 10.0**e) else f"{x:g}"


#: The rules, as printed under the table.
RULES = (
    "**Rules.** One rule per kind of comparison, applied to every row:",
    f"1. *A number of the paper* (a fitted constant or curve): **reproduced** when ours is within "
    f"{100 * NUMBER_TOLERANCE:g} % of the paper's (a curve: at every measured n), on the paper's "
    "own model; otherwise **not reproduced**. A √n constant exists only where the free exponent "
    f"is within {SQRT_N_TOLERANCE:g} of 1/2.",
    "2. *A bound or inequality*: **refuted** when at least one certified bracket lies entirely on "
    "the wrong side of it, otherwise **reproduced** (a bound of the authors' released code that "
    "survives reads *no counterexample*).",
    f"3. *A limit*: **reproduced** when the computed constant matches the formula to "
    f"{_power_of_ten(LIMIT_TOLERANCE)} relative error.",
    "4. No comparison: **different quantity** when the paper's number measures something other "
    "than its claim (the released estimator, not the Lipschitz constant); **stand-in** when our "
    "model is not the paper's (offline substitutes), so its numbers are shown but not compared.",
)

#: One-line definitions of the symbols and names a row may use, in the order printed.
TERMS: Mapping[str, str] = MappingProxyType(
    {
        "n": "number of tokens (the sequence length).",
        "R": "radius of the ball holding the input tokens (the largest token norm).",
        "‖J‖₂": "the local Lipschitz constant of the attention layer at the input X: the spectral "
        "norm of its Jacobian J.",
        "√‖Jᵀf‖": "what the authors' released estimator returns instead of ‖J‖₂ (a bug: it applies "
        "Jᵀ to the layer's output f(X)); not a Lipschitz constant.",
        "c·n^α": "power law fitted by least squares in log–log coordinates; α is its exponent, "
        "given with a 95 % bootstrap interval.",
        "C·√n": "the power law with α = 1/2, fitted through the origin; C is its constant.",
        "free α": "the exponent of the unconstrained power-law fit: it says whether a √n constant "
        "describes the data.",
        "authors' construction": "the released code's adversarial input: one token plus n−1 "
        "copies of another, along a real eigenvector of one head's score matrix A.",
        "symmetrised construction": "the same input along an extreme eigenvector of (A + Aᵀ)/2 "
        "(ours; it always exists and its gap is at least as large).",
        "γ": "the score gap of that input: each copy's score for the lone token minus its score "
        "for a copy; the constant peaks near n ≈ e^γ (within a factor 3).",
        "A, V": "a head's score matrix (score of query i on key j: xᵢᵀ A xⱼ) and value matrix; "
        "‖·‖₂ is the spectral norm.",
        "sup_ε g": "the two-point lower bound: the largest constant over measures with two atoms "
        "of masses 1−ε and ε, maximised over ε.",
        "c′": "the constant in the exponent of the mean-field upper bound, of the form "
        "‖V‖₂(1 + 3‖A‖₂R²)·exp(c′‖A‖₂R²); the paper's value was not available to us; c′ = 1 is "
        "ours, proved in docs/theory.md §17.",
        "N_j": "at large R each token attends to one token only; N_j counts the tokens that "
        "attend to token j.",
        "certified bracket": "an interval [lower, upper] proved to contain the exact constant, "
        "rounding errors included.",
        "R_h": "the data term of the released bound for head h: the largest ‖Aᵀxᵢ‖ over the "
        "tokens (the code's matrix, KᵀQ/√k for query and key maps Q and K of width k, is Aᵀ).",
    }
)

#: What in a row's text calls for a term (default: the term itself).
_TRIGGERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "c·n^α": ("n^α", "n^0", "n^-", "n^(1/4)"),
        "A, V": ("‖A‖", "‖V‖", "score matrix"),
    }
)


def terms_used(texts: Iterable[str]) -> list[str]:
    """The keys of :data:`TERMS` that occur in ``texts`` (one letter: as a symbol, not in a word)."""
    joined = "\n".join(texts)
    found = []
    for key in TERMS:
        if len(key) == 1:
            hit = _symbol_in(key, joined)
        else:
            hit = any(t in joined for t in _TRIGGERS.get(key, (key,)))
        if hit:
            found.append(key)
    return found


def _symbol_in(sym: str, text: str) -> bool:
    """Whether the one-letter symbol ``sym`` occurs in ``text`` as a symbol, not inside a word."""
    for i, ch in enumerate(text):
        if ch != sym:
            continue
        before = text[i - 1] if i else " "
        after = text[i + 1] if i + 1 < len(text) else " "
        if not (before.isalpha() or after.isalpha()):
            return True
    return False


#: The paper's configuration names in plain words.
_PAPER_MODELS = {
    "BERT-enc": "pretrained BERT encoder",
    "BERT-dec": "pretrained BERT run as a decoder",
    "GPT-2-rand": "randomly initialised GPT-2",
    "GPT-2": "pretrained GPT-2",
}


def plain_configuration(name: str) -> str:
    """``"GPT-2-rand L6"`` → ``"randomly initialised GPT-2, layer 6"`` (the paper's labels)."""
    base = name.split(" (")[0]
    model, _, layer = base.rpartition(" L")
    if not model or not layer.isdigit():
        return _PAPER_MODELS.get(base, base)
    return f"{_PAPER_MODELS.get(model, model)}, layer {layer}"
