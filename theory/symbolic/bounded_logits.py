r"""Bounded logits: the two-token counterexamples, the RMS normalisation, the column sums.

docs/derivations/bounded_logits.md. Each derivation starts from the defining map (the two-token
attention map with a soft-capped or QK-normed logit, the normalisation :math:`z/r(z)`, the largest
attention weight under a logit spread), lets sympy differentiate, substitute and take limits, and
checks the result against the closed form used by :mod:`theory.bounds.bounded_logits`. Where
``simplify`` cannot decide an identity between transcendental expressions, it is checked at
several rational points to 40 significant digits instead, and a disagreement raises.
"""

from __future__ import annotations

import functools

import sympy as sp

from ._core import Derivation, make_derivation

# Symbols local to these derivations (positive unless stated).
a = sp.Symbol("a", positive=True)  # score of the one-dimensional head
R = sp.Symbol("R", positive=True)
kappa = sp.Symbol("kappa", positive=True)
Qs = sp.Symbol("Q", positive=True)
Ks = sp.Symbol("K", positive=True)
eps = sp.Symbol("varepsilon", positive=True)
sigma = sp.Symbol("sigma", positive=True)
t = sp.Symbol("t", positive=True)
k = sp.Symbol("k", positive=True)
Delta = sp.Symbol("Delta", positive=True)
n = sp.Symbol("n", positive=True)
_x1, _x2 = sp.symbols("x1 x2", real=True)

_POINTS = (
    {a: sp.Rational(7, 10), R: sp.Rational(3, 2), kappa: 2, Qs: sp.Rational(13, 10),
     Ks: sp.Rational(4, 5), eps: sp.Rational(1, 1000), sigma: sp.Rational(9, 10)},
    {a: 2, R: 5, kappa: sp.Rational(1, 3), Qs: sp.Rational(1, 2), Ks: 3, eps: sp.Rational(1, 10),
     sigma: sp.Rational(1, 4)},
    {a: sp.Rational(1, 9), R: sp.Rational(1, 4), kappa: 7, Qs: 2, Ks: sp.Rational(1, 7),
     eps: 2, sigma: 3},
)  # fmt: skip


def _check_identity(derived: sp.Expr, stated: sp.Expr, what: str, *, symbolic: bool = True) -> None:
    """Raise unless ``derived == stated``: symbolically, or to 40 digits at three points.

    ``symbolic=False`` skips ``simplify`` (too slow on the QK-norm Jacobian) and checks the points.
    """
    if symbolic and sp.simplify(derived - stated) == 0:
        return
    for point in _POINTS:
        lhs = sp.N(derived.subs(point), 40)
        rhs = sp.N(stated.subs(point), 40)
        if abs(lhs - rhs) > sp.Float(10) ** -30 * (1 + abs(rhs)):
            raise RuntimeError(f"{what}: derived {lhs} differs from stated {rhs} at {point}")


def _two_token_jacobian(logit: sp.Lambda) -> sp.Matrix:
    """Jacobian of the d = 1 two-token map x_i -> sum_j softmax_j(s(x_i, x_j)) x_j at (0, R)."""
    xs = (_x1, _x2)
    outs = []
    for xi in xs:
        w = [sp.exp(logit(xi, xj)) for xj in xs]
        outs.append((w[0] * _x1 + w[1] * _x2) / (w[0] + w[1]))
    J = sp.Matrix(2, 2, lambda i, j: sp.diff(outs[i], xs[j]))
    return J.subs({_x1: 0, _x2: R})


def _sigma_max(J: sp.Matrix) -> sp.Expr:
    F = sum(e**2 for e in J)
    D = J[0, 0] * J[1, 1] - J[0, 1] * J[1, 0]  # not J.det(): its simplification is slow
    return sp.sqrt((F + sp.sqrt(F**2 - 4 * D**2)) / 2)


@functools.cache
def softcap_two_token() -> Derivation:
    r"""Jacobian and :math:`\|Df(X)\|_2` of a soft-capped head at :math:`X = (0, R)`, :math:`d = 1`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`\sigma_{\max}(J)` (:math:`V = 1`), ``func(a, R, kappa)``; extras ``J11``,
        ``J12``, ``J21``, ``J22`` (the entries) and ``slope`` =
        :math:`\lim_{R\to\infty}\sigma_{\max}/(aR^2) = (1/16 + p_\infty^2q_\infty^2)^{1/2}`,
        :math:`p_\infty = 1/(1+e^\kappa)` (a function of ``kappa``).

    Notes
    -----
    Starts from :math:`s(x, y) = \kappa\tanh(axy/\kappa)`; the stated entries are those of
    :func:`theory.bounds.softcap_two_token_lower`.
    """
    cap = sp.Lambda((_x1, _x2), kappa * sp.tanh(a * _x1 * _x2 / kappa))
    J = _two_token_jacobian(cap)
    theta = a * R**2
    p = 1 / (1 + sp.exp(kappa * sp.tanh(theta / kappa)))
    q = 1 - p
    g = 1 - sp.tanh(theta / kappa) ** 2
    stated = sp.Matrix(
        [
            [sp.Rational(1, 2) + theta / 4, sp.Rational(1, 2)],
            [p - p * q * theta, q + 2 * p * q * g * theta],
        ]
    )
    for i in range(2):
        for j in range(2):
            _check_identity(J[i, j], stated[i, j], f"softcap J[{i + 1}{j + 1}]")
    expr = _sigma_max(stated)
    p_inf = 1 / (1 + sp.exp(kappa))
    slope = sp.limit(expr.subs(a, 1) / R**2, R, sp.oo)
    slope_stated = sp.sqrt(sp.Rational(1, 16) + p_inf**2 * (1 - p_inf) ** 2)
    _check_identity(slope, slope_stated, "softcap slope")
    steps = (
        "s(x, y) = kappa tanh(a x y / kappa); f(X)_i = sum_j softmax_j(s(x_i, x_j)) x_j, d = 1.",
        "Differentiate the map in x1, x2 and substitute (x1, x2) = (0, R) (sympy).",
        "The query at 0 scores both keys 0: weights (1/2, 1/2), gate sech^2(0) = 1, so "
        "J11 = 1/2 + theta/4 with theta = a R^2.",
        "The query at R: p = 1/(1 + e^c), c = kappa tanh(theta/kappa); J21 = p - p q theta.",
        "sigma_max of a 2x2 matrix: ((F + sqrt(F^2 - 4 det^2)) / 2)^(1/2), F = ||J||_F^2.",
        "Limit R -> oo of sigma_max / R^2 at a = 1: sqrt(1/16 + p^2 q^2), p = 1/(1 + e^kappa).",
    )
    return make_derivation(
        "soft-capped two-token Jacobian norm",
        expr,
        (a, R, kappa),
        steps,
        {
            "J11": stated[0, 0],
            "J12": stated[0, 1],
            "J21": stated[1, 0],
            "J22": stated[1, 1],
            "slope": slope_stated,
        },
    )


@functools.cache
def qk_norm_two_token() -> Derivation:
    r"""Jacobian and :math:`\|Df(X)\|_2` of a QK-normed head at :math:`X = (0, R)`, :math:`d = k = 1`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`\sigma_{\max}(J)` (:math:`V = 1`), ``func(Q, K, R, varepsilon, sigma)``;
        extras ``J11`` ... ``J22`` and ``slope`` = :math:`\lim_{R\to\infty}\sigma_{\max}/R =
        \sigma(Q^2/16 + p_\infty^2q_\infty^2K^2)^{1/2}/\sqrt\varepsilon`,
        :math:`p_\infty = 1/(1+e^\sigma)`.

    Notes
    -----
    Starts from :math:`s(x, y) = \sigma N(Qx)N(Ky)`, :math:`N(t) = t/\sqrt{t^2+\varepsilon}`
    (RMSNorm of width 1, weight 1); the stated entries are those of
    :func:`theory.bounds.qk_norm_two_token_lower`.
    """

    def N(z: sp.Expr) -> sp.Expr:
        return z / sp.sqrt(z**2 + eps)

    def dN(z: sp.Expr) -> sp.Expr:
        return eps / (z**2 + eps) ** sp.Rational(3, 2)

    logit = sp.Lambda((_x1, _x2), sigma * N(Qs * _x1) * N(Ks * _x2))
    J = _two_token_jacobian(logit)
    c = sigma * N(Qs * R) * N(Ks * R)
    p = 1 / (1 + sp.exp(c))
    q = 1 - p
    alpha = sigma * Qs * N(Ks * R) / sp.sqrt(eps)
    beta = sigma * Ks * N(Qs * R) / sp.sqrt(eps)
    delta = sigma * (Qs * dN(Qs * R) * N(Ks * R) + Ks * N(Qs * R) * dN(Ks * R))
    stated = sp.Matrix(
        [
            [sp.Rational(1, 2) + R * alpha / 4, sp.Rational(1, 2)],
            [p - p * q * R * beta, q + p * q * R * delta],
        ]
    )
    for i in range(2):
        for j in range(2):
            _check_identity(J[i, j], stated[i, j], f"QK-norm J[{i + 1}{j + 1}]", symbolic=False)
    expr = _sigma_max(stated)
    p_inf = 1 / (1 + sp.exp(sigma))
    slope_stated = sigma * sp.sqrt(Qs**2 / 16 + p_inf**2 * (1 - p_inf) ** 2 * Ks**2) / sp.sqrt(eps)
    # leading order in R, piece by piece: N(.R) -> 1, R N'(.R) -> 0, so J / R tends to the
    # first column (alpha_inf / 4, -p q beta_inf); rank one: sigma_max / R -> its norm
    lim = {name: sp.limit(e, R, sp.oo) for name, e in (("alpha", alpha), ("beta", beta),
                                                        ("p", p), ("delta", delta))}  # fmt: skip
    _check_identity(lim["p"], p_inf, "QK-norm p_inf")
    if lim["delta"] != 0:
        raise RuntimeError("QK-norm: J22 / R does not vanish")
    slope = sp.sqrt((lim["alpha"] / 4) ** 2 + (lim["p"] * (1 - lim["p"]) * lim["beta"]) ** 2)
    _check_identity(slope, slope_stated, "QK-norm slope")
    steps = (
        "s(x, y) = sigma N(Q x) N(K y), N(t) = t / sqrt(t^2 + eps); d = k = 1.",
        "Differentiate the two-token map and substitute (x1, x2) = (0, R) (sympy).",
        "N(0) = 0 and N'(0) = 1/sqrt(eps): the query at 0 scores both keys 0, weights 1/2, and "
        "its logit on the key R moves at rate alpha = sigma Q N(K R) / sqrt(eps).",
        "J / R tends to a rank-one matrix (first column): sigma_max / R -> its Frobenius norm, "
        "sigma sqrt(Q^2/16 + p^2 q^2 K^2) / sqrt(eps), p = 1/(1 + e^sigma).",
    )
    return make_derivation(
        "QK-normed two-token Jacobian norm",
        expr,
        (Qs, Ks, R, eps, sigma),
        steps,
        {
            "J11": stated[0, 0],
            "J12": stated[0, 1],
            "J21": stated[1, 0],
            "J22": stated[1, 1],
            "slope": slope_stated,
        },
    )


@functools.cache
def rms_normalisation() -> Derivation:
    r"""Norm of the derivative of :math:`N(z) = z/r(z)`, :math:`r(z) = (\|z\|^2/k+\varepsilon)^{1/2}`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`\|DN(z)\|_2 = 1/r(z)` as a function of :math:`t = \|z\|`
        (``func(t, k, varepsilon)``); extras ``radial`` (:math:`\varepsilon/r^3`, the eigenvalue
        along :math:`z`), ``tangential`` (:math:`1/r`), ``nu`` (:math:`\|N(z)\| = t/r`),
        ``sup_derivative`` (:math:`1/\sqrt\varepsilon`, at :math:`t = 0`) and ``sup_norm``
        (:math:`\sqrt k`, as :math:`t\to\infty`).

    Notes
    -----
    :math:`N(z) = \phi(\|z\|)z/\|z\|` with :math:`\phi(t) = t/r(t)`: :math:`DN` has the eigenvalue
    :math:`\phi'(t)` along :math:`z` and :math:`\phi(t)/t` on :math:`z^\perp` (which is empty
    when :math:`k = 1`: then :math:`\|DN\| = \varepsilon/r^3`, still :math:`\le 1/r`). These give
    :math:`G_q, G_k` and :math:`B` in :func:`theory.bounds.qk_norm_sqrt_n_upper`.
    """
    r = sp.sqrt(t**2 / k + eps)
    phi = t / r
    radial = sp.simplify(sp.diff(phi, t))
    tangential = sp.simplify(phi / t)
    _check_identity(radial, eps / r**3, "radial eigenvalue")
    _check_identity(tangential, 1 / r, "tangential eigenvalue")
    # radial <= tangential  <=>  eps <= r^2, true: the norm of DN is the tangential eigenvalue
    if sp.simplify(tangential - radial - t**2 / (k * r**3)) != 0:
        raise RuntimeError("tangential - radial != t^2 / (k r^3)")
    sup_derivative = sp.limit(tangential, t, 0)
    sup_norm = sp.limit(phi, t, sp.oo)
    _check_identity(sup_derivative, 1 / sp.sqrt(eps), "sup of ||DN||")
    _check_identity(sup_norm, sp.sqrt(k), "sup of ||N||")
    if sp.simplify(sp.diff(tangential, t) + t / (k * r**3)) != 0:
        raise RuntimeError("d/dt (1/r) != -t / (k r^3): ||DN|| is not decreasing in ||z||")
    steps = (
        "N(z) = phi(|z|) z / |z|, phi(t) = t / sqrt(t^2/k + eps).",
        "Eigenvalues of DN: phi'(t) = eps / r^3 along z, phi(t)/t = 1/r across (sympy).",
        "1/r - eps/r^3 = t^2/(k r^3) >= 0, so ||DN(z)|| = 1/r(z), decreasing in |z|.",
        "sup ||DN|| = 1/sqrt(eps) at z = 0; sup ||N|| = sqrt(k) as |z| -> oo.",
    )
    return make_derivation(
        "derivative of the RMS normalisation",
        tangential,
        (t, k, eps),
        steps,
        {
            "radial": radial,
            "tangential": tangential,
            "nu": phi,
            "sup_derivative": sup_derivative,
            "sup_norm": sup_norm,
        },
    )


@functools.cache
def column_sums() -> Derivation:
    r"""Largest attention weight and column sum under a logit spread :math:`\Delta`.

    Returns
    -------
    Derivation
        ``expr`` = :math:`c(n) = n/(1+(n-1)e^{-\Delta})` (``func(n, Delta)``); extras ``limit``
        (:math:`e^\Delta` as :math:`n\to\infty`), ``causal_integral``
        (:math:`\int_0^{n-1}dt/(1+te^{-\Delta}) = e^\Delta\log(1+(n-1)e^{-\Delta})`) and ``weight``
        (:math:`\pi(n) = 1/(1+(n-1)e^{-\Delta})`).

    Notes
    -----
    A weight :math:`P_{ij} = 1/\sum_le^{s_{il}-s_{ij}}` with :math:`s_{il}-s_{ij}\ge-\Delta` is at
    most :math:`\pi(n)`; :math:`n` queries give column sums :math:`\le c(n)`, increasing in
    :math:`n` to :math:`e^\Delta`. Causal rows have :math:`i` keys; the sum of
    :math:`\pi(i)` is bounded by the integral. Used by :func:`theory.bounds.bounded_logits_upper`.
    """
    weight = 1 / (1 + (n - 1) * sp.exp(-Delta))
    c = n * weight
    dc = sp.simplify(sp.diff(c, n))
    _check_identity(dc, (1 - sp.exp(-Delta)) / (1 + (n - 1) * sp.exp(-Delta)) ** 2, "dc/dn")
    limit = sp.limit(c, n, sp.oo)
    _check_identity(limit, sp.exp(Delta), "lim c(n)")
    integral = sp.integrate(1 / (1 + t * sp.exp(-Delta)), (t, 0, n - 1))
    stated = sp.exp(Delta) * sp.log(1 + (n - 1) * sp.exp(-Delta))
    _check_identity(sp.simplify(integral), stated, "causal integral")
    steps = (
        "P_ij = 1 / sum_l e^(s_il - s_ij) <= 1 / (1 + (n - 1) e^-Delta) = pi(n).",
        "Column sums <= n pi(n) = c(n); dc/dn = (1 - e^-Delta) / (1 + (n-1) e^-Delta)^2 >= 0.",
        "lim_{n -> oo} c(n) = e^Delta (sympy).",
        "Causal: sum_{i<=n} pi(i) <= 1 + int_0^(n-1) dt / (1 + t e^-Delta) "
        "= 1 + e^Delta log(1 + (n - 1) e^-Delta).",
    )
    return make_derivation(
        "column sums under a logit spread",
        c,
        (n, Delta),
        steps,
        {"limit": limit, "causal_integral": stated, "weight": weight},
    )
