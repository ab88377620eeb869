r"""Which regime applies, and the thresholds between regimes.

Three regimes (docs/theory.md §1–§7 and §12):

* **√n regime** — for :math:`n < n^*` the √n upper bound (docs/theory.md §1) is below the
  mean-field upper bound (docs/theory.md §6), and the eigenvector construction (docs/theory.md §3)
  grows like :math:`\sqrt n` up to its peak at
  :math:`n - 1 \approx t^*(\gamma)e^\gamma`, :math:`t^* \to 3`;
* **mean-field regime** — for :math:`n \ge n^*` the :math:`n`-free mean-field bound is the smaller
  one,
  and the worst case saturates at the mean-field constant (bracketed by :math:`\sup_\varepsilon g`
  and
  the upper bound);
* **large-radius regime** — for a *given* input whose arg-max keys are separated by a logit margin
  :math:`\Delta` with :math:`(n - 1)e^{-\Delta}` small, the local constant is within
  :func:`theory.bounds.large_radius_deviation` of its hard-max limit :math:`\|V\|_2\sqrt{\max_jN_j}`
  (docs/theory.md §7): the worst cases above have measure zero.

Defaults: the gap is the worst case over matrices of norm :math:`\|A\|_2`,
:math:`\gamma = 2\|A\|_2R^2` (when :math:`-\|A\|_2` is an eigenvalue), and
:math:`\|Vu\|_2 = \|V\|_2`
(exact when :math:`V` is a multiple of an isometry); pass ``gamma`` and ``Vu_norm`` for a specific
head. Provenance of every threshold: *derived* (docs/theory.md §12) and checked numerically in the
tests; none is the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from theory import bounds
from theory.bounds._common import as_result, exp_or_log, norm_theta, quiet_log

__all__ = ["RadiusBracket", "Regime", "classify", "crossover_n", "peak_n", "radius_bracket"]


def crossover_n(
    A_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    *,
    c: float = 1.0,
    form: Literal["sqrt3", "sharp", "triangle"] = "triangle",
    mf_form: Literal["sharp", "simple"] = "sharp",
    log: bool = False,
) -> Any:
    r"""Crossover :math:`n^*` at which the √n upper bound equals the mean-field upper bound.

    With :math:`\theta = \|A\|_2R^2` and :math:`M = \text{mean-field bound}/\|V\|_2`
    (:math:`\theta + (1 + 2\theta)e^{c\theta}` or :math:`(1 + 3\theta)e^{c\theta}`):

    * ``"triangle"``: :math:`n^* = \big((M - \theta)/(1 + \theta)\big)^2`, e.g.
      :math:`\big((1 + 2\theta)e^{c\theta}/(1 + \theta)\big)^2` with the sharp mean-field form;
    * ``"sqrt3"``: :math:`n^* = (M^2/3 - \theta^2)/(4\theta^2 + 1)`;
    * ``"sharp"``: :math:`n^* = (M^2/3 - \theta^2)/(\theta^2 + 1)`.

    Parameters
    ----------
    A_norm, V_norm, R : array_like
        :math:`\|A\|_2`, :math:`\|V\|_2` (cancels; validated only), radius.
    c : float
        Exponent coefficient :math:`c'` of the mean-field bound.
    form : {"sqrt3", "sharp", "triangle"}
        Form of the √n bound.
    mf_form : {"sharp", "simple"}
        Form of the mean-field bound.
    log : bool
        Return :math:`\log n^*` (:math:`n^* \approx e^{2c\theta}` overflows for
        :math:`\theta \gtrsim 355/c`).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`n^*` (real; the √n bound is the smaller one exactly for :math:`n < n^*`). It can be
        below
        1, in which case the mean-field bound wins for every :math:`n`.

    Notes
    -----
    Closed forms derived by :func:`theory.symbolic.sqrt_n_mean_field_crossover`. The expected
    growth :math:`n^* \sim e^{2\|A\|R^2}` up to polynomial factors (docs/theory.md §12) is
    consistent with these for :math:`c = 1`. Provenance: *derived and checked numerically*.
    """
    if form not in ("sqrt3", "sharp", "triangle"):
        raise ValueError(f"form must be 'sqrt3', 'sharp' or 'triangle', got {form!r}")
    if mf_form not in ("sharp", "simple"):
        raise ValueError(f"mf_form must be 'sharp' or 'simple', got {mf_form!r}")
    log_M = np.asarray(bounds.mean_field_upper(A_norm, 1.0, R, c=c, form=mf_form, log=True))
    _, theta = norm_theta(A_norm, V_norm, R)  # validates V_norm too
    log_theta = quiet_log(theta)
    if form == "triangle":
        # M - theta, computed from log M without cancellation issues for large M.
        log_M_minus = log_M + np.log1p(-np.exp(np.minimum(log_theta - log_M, 0.0)))
        log_n = 2.0 * (log_M_minus - np.log1p(theta))
    else:
        denom = 4.0 * theta**2 + 1.0 if form == "sqrt3" else theta**2 + 1.0
        # M^2/3 - theta^2 > 0 since M >= 1 + 3 theta.
        log_num = 2.0 * log_M - np.log(3.0)
        log_num = log_num + np.log1p(-np.exp(np.minimum(2.0 * log_theta - log_num, 0.0)))
        log_n = log_num - np.log(denom)
    return exp_or_log(log_n, log)


def peak_n(gamma: ArrayLike) -> Any:
    r"""Integer :math:`n \ge 1` maximising :func:`theory.bounds.sqrt_n_lower` at gap :math:`\gamma`.

    With :math:`n - 1 = te^\gamma`, the bound is :math:`e^{\gamma/2}\varphi(t)`,
    :math:`\varphi(t) = \frac{\sqrt t}{1 + t}\big(1 + \frac{\gamma t}{1 + t}\big)`, log-concave with
    its
    maximum at the positive root of :math:`(1 + \gamma)t^2 - 3\gamma t - 1 = 0`,

    .. math:: t^*(\gamma) = \frac{3\gamma + \sqrt{9\gamma^2 + 4\gamma + 4}}{2(1 + \gamma)} \in [1,
    3),

    so the peak is at :math:`n = 1 + t^*e^\gamma` rounded to the better neighbouring integer.

    Parameters
    ----------
    gamma : array_like
        Gap :math:`\gamma \ge 0`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The maximiser as a float (an exact integer while :math:`t^*e^\gamma < 2^{52}`; ``inf`` once
        :math:`e^\gamma` overflows).

    Notes
    -----
    The bound is expected to peak at :math:`n` of order :math:`e^\gamma` (docs/theory.md §3,
    "Peak"); here :math:`n^* - 1 \to 3e^\gamma`. Derived symbolically by
    :func:`theory.symbolic.construction_peak`.
    Provenance: *derived and checked numerically* (brute force over :math:`n` in the tests).
    """
    g = np.asarray(gamma, dtype=np.float64)
    if np.isnan(g).any() or (g < 0).any() or np.isinf(g).any():
        raise ValueError("gamma must be finite and >= 0")
    t_star = (3.0 * g + np.sqrt(9.0 * g**2 + 4.0 * g + 4.0)) / (2.0 * (1.0 + g))
    with np.errstate(over="ignore"):
        n_cont = 1.0 + t_star * np.exp(g)
    best_n = np.ones_like(g)
    best = np.zeros_like(g)
    for cand in (np.floor(n_cont), np.ceil(n_cont)):
        cand = np.maximum(cand, 1.0)
        finite = np.isfinite(cand)
        val = np.where(finite, bounds.sqrt_n_lower(g, np.where(finite, cand, 2.0)), np.inf)
        better = val > best
        best_n = np.where(better, cand, best_n)
        best = np.where(better, val, best)
    return as_result(best_n)


@dataclass(frozen=True)
class Regime:
    r"""Regime of :math:`(\|A\|_2, \|V\|_2, R, n)` with the bounds and thresholds behind it.

    Attributes
    ----------
    A_norm, V_norm, R, n, c : float
        Inputs (``c`` = exponent coefficient :math:`c'` of the mean-field bound).
    gamma, Vu_norm : float
        Gap and :math:`\|Vu\|_2` used by the lower bounds.
    regime : str
        ``"sqrt-n"``, ``"mean-field"`` or ``"large-radius"``.
    sqrt_n_upper : float
        √n bound, triangle form (the tightest of docs/theory.md §1).
    mean_field_upper : float
        Mean-field bound, sharp form with exponent ``c`` (``inf`` on overflow).
    upper : float
        The smaller of the two: an upper bound on :math:`\mathrm{Lip}(f\,|\,B_R^n)`.
    lower : float
        :math:`\max(\|V\|_2, \max_k g(k/n))` (:func:`theory.bounds.sequence_lower`): a lower bound
        on
        :math:`\mathrm{Lip}(f\,|\,B_R^n)` when some unit :math:`u` has the assumed
        :math:`u^\top Au` and :math:`\|Vu\|`.
    mean_field_lower : float
        :math:`\max(\|V\|_2, \sup_\varepsilon g)`, lower bound on the mean-field constant.
    n_star : float
        Crossover :func:`crossover_n` (triangle and sharp forms).
    n_peak : float
        :func:`peak_n` of the single-token construction at ``gamma``.
    margin, deviation : float or None
        With a logit margin given: the margin and the bound of
        :func:`theory.bounds.large_radius_deviation` on the distance to the hard-max limit.
    """

    A_norm: float
    V_norm: float
    R: float
    n: float
    c: float
    gamma: float
    Vu_norm: float
    regime: str
    sqrt_n_upper: float
    mean_field_upper: float
    upper: float
    lower: float
    mean_field_lower: float
    n_star: float
    n_peak: float
    margin: float | None = None
    deviation: float | None = None

    def explain(self) -> str:
        """Short human-readable account of the regime and its thresholds.

        Returns
        -------
        str
            A few lines.
        """
        lines = [
            f"regime: {self.regime} (||A||={self.A_norm:g}, ||V||={self.V_norm:g}, R={self.R:g}, "
            f"n={self.n:g}, c'={self.c:g})",
            f"crossover n* = {self.n_star:.4g}: the sqrt(n) bound {self.sqrt_n_upper:.4g} is "
            + ("below" if self.sqrt_n_upper < self.mean_field_upper else "above")
            + f" the mean-field bound {self.mean_field_upper:.4g}",
            f"bracket for Lip(f | B_R^n): [{self.lower:.4g}, {self.upper:.4g}]; "
            f"mean-field constant >= {self.mean_field_lower:.4g}",
            f"single-token construction (gamma={self.gamma:.4g}) peaks at n = {self.n_peak:.4g}",
        ]
        if self.deviation is not None:
            lines.append(
                f"given margin {self.margin:.4g}: |local constant - ||V|| sqrt(max N_j)| <= "
                f"{self.deviation:.3g}"
            )
        return "\n".join(lines)


def classify(
    A_norm: float,
    V_norm: float,
    R: float,
    n: float,
    *,
    c: float = 1.0,
    gamma: float | None = None,
    Vu_norm: float | None = None,
    margin: float | None = None,
    tol: float = 0.05,
) -> Regime:
    r"""Classify :math:`(\|A\|_2, \|V\|_2, R, n)` into a regime.

    Rules: with a ``margin`` given and :func:`theory.bounds.large_radius_deviation` at most
    ``tol * V_norm``, ``"large-radius"`` (the local constant of that input is within that distance
    of
    :math:`\|V\|_2\sqrt{\max_jN_j}`); otherwise ``"sqrt-n"`` if :math:`n < n^*`, else
    ``"mean-field"``.

    Parameters
    ----------
    A_norm, V_norm, R : float
        :math:`\|A\|_2`, :math:`\|V\|_2`, radius.
    n : float
        Number of tokens :math:`\ge 1`.
    c : float
        Exponent coefficient :math:`c'` of the mean-field bound.
    gamma : float, optional
        Gap of the constructions; default :math:`2\|A\|_2R^2` (worst case over :math:`A` of that
        norm).
    Vu_norm : float, optional
        :math:`\|Vu\|_2`; default ``V_norm``.
    margin : float, optional
        Smallest logit margin :math:`\Delta` of a specific input
        (:func:`theory.bounds.selection_gap`).
    tol : float
        Relative tolerance of the large-radius test.

    Returns
    -------
    Regime
    """
    for name, val in (("A_norm", A_norm), ("V_norm", V_norm), ("R", R)):
        if not np.isfinite(val) or val < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {val!r}")
    if not n >= 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    g = 2.0 * A_norm * R**2 if gamma is None else float(gamma)
    vu = float(V_norm if Vu_norm is None else Vu_norm)
    sq = float(bounds.sqrt_n_upper(A_norm, V_norm, R, n, form="triangle"))
    mf = float(bounds.mean_field_upper(A_norm, V_norm, R, c=c))
    lower = max(float(V_norm), float(bounds.sequence_lower(g, np.floor(n), vu)))
    mf_lower = max(float(V_norm), float(bounds.two_dirac_lower(g, vu)))
    n_star = float(crossover_n(A_norm, V_norm, R, c=c))
    deviation = None
    regime = "sqrt-n" if n < n_star else "mean-field"
    if margin is not None:
        deviation = float(bounds.large_radius_deviation(margin, n, A_norm, V_norm, R))
        if deviation <= tol * V_norm:
            regime = "large-radius"
    return Regime(
        A_norm=float(A_norm),
        V_norm=float(V_norm),
        R=float(R),
        n=float(n),
        c=float(c),
        gamma=g,
        Vu_norm=vu,
        regime=regime,
        sqrt_n_upper=sq,
        mean_field_upper=mf,
        upper=min(sq, mf),
        lower=lower,
        mean_field_lower=mf_lower,
        n_star=n_star,
        n_peak=float(peak_n(g)),
        margin=None if margin is None else float(margin),
        deviation=deviation,
    )


@dataclass(frozen=True)
class RadiusBracket:
    r"""Radii bracketing where the mean-field constant crosses a target :math:`L`.

    Attributes
    ----------
    L : float
        Target constant.
    R_certified : float
        Largest radius at which the mean-field upper bound (sharp form, exponent ``c``) is
        :math:`\le L`: for :math:`R \le R_{\mathrm{certified}}` every input has constant
        :math:`\le L`.
        NaN if :math:`L < \|V\|_2`.
    R_violated : float
        Radius beyond which the two-Dirac lower bound exceeds :math:`L`
        (:func:`theory.bounds.radius_for_target`, exact form); 0 if :math:`L < \|V\|_2` (trivial
        bound).
    c : float
        Exponent coefficient used.
    """

    L: float
    R_certified: float
    R_violated: float
    c: float

    def explain(self) -> str:
        """One-paragraph account of the bracket.

        Returns
        -------
        str
        """
        return (
            f"target L={self.L:g}: certified up to R={self.R_certified:.4g} "
            f"(upper bound, c'={self.c:g}); impossible beyond R={self.R_violated:.4g} "
            "(two-Dirac lower bound); undetermined between."
        )


def _mean_field_radius(L: float, A_norm: float, V_norm: float, c: float) -> float:
    """Largest R with V (theta + (1 + 2 theta) e^{c theta}) <= L, theta = ||A|| R^2 (bisection)."""
    if L < V_norm:
        return float("nan")
    if A_norm == 0:
        return float("inf")
    # Bracket in theta: simple form >= sharp form >= V (1 + 2 theta) e^{c theta}.
    lo = float(bounds.radius_for_upper(L, V_norm, 3.0, c)) ** 2
    hi = float(bounds.radius_for_upper(L, V_norm, 2.0, c)) ** 2
    log_L = np.log(L)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if bounds.mean_field_upper(1.0, V_norm, np.sqrt(mid), c=c, log=True) <= log_L:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return float(np.sqrt(lo / A_norm))


def radius_bracket(
    L: float,
    A_norm: float,
    V_norm: float,
    *,
    c: float = 1.0,
    lam: float | None = None,
    Vu_norm: float | None = None,
) -> RadiusBracket:
    r"""Radius thresholds :math:`R(L)` for a target constant :math:`L` (docs/theory.md §9).

    Parameters
    ----------
    L : float
        Target constant :math:`L > 0`.
    A_norm, V_norm : float
        :math:`\|A\|_2`, :math:`\|V\|_2`.
    c : float
        Exponent coefficient :math:`c'` of the upper bound.
    lam : float, optional
        Rayleigh quotient :math:`u^\top Au` of the construction (sign selects the case); default
        :math:`-\|A\|_2`, the worst case over matrices of that norm.
    Vu_norm : float, optional
        :math:`\|Vu\|_2`; default ``V_norm``.

    Returns
    -------
    RadiusBracket

    Notes
    -----
    Provenance: *derived and checked numerically*. The upper bound with :math:`c' = 1` is our
    derivation (docs/theory.md §6), not the paper's printed constant.
    """
    if not L > 0:
        raise ValueError(f"L must be > 0, got {L!r}")
    if A_norm <= 0 and lam is None:
        raise ValueError("A_norm must be > 0 (or pass lam)")
    lam_ = -float(A_norm) if lam is None else float(lam)
    vu = float(V_norm if Vu_norm is None else Vu_norm)
    R_cert = _mean_field_radius(float(L), float(A_norm), float(V_norm), float(c))
    R_viol = 0.0 if L < V_norm else float(bounds.radius_for_target(L, lam_, vu, form="exact"))
    return RadiusBracket(L=float(L), R_certified=R_cert, R_violated=R_viol, c=float(c))
