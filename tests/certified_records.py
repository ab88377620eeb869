"""Records of two runs that are not the same computation, compared through what it guarantees.

Two runs compute the same floats only where they run the same code on the same inputs with the
same thread counts and the same batch composition; there the tests compare records for equality.
Where the thread counts or the batches differ, the BLAS reductions are ordered differently and
the iterative solver can stop a step earlier or later, so floats differ by more than rounding and
iteration counts differ. The fields of a record are then compared by what the computation
guarantees, never by a small fixed tolerance:

* ``lower``, ``upper`` and ``upper_prob`` are certified ends of ``||J||`` at the same inputs
  (docs/rounding.md §4; ``upper_prob`` with probability at least ``1 - delta`` over the seeded
  start, so a failure is a bug, as in tests/meanfield/test_rigour.py): the brackets of the two runs overlap.
* ``value`` is the Ritz value ``||Ĵv||/||v||`` of the operator ``Ĵ`` the run evaluated. Its
  lower end is ``value`` less a certified bound ``m`` on the rounding of that product
  (docs/rounding.md §4.1), so ``value <= ||J|| + m``. Where a run converged on the residual rule
  ``||ĴᵀĴv - s²v|| <= tol s²``, ``s²`` is within ``tol s²`` of an eigenvalue of ``ĴᵀĴ``, the top
  one from a random start (docs/rounding.md §7), and ``||J|| <= s sqrt(1 + tol) + m``, ``Ĵ``
  being within the products' rounding of ``J``. For runs ``a`` and ``b`` of the same inputs::

      value_a <= min(upper_b, upper_prob_b) + m                 (value within b's bracket)
      lower_a <= value_b sqrt(1 + tol) + m                      (b converged)
      |value_a - value_b| <= (sqrt(1 + tol) - 1) max(value) + 2 m    (both converged)

  ``sqrt(1 + tol) - 1 <= tol / 2``: the solver's tolerance, relative; ``m`` is the products'
  rounding (the relative allowance of tests/meanfield/test_rigour.py, "tol plus the bracket's own relative
  width"). ``m`` is the smaller of the two runs' ``value - lower`` at that window, so that a value
  never enters its own allowance (:func:`margins`). A run that stopped on another rule (a
  recorded ``stop_rule`` such as ``"width"``) is held to the brackets alone, which are then what
  bounds its value.
* ``converged``, ``n_iter``, ``n_matvec`` and ``residual`` describe where each run's iteration
  stopped: no bound ties two runs' counts (a few steps is no derivable number), so they are only
  checked to be well formed (counts positive, at most ``max_iter`` where it is set; residuals
  not NaN and non-negative).
* Every other float field is a direct evaluation (no iteration) at the same windows; two runs
  differ by the rounding of that evaluation: ``eval_rtol`` (what the caller derives for the
  inputs' own computation, e.g. a float32 forward pass) plus ``2 m / value`` of the same window
  (the layer's float64 evaluation error at those inputs, for each of the two runs).
  Fields named in ``exact`` are the same computation in both runs and must be equal.
* Everything else (names, settings, keys, points, integer settings) is equal.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments.engine import record_float

#: Unit roundoff of the dtypes a record may name (round to nearest).
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}

#: The certified ends and the estimate; the solver's own state; its counts.
BRACKET_FIELDS = ("value", "lower", "upper", "upper_prob")
SOLVER_STATE = ("residual", "converged")
SOLVER_COUNTS = ("n_iter", "n_matvec")


def gamma(k: int, u: float) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)``: the relative error bound of a sum of ``k`` terms."""
    if k * u >= 1:
        return math.inf
    return k * u / (1 - k * u)


@dataclass(frozen=True)
class Guarantees:
    """What the computation behind a record guarantees (from the run's stored settings).

    Attributes
    ----------
    tol : float
        The solver's relative residual tolerance.
    max_iter : int or None
        The solver's iteration cap; ``None``: the library's default (not checked).
    eval_rtol : float
        Relative rounding of a direct evaluation between the two runs, beyond the layer's own
        evaluation margins (0 where the inputs are the same computation in both runs).
    exact : collection of str
        Float fields computed the same way in both runs: compared for equality.
    """

    tol: float
    max_iter: int | None = None
    eval_rtol: float = 0.0
    exact: Collection[str] = ()


def _floats(v: Any) -> np.ndarray:
    vals = v if isinstance(v, list) else [v]
    return np.array([record_float(x) for x in vals], dtype=np.float64)


def _is_float_field(v: Any) -> bool:
    """A float, or a list of floats (``None``, ``"inf"``, ``"-inf"``: stored non-finite ones)."""
    if isinstance(v, float):
        return True
    if not isinstance(v, list) or not v:
        return False
    ok = all(isinstance(x, float) or x is None or x in ("inf", "-inf") for x in v)
    return ok and any(isinstance(x, float) for x in v)


def _per_window(rec: Mapping[str, Any], field: str, n: int, default: Any) -> list[Any]:
    if field not in rec:
        return [default] * n
    v = rec[field]
    return list(v) if isinstance(v, list) else [v] * n


#: Stopping rules under which ``converged`` means the residual rule holds: ``"residual"``, and
#: ``"dense"`` (an SVD of the assembled operator: its value is that operator's norm).
RESIDUAL_RULES = ("residual", "dense")


def _residual_rule(rec: Mapping[str, Any], n: int) -> np.ndarray:
    """Per window: converged, on the residual rule (not on another stopping rule, if recorded)."""
    conv = np.array(_per_window(rec, "converged", n, False), dtype=bool)
    rule = _per_window(rec, "stop_rule", n, "residual")
    return conv & np.array([r in RESIDUAL_RULES for r in rule], dtype=bool)


def _check_solver_fields(rec: Mapping[str, Any], g: Guarantees, where: str) -> None:
    for field in SOLVER_COUNTS:
        if field not in rec:
            continue
        counts = rec[field] if isinstance(rec[field], list) else [rec[field]]
        assert all(isinstance(c, int) and not isinstance(c, bool) for c in counts), (where, field)
        if rec.get("method") in ("lanczos", "power"):
            assert all(c >= 1 for c in counts), (where, field, counts)
        else:
            assert all(c >= 0 for c in counts), (where, field, counts)
        if field == "n_iter" and g.max_iter is not None:
            assert all(c <= g.max_iter for c in counts), (where, field, counts, g.max_iter)
    if "converged" in rec:
        conv = rec["converged"] if isinstance(rec["converged"], list) else [rec["converged"]]
        assert all(isinstance(c, bool) for c in conv), (where, "converged")
    if "residual" in rec:
        res = _floats(rec["residual"])
        assert not np.isnan(res).any() and (res >= 0).all(), (where, "residual", res)


def _ends(rec: Mapping[str, Any], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Value, lower end and the smaller upper end (``upper``, ``upper_prob``) per window."""
    v = _floats(rec["value"])
    lo = _floats(rec["lower"]) if "lower" in rec else np.zeros(n)
    up = _floats(rec["upper"]) if "upper" in rec else np.full(n, math.inf)
    if rec.get("upper_prob") is not None:
        up = np.fmin(up, _floats(rec["upper_prob"]))  # a stored NaN (None) leaves upper
    return v, lo, up


def margins(a: Mapping[str, Any], b: Mapping[str, Any]) -> np.ndarray:
    """Per window, the products' rounding margin ``m`` of the two runs (absolute).

    Each run's ``value - lower`` bounds the rounding of its product ``Jv`` (docs/rounding.md
    §4.1); for two runs at the same inputs converged near the same top vector both bound the
    same rounding, and the smaller one is used for both, so that a run's value never enters its
    own allowance (a wrong value would widen its own ``value - lower``).
    """
    va, la, _ = _ends(a, len(_floats(a["value"])))
    vb, lb, _ = _ends(b, va.size)
    return np.minimum(np.maximum(va - la, 0.0), np.maximum(vb - lb, 0.0))


def _check_brackets(a: Mapping[str, Any], b: Mapping[str, Any], g: Guarantees, where: str) -> None:
    n = _floats(a["value"]).size
    assert _floats(b["value"]).size == n, (where, "value")
    (va, la, ua), (vb, lb, ub) = _ends(a, n), _ends(b, n)
    for arr in (va, la, ua, vb, lb, ub):
        assert not np.isnan(arr).any(), (where, arr)
    m = margins(a, b)
    grow = math.sqrt(1.0 + g.tol)
    conv_a, conv_b = _residual_rule(a, n), _residual_rule(b, n)
    # certified: both brackets contain ||J|| of the same inputs
    ok = np.maximum(la, lb) <= np.minimum(ua, ub)
    assert ok.all(), f"{where}: brackets do not overlap: a [{la}, {ua}], b [{lb}, {ub}]"
    for (v1, l1), (v2, u2, c2), tag in (
        ((va, la), (vb, ub, conv_b), "a vs b"),
        ((vb, lb), (va, ua, conv_a), "b vs a"),
    ):
        # a Ritz value is at most ||J|| plus its product's rounding
        ok = v1 <= u2 + m
        assert ok.all(), f"{where} {tag}: value {v1} above the other upper end {u2} (+ {m})"
        # the other run, converged on the residual rule: ||J|| <= its value sqrt(1 + tol) + m
        ok = ~c2 | (l1 <= v2 * grow + m)
        assert ok.all(), f"{where} {tag}: lower {l1} above the other value {v2} (tol {g.tol})"
    both = conv_a & conv_b
    ok = ~both | (np.abs(va - vb) <= (grow - 1) * np.maximum(va, vb) + 2 * m)
    assert ok.all(), (
        f"{where}: values {va} and {vb} differ by more than tol {g.tol} (relative "
        f"{grow - 1:.3g}) and twice the rounding margins {m}"
    )


def compare_records(a: Mapping[str, Any], b: Mapping[str, Any], g: Guarantees, where: str) -> None:
    """One point's records of two runs, by the guarantees ``g`` (see the module docstring)."""
    assert a.keys() == b.keys(), (where, sorted(a.keys() ^ b.keys()))
    for rec in (a, b):
        _check_solver_fields(rec, g, where)
    rel_margins = None
    if "value" in a:
        _check_brackets(a, b, g, where)
        top = np.maximum(_floats(a["value"]), _floats(b["value"]))
        with np.errstate(divide="ignore", invalid="ignore"):
            # the layer's float64 evaluation error at each window, relative, for both runs
            rel_margins = np.where(top > 0, 2 * margins(a, b) / top, math.inf)
    handled = {*BRACKET_FIELDS, *SOLVER_STATE, *SOLVER_COUNTS}
    for field, v in a.items():
        w = b[field]
        if field in handled:
            continue
        if field in g.exact or not (_is_float_field(v) and _is_float_field(w)):
            assert w == v, (where, field, v, w)
            continue
        x, y = _floats(v), _floats(w)
        assert x.shape == y.shape, (where, field)
        assert (np.isnan(x) == np.isnan(y)).all() and (np.isinf(x) == np.isinf(y)).all(), (
            where,
            field,
        )
        rtol = np.full(x.shape, g.eval_rtol)
        if rel_margins is not None:
            rtol = rtol + (rel_margins if rel_margins.shape == x.shape else rel_margins.max())
        fin = np.isfinite(x)
        ok = np.abs(x[fin] - y[fin]) <= rtol[fin] * np.maximum(np.abs(x[fin]), np.abs(y[fin]))
        assert ok.all(), f"{where} {field}: {v} vs {w} beyond relative {rtol}"
        assert (x[~fin] == y[~fin]).all(), (where, field)


def compare_runs(
    s: Mapping[str, Mapping[str, Mapping[str, Any]]],
    d: Mapping[str, Mapping[str, Mapping[str, Any]]],
    guarantees: Mapping[str, Guarantees],
) -> None:
    """Every file's records (file -> key -> record) of two runs; ``guarantees`` per file."""
    assert s.keys() == d.keys()
    for name in s:
        assert s[name].keys() == d[name].keys(), name
        for key, rec in s[name].items():
            compare_records(rec, d[name][key], guarantees[name], f"{name} {key}")


def estimate_record(est: Any, index: int | None = None) -> dict[str, Any]:
    """A :class:`~meanfield.lipschitz.LipschitzEstimate` (one batch member: ``index``) as a record.

    Its tensor fields become lists of one value per input, its strings stay, and a field the
    estimate does not have (``upper_prob`` without ``delta``, ``stop_rule`` in older versions) is
    left out, so that :func:`compare_records` compares two estimates field by field.
    """
    rec: dict[str, Any] = {}
    for field in (*BRACKET_FIELDS, *SOLVER_STATE, *SOLVER_COUNTS, "method", "geometry",
                  "upper_method", "stop_rule"):  # fmt: skip
        v = getattr(est, field, None)
        if v is None:
            continue
        if hasattr(v, "tolist"):
            v = v if index is None else v[index]
            v = v.detach().cpu().reshape(-1).tolist()
        rec[field] = v
    return rec
