r"""The √n regime on :math:`B_R^n`: global upper bounds and the eigenvector construction.

Upper bounds :func:`sqrt_n_upper`, :func:`sqrt_n_constant` and the multi-head rule
:func:`multihead_upper` (docs/theory.md §1); lower bounds from the eigenvector construction,
:func:`rayleigh_extremes`, :func:`construction_gap`, :func:`sqrt_n_lower`, :func:`sequence_lower`
(docs/theory.md §3) and its causal version :func:`masked_sqrt_n_lower` (docs/theory.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from theory.bounds._common import (
    as_result,
    checked_choice,
    checked_count,
    checked_float,
    checked_norm,
    log_expit,
    norm_theta,
    quiet_log,
)
from theory.bounds.two_dirac import two_dirac_log_g, two_dirac_optimal_mass

# Largest n for which masked_sqrt_n_lower sums the terms explicitly.
_MASKED_N_MAX = 10**8


# ---------------------------------------------------------------------------------------------
# the sqrt(n) regime: global upper bounds on B_R^n
# ---------------------------------------------------------------------------------------------

SqrtNForm = Literal["sqrt3", "sharp", "triangle"]


def sqrt_n_upper(
    A_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    n: ArrayLike,
    *,
    sharp: bool = False,
    form: SqrtNForm | None = None,
) -> Any:
    r"""Global upper bound on :math:`\mathrm{Lip}(f\,|\,B_R^n)` in the √n regime.

    With :math:`\theta = \|A\|_2R^2` (notation of this package, not the paper's):

    * ``form="sqrt3"`` (default): :math:`\sqrt3\,\|V\|_2\,(\theta^2(4n + 1) + n)^{1/2}`;
    * ``form="sharp"`` (or ``sharp=True``): :math:`\sqrt3\,\|V\|_2\,(\theta^2(n + 1) + n)^{1/2}`;
    * ``form="triangle"``: :math:`\|V\|_2\,(\sqrt n\,(1 + \theta) + \theta)`.

    Parameters
    ----------
    A_norm, V_norm : array_like
        :math:`\|A\|_2 \ge 0` and :math:`\|V\|_2 \ge 0`.
    R : array_like
        Radius of the ball, :math:`R \ge 0`; every token satisfies :math:`\|x_i\| \le R`.
    n : array_like
        Number of tokens, :math:`n \ge 1` (``inf`` allowed; gives ``inf``).
    sharp : bool
        Shorthand for ``form="sharp"``.
    form : {"sqrt3", "sharp", "triangle"}, optional
        Which form (see above).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound, broadcast over the inputs.

    Notes
    -----
    docs/theory.md §1. Proof: :math:`Df(X)[H] = V(T_1 + T_2 + T_3)` with
    :math:`\|T_1\| \le \sqrt n\|H\|` (row sums 1, column sums :math:`\le n`),
    :math:`\|T_2\| \le 2\sqrt n\,\theta\|H\|` from :math:`\|x_j - m_i\| \le 2R` (or
    :math:`\sqrt n\,\theta\|H\|` by Cauchy–Schwarz with the attention variance
    :math:`\le R^2`, the sharp form), :math:`\|T_3\| \le \theta\|H\|`; then
    :math:`(a+b+c)^2 \le 3(a^2+b^2+c^2)` or the triangle inequality. The triangle form is
    never larger than either √3 form. All forms hold verbatim for masked attention.

    Provenance: the √n growth is *stated in the paper (abstract)* (Castin, Ablin & Peyré, ICML 2024,
    arXiv:2312.14820v2). The
    ``"sqrt3"`` constant is a *recollection, unverified* of the printed one, reproduced exactly
    by our derivation; as a bound it is *derived and checked numerically*. The ``"sharp"`` and
    ``"triangle"`` forms are our own, *derived and checked numerically*; they are not the paper's.
    """
    if form is None:
        form = "sharp" if sharp else "sqrt3"
    checked_choice(form, "form", ("sqrt3", "sharp", "triangle"))
    if sharp and form != "sharp":
        raise ValueError(f"sharp=True conflicts with form={form!r}")
    V, theta = norm_theta(A_norm, V_norm, R)
    n_ = checked_float(n, "n", min_value=1.0, allow_inf=True)
    if form == "sqrt3":
        return as_result(np.sqrt(3.0) * V * np.sqrt(theta**2 * (4.0 * n_ + 1.0) + n_))
    if form == "sharp":
        return as_result(np.sqrt(3.0) * V * np.sqrt(theta**2 * (n_ + 1.0) + n_))
    return as_result(V * (np.sqrt(n_) * (1.0 + theta) + theta))


def sqrt_n_constant(
    A_norm: ArrayLike,
    V_norm: ArrayLike,
    R: ArrayLike,
    n: ArrayLike = 1.0,
    *,
    form: SqrtNForm = "sqrt3",
) -> Any:
    r"""Constant :math:`C(n)` with :math:`\mathrm{Lip}(f\,|\,B_R^n) \le C(n)\sqrt n`.

    :math:`C(n)` is :func:`sqrt_n_upper` divided by :math:`\sqrt n`; with
    :math:`\theta = \|A\|_2R^2`:

    * ``"sqrt3"``: :math:`\sqrt3\|V\|_2(4\theta^2 + 1 + \theta^2/n)^{1/2}`;
    * ``"sharp"``: :math:`\sqrt3\|V\|_2(\theta^2 + 1 + \theta^2/n)^{1/2}`;
    * ``"triangle"``: :math:`\|V\|_2(1 + \theta + \theta/\sqrt n)`.

    Parameters
    ----------
    A_norm, V_norm, R : array_like
        As in :func:`sqrt_n_upper`.
    n : array_like
        :math:`n \ge 1`. Every form decreases in :math:`n`, so the default ``n = 1`` gives a
        constant valid for **all** :math:`n \ge 1`; ``n = inf`` gives the asymptotic constant.
    form : {"sqrt3", "sharp", "triangle"}
        Which form of :func:`sqrt_n_upper`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`C(n)`.

    Notes
    -----
    docs/theory.md §1; provenance as in :func:`sqrt_n_upper` (the ``"sqrt3"`` constant is a
    *recollection, unverified*; the other two forms are *derived and checked numerically*).
    """
    checked_choice(form, "form", ("sqrt3", "sharp", "triangle"))
    V, theta = norm_theta(A_norm, V_norm, R)
    n_ = checked_float(n, "n", min_value=1.0, allow_inf=True)
    if form == "sqrt3":
        return as_result(np.sqrt(3.0) * V * np.sqrt(4.0 * theta**2 + 1.0 + theta**2 / n_))
    if form == "sharp":
        return as_result(np.sqrt(3.0) * V * np.sqrt(theta**2 + 1.0 + theta**2 / n_))
    return as_result(V * (1.0 + theta + theta / np.sqrt(n_)))


def multihead_upper(
    head_bounds: ArrayLike,
    *,
    W_norms: ArrayLike | None = None,
    WO_norm: ArrayLike | None = None,
    rule: Literal["sum", "l2"] = "sum",
) -> Any:
    r"""Combine per-head Lipschitz bounds into a multi-head bound (docs/theory.md §1).

    * ``rule="sum"``: :math:`\sum_h \|W_h\|_2\,\mathrm{Lip}(f^h)` (``W_norms`` = the norms of the
      column blocks :math:`W_h` of :math:`W^O`; all 1 when omitted, which is what the released
      code does: it sums per-head bounds and ignores :math:`W^O`);
    * ``rule="l2"``: :math:`\|W^O\|_2\,(\sum_h \mathrm{Lip}(f^h)^2)^{1/2}`.

    Parameters
    ----------
    head_bounds : array_like, shape (..., H)
        Per-head bounds, heads on the last axis; ``+inf`` (an overflowed bound) propagates.
    W_norms : array_like, shape (..., H), optional
        :math:`\|W_h\|_2` for ``rule="sum"``.
    WO_norm : array_like, optional
        :math:`\|W^O\|_2` for ``rule="l2"`` (required there).
    rule : {"sum", "l2"}
        Which inequality.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The multi-head bound, the head axis combined: shape (...).

    Notes
    -----
    Provenance: *standard* (triangle inequality; Cauchy–Schwarz over the concatenation). The
    omission of :math:`W^O` is *from the authors' released code*.
    """
    checked_choice(rule, "rule", ("sum", "l2"))
    b = checked_float(head_bounds, "head_bounds", min_value=0.0, allow_inf=True)  # +inf propagates
    b = np.atleast_1d(b)
    if rule == "sum":
        if WO_norm is not None:
            raise ValueError("WO_norm is used only with rule='l2'; pass W_norms for rule='sum'")
        w = np.ones_like(b) if W_norms is None else np.atleast_1d(checked_norm(W_norms, "W_norms"))
        return as_result(np.sum(w * b, axis=-1))
    if W_norms is not None:
        raise ValueError("W_norms is used only with rule='sum'; pass WO_norm for rule='l2'")
    if WO_norm is None:
        raise ValueError("rule='l2' needs WO_norm")
    return as_result(checked_norm(WO_norm, "WO_norm") * np.sqrt(np.sum(b**2, axis=-1)))


# ---------------------------------------------------------------------------------------------
# lower bound: the eigenvector construction
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConstructionGap:
    r"""Logit gap of the eigenvector construction and the case used.

    Attributes
    ----------
    gamma : numpy.ndarray or numpy.float64
        The gap :math:`\gamma`.
    case : numpy.ndarray or str
        ``"+"`` (:math:`x_1 = Ru`, copies at :math:`\frac R2u`,
        :math:`\gamma = \lambda_{\max}R^2/4`)
        or ``"-"`` (:math:`x_1 = -Ru`, copies at :math:`Ru`, :math:`\gamma = 2|\lambda_{\min}|R^2`).
    """

    gamma: Any
    case: Any


@dataclass(frozen=True)
class RayleighExtremes:
    r"""Extreme Rayleigh quotients :math:`u^\top Au` and their unit directions.

    Attributes
    ----------
    lam_max, lam_min : float
        Largest and smallest value used by the constructions.
    u_max, u_min : numpy.ndarray, shape (d,)
        Unit directions with :math:`u^\top Au` equal to ``lam_max`` and ``lam_min``.
    """

    lam_max: float
    lam_min: float
    u_max: NDArray[np.float64]
    u_min: NDArray[np.float64]


def rayleigh_extremes(
    A: ArrayLike, *, variant: Literal["symmetric", "released"] = "symmetric"
) -> RayleighExtremes:
    r"""Directions for the constructions of docs/theory.md §3 and §5.

    Parameters
    ----------
    A : array_like, shape (d, d)
        Score matrix (score :math:`x_i^\top Ax_j`).
    variant : {"symmetric", "released"}
        ``"symmetric"``: extreme eigenpairs of the symmetric part :math:`(A + A^\top)/2`, i.e. the
        true extremes of :math:`u^\top Au` over unit :math:`u` (always exist). ``"released"``: the
        real eigenvalues of :math:`A` and their eigenvectors, as in the released code (which uses
        :math:`A_{\mathrm{code}} = A^\top`, same spectrum); raises if :math:`A` has no real
        eigenvalue.

    Returns
    -------
    RayleighExtremes

    Notes
    -----
    docs/theory.md §3 ("Gap rules"). Provenance: the ``"released"`` choice is *from the authors'
    released code*; the ``"symmetric"`` variant is *derived* (only :math:`u^\top Au` enters the
    logits, so it gives gaps at least as large).
    """
    checked_choice(variant, "variant", ("symmetric", "released"))
    A_ = checked_float(A, "A")
    if A_.ndim != 2 or A_.shape[0] != A_.shape[1]:
        raise ValueError(f"A must be a square matrix, got shape {A_.shape}")
    if variant == "symmetric":
        vals, vecs = np.linalg.eigh(0.5 * (A_ + A_.T))
        return RayleighExtremes(float(vals[-1]), float(vals[0]), vecs[:, -1], vecs[:, 0])
    vals, vecs = np.linalg.eig(A_)
    scale = max(1.0, float(np.abs(vals).max()))
    real = np.abs(vals.imag) <= 1e-12 * scale
    if not real.any():
        raise ValueError("A has no real eigenvalue; use variant='symmetric'")
    rvals = vals.real[real]
    rvecs = vecs[:, real].real
    rvecs = rvecs / np.linalg.norm(rvecs, axis=0)
    i_max, i_min = int(np.argmax(rvals)), int(np.argmin(rvals))
    u_max, u_min = rvecs[:, i_max], rvecs[:, i_min]
    return RayleighExtremes(float(u_max @ A_ @ u_max), float(u_min @ A_ @ u_min), u_max, u_min)


def construction_gap(
    lam_max: ArrayLike,
    lam_min: ArrayLike,
    R: ArrayLike,
    *,
    rule: Literal["released", "best"] = "released",
) -> ConstructionGap:
    r"""Gap :math:`\gamma` of the eigenvector construction and its case (docs/theory.md §3, §5).

    * Case ``"+"``: :math:`\gamma_+ = \lambda_{\max}R^2/4`; case ``"-"``:
      :math:`\gamma_- = -2\lambda_{\min}R^2`.
    * ``rule="released"``: case ``"+"`` iff :math:`\lambda_{\max} > -8\lambda_{\min}` (the released
      "−8 rule"), otherwise case ``"-"``.
    * ``rule="best"``: :math:`\gamma^* = \max(\lambda_{\max}R^2/4,\ -2\lambda_{\min}R^2)`, case
      ``"+"``
      on ties.

    Parameters
    ----------
    lam_max, lam_min : array_like
        Extreme values of :math:`u^\top Au` used by the construction (eigenvalues of :math:`A` for
        the
        released choice, of the symmetric part for the best one; see :func:`rayleigh_extremes`),
        with ``lam_min <= lam_max``.
    R : array_like
        Radius.
    rule : {"released", "best"}
        Case selection.

    Returns
    -------
    ConstructionGap
        ``gamma`` (>= 0 whenever ``lam_min <= lam_max``) and ``case`` (``"+"``/``"-"``).

    Notes
    -----
    The −8 rule is exactly "case + has the larger gap"
    (:math:`\lambda_{\max}/4 > 2|\lambda_{\min}|`),
    so both rules give the **same** :math:`\gamma` and differ only on ties; what differs in
    practice is which :math:`\lambda` the caller passes (real eigenvalues of :math:`A` versus
    extremes
    of the symmetric part). Provenance: the rule is *from the authors' released code*; the
    best-gap reading is *derived and checked numerically*.
    """
    checked_choice(rule, "rule", ("released", "best"))
    lmax = checked_float(lam_max, "lam_max")
    lmin = checked_float(lam_min, "lam_min")
    R_ = checked_norm(R, "R")
    if (lmin > lmax).any():
        raise ValueError("lam_min must be <= lam_max")
    g_plus = lmax * R_**2 / 4.0
    g_minus = -2.0 * lmin * R_**2
    plus = lmax > -8.0 * lmin if rule == "released" else g_plus >= g_minus
    gamma = np.where(plus, g_plus, g_minus)
    case = np.where(plus, "+", "-")
    return ConstructionGap(gamma=as_result(gamma), case=as_result(case))


def _p_log(gamma: NDArray[np.float64], m: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
    """Return ``(log p, log(1 - p))`` with ``p = e^gamma / (e^gamma + m)``, ``m >= 0``."""
    x = gamma - quiet_log(m)  # +inf when m == 0
    return log_expit(x), log_expit(-x)


def sqrt_n_lower(gamma: ArrayLike, n: ArrayLike, Vu_norm: ArrayLike = 1.0) -> Any:
    r"""Lower bound of the eigenvector construction (docs/theory.md §3).

    .. math:: \|Df(X)\|_2 \ \ge\ \sqrt{n - 1}\;p\,\big(1 + (1 - p)\gamma\big)\,\|Vu\|_2,
              \qquad p = \frac{e^{\gamma}}{e^{\gamma} + n - 1},

    for the input :math:`x_1 = Ru`, :math:`x_2 = \dots = x_n = \frac R2u` (case +,
    :math:`\gamma = \lambda R^2/4`) or :math:`x_1 = -Ru`, :math:`x_2 = \dots = x_n = Ru` (case −,
    :math:`\gamma = 2|\lambda|R^2`), with :math:`\lambda = u^\top Au`.

    Parameters
    ----------
    gamma : array_like
        Gap :math:`\gamma \ge 0` (any size; :math:`p` is computed as a logistic function of
        :math:`\gamma - \log(n - 1)`).
    n : array_like
        Number of tokens, :math:`n \ge 1` (real values allowed for curves).
    Vu_norm : array_like
        :math:`\|Vu\|_2`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound (0 at :math:`n = 1`).

    Notes
    -----
    Proof: take :math:`H = (u, 0, \dots, 0)`; for :math:`i \ge 2`,
    :math:`x_1 - m_i = (1 - p)(x_1 - x_2)` and :math:`(x_1 - x_2)\,x_i^\top Au = \gamma u`, so each
    of
    the :math:`n - 1` rows equals :math:`p(1 + (1 - p)\gamma)Vu`. Holds for any unit :math:`u`.
    Provenance: the construction is *from the authors' released code*; the bound is *derived and
    checked numerically*. Tightness "for reasonable sequence lengths" is *stated in the paper
    (abstract)*.
    """
    g = checked_float(gamma, "gamma", min_value=0.0)
    n_ = checked_float(n, "n", min_value=1.0)
    Vu = checked_norm(Vu_norm, "Vu_norm")
    log_p, log_q = _p_log(g, n_ - 1.0)
    return as_result(np.sqrt(n_ - 1.0) * np.exp(log_p) * (1.0 + np.exp(log_q) * g) * Vu)


def sequence_lower(gamma: ArrayLike, n: ArrayLike, Vu_norm: ArrayLike = 1.0) -> Any:
    r"""Best :math:`k`-copy construction on :math:`n` tokens: :math:`\max_{1 \le k < n} g(k/n)`.

    Put :math:`k` tokens at the light position and :math:`n - k` at the heavy one (positions of
    :func:`sqrt_n_lower`), and move the :math:`k` light tokens by :math:`u/\sqrt k` each. The
    :math:`n - k` heavy rows give exactly the two-Dirac function of docs/theory.md §5 at
    :math:`\varepsilon = k/n`:

    .. math:: \mathrm{Lip}(f\,|\,B_R^n) \ \ge\ \max_{1 \le k \le n - 1} g(k/n).

    :math:`k = 1` is :func:`sqrt_n_lower`. Since :math:`\log g` is concave in :math:`v = 1 - w`, the
    maximum is at :math:`k = \lfloor n\varepsilon^*\rfloor` or :math:`\lceil n\varepsilon^*\rceil`
    (clipped to
    :math:`[1, n - 1]`), with :math:`\varepsilon^*` from :func:`two_dirac_optimal_mass`.

    Parameters
    ----------
    gamma : array_like
        Gap :math:`\gamma \ge 0`.
    n : array_like
        Integer number of tokens :math:`n \ge 1` (0 is returned at :math:`n = 1`).
    Vu_norm : array_like
        :math:`\|Vu\|_2`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound; it increases to :math:`\sup_\varepsilon g` as :math:`n \to \infty`, so the
        sequence constant does not decay past the peak of :func:`sqrt_n_lower`.

    Notes
    -----
    Provenance: *derived and checked numerically* (ours; exact Jacobian in the tests). It makes
    quantitative the claim that the supremum over inputs does not decay (docs/theory.md §3,
    "k copies").
    """
    g = checked_float(gamma, "gamma", min_value=0.0)
    n_ = checked_count(n, "n")
    Vu = checked_norm(Vu_norm, "Vu_norm")
    g, n_, Vu = np.broadcast_arrays(g, n_, Vu)
    k_star = np.exp(np.asarray(two_dirac_optimal_mass(g).log_eps) + np.log(n_))
    valid = n_ >= 2
    best = np.full(g.shape, -np.inf)
    for k in (np.floor(k_star), np.ceil(k_star)):
        k = np.clip(k, 1.0, np.maximum(n_ - 1.0, 1.0))
        eps = np.where(valid, k / n_, 0.5)
        val = np.where(valid, two_dirac_log_g(np.log(eps), g), -np.inf)
        best = np.maximum(best, val)
    with np.errstate(over="ignore"):
        out = np.where(valid, np.exp(best), 0.0) * Vu
    return as_result(out)


def masked_sqrt_n_lower(gamma: ArrayLike, n: ArrayLike, Vu_norm: ArrayLike = 1.0) -> Any:
    r"""Lower bound for causal attention on the eigenvector construction (docs/theory.md §4).

    .. math:: \|Df^m(X)\|_2 \ \ge\ \|Vu\|_2\Big(\sum_{i=2}^n p_i^2\big(1 + (1 -
    p_i)\gamma\big)^2\Big)^{1/2},
              \qquad p_i = \frac{e^\gamma}{e^\gamma + i - 1}.

    Parameters
    ----------
    gamma : array_like
        Gap :math:`\gamma \ge 0`.
    n : array_like
        Integer :math:`n \ge 1`, or ``inf`` for the limit :math:`n \to \infty`.
    Vu_norm : array_like
        :math:`\|Vu\|_2`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        The bound; increasing in :math:`n` and convergent.

    Notes
    -----
    Finite :math:`n` are summed term by term (one cumulative sum per distinct :math:`\gamma`, cost
    :math:`O(\max n)`, at most :math:`10^8`). The limit has a closed form through the Hurwitz zeta
    function, with :math:`E = e^\gamma` and :math:`z_s = E^{s-1}\zeta(s, E + 1)`:

    .. math:: \lim_{n\to\infty}(\cdot)^2 = E\big((1 + \gamma)^2z_2 - 2\gamma(1 + \gamma)z_3 +
    \gamma^2z_4\big)
              \approx E\,(1 + \gamma + \gamma^2/3)\ \ (E \to \infty),

    obtained by writing :math:`1 + (1 - p_i)\gamma = (1 + \gamma) - \gamma p_i` and
    :math:`p_i = E/(E + m)`, :math:`m = i - 1`. Provenance: *derived and checked numerically*
    (the saturation; the Hurwitz form is ours).
    """
    g = checked_float(gamma, "gamma", min_value=0.0)
    n_ = checked_count(n, "n", allow_inf=True)
    Vu = checked_norm(Vu_norm, "Vu_norm")
    g, n_, Vu = np.broadcast_arrays(g, n_, Vu)
    out = np.zeros(g.shape)
    finite = np.isfinite(n_)
    if finite.any() and n_[finite].max() > _MASKED_N_MAX:
        raise ValueError(f"n must be <= {_MASKED_N_MAX} (or inf for the limit)")
    for gv in np.unique(g[finite]):
        sel = finite & (g == gv)
        n_max = int(n_[sel].max())
        if n_max < 2:
            continue
        m = np.arange(1, n_max, dtype=np.float64)
        log_p, log_q = _p_log(np.float64(gv), m)
        terms = (np.exp(log_p) * (1.0 + np.exp(log_q) * gv)) ** 2
        csum = np.concatenate(([0.0], np.cumsum(terms)))
        out[sel] = np.sqrt(csum[n_[sel].astype(np.int64) - 1])
    if not finite.all():
        with np.errstate(over="ignore"):
            out[~finite] = np.exp(0.5 * _masked_log_limit_sq(g[~finite]))
    return as_result(out * Vu)


def _masked_log_limit_sq(g: NDArray[np.float64]) -> NDArray[np.float64]:
    """Log of the n -> inf limit of the masked sum (see masked_sqrt_n_lower)."""

    def log_sum(gg: NDArray[np.float64], a: dict[int, NDArray[np.float64]]) -> NDArray[np.float64]:
        # a[s] = E^(s-1) zeta(s, E + 1), E = e^gamma
        return gg + np.log((1 + gg) ** 2 * a[2] - 2 * gg * (1 + gg) * a[3] + gg**2 * a[4])

    out = np.empty_like(g)
    small = g <= 30.0
    if small.any():
        gs = g[small]
        E = np.exp(gs)
        out[small] = log_sum(gs, {s: E ** (s - 1) * special.zeta(s, E + 1.0) for s in (2, 3, 4)})
    big = ~small
    if big.any():
        gb = g[big]
        inv_q = np.exp(-gb) / (1.0 + np.exp(-gb))  # 1 / (E + 1)
        r = 1.0 / (1.0 + np.exp(-gb))  # E / (E + 1)
        # Euler–Maclaurin: zeta(s, q) = q^(1-s)/(s-1) + q^(-s)/2 + s q^(-s-1)/12 + O(q^(-s-3)).
        a = {
            s: r ** (s - 1) * (1.0 / (s - 1) + inv_q / 2.0 + s * inv_q**2 / 12.0) for s in (2, 3, 4)
        }
        out[big] = log_sum(gb, a)
    return out
