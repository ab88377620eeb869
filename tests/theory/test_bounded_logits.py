"""Bounded logits (theory/bounds/bounded_logits.py, docs/derivations/bounded_logits.md).

Oracles: the exact float64 Jacobian of the variant heads by torch autograd
(tests/oracles_bounded_logits.py), the sympy derivations of theory/symbolic/bounded_logits.py,
mpmath at 50 digits where a bound is attained (rounding decides the comparison there).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
import torch

import meanfield
from meanfield.attention import head_logits
from theory import bounds as B
from theory import symbolic as sym
from theory.symbolic import bounded_logits as SB

from ..oracles_bounded_logits import (
    ball_points,
    exact_norm,
    jacobian,
    radius,
    random_head,
    wasserstein_local,
)
from ..tolerances import (
    ASYMPTOTE,
    ASYMPTOTE_FAR,
    CERTIFIED_INFLATION,
    F64_CLOSED_FORM,
    F64_FEW_ULPS,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    F64_VS_MPMATH_COND,
    FD_REL,
)

#: float64 rounding of a spectral norm and of the bound's own evaluation (a few hundred ulps of
#: O(n d) terms); the local bound is attained (equal tokens, n = 1), so equality up to rounding
#: must pass.
ROUND = 1e-12


def ball_bound(h, R: float, n: float, *, masked: bool) -> float:
    """The ``*_sqrt_n_upper`` bound of the head's form on B_R^n."""
    Vn = float(np.linalg.norm(h.V, 2))
    if h.form == "softcap":
        return float(
            B.softcap_sqrt_n_upper(
                np.linalg.norm(h.A, 2), Vn, R, n, h.kappa, masked=masked, window=h.window
            )
        )
    if h.form == "qk_norm":
        return float(
            B.qk_norm_sqrt_n_upper(
                np.linalg.norm(h.Q, 2),
                np.linalg.norm(h.K, 2),
                Vn,
                R,
                n,
                h.eps,
                h.Q.shape[0],
                scale=h.scale,
                weight_max=float(np.max(np.abs(h.wq * h.wk))),
                masked=masked,
                window=h.window,
            )
        )
    if h.form == "window":
        return float(
            B.window_sqrt_n_upper(np.linalg.norm(h.A, 2), Vn, R, n, h.window, masked=masked)
        )
    return float(B.sqrt_n_upper(np.linalg.norm(h.A, 2), Vn, R, n, form="triangle"))


def mean_field_bound(h, R: float) -> float:
    Vn = float(np.linalg.norm(h.V, 2))
    if h.form == "softcap":
        return float(B.softcap_mean_field_upper(np.linalg.norm(h.A, 2), Vn, R, h.kappa))
    return float(
        B.qk_norm_mean_field_upper(
            np.linalg.norm(h.Q, 2),
            np.linalg.norm(h.K, 2),
            Vn,
            R,
            h.eps,
            h.Q.shape[0],
            scale=h.scale,
            weight_max=float(np.max(np.abs(h.wq * h.wk))),
        )
    )


def local_bound(h, X, *, masked: bool) -> float:
    if h.form == "qk_norm":
        return B.bounded_logits_local_upper(
            X,
            h.V,
            Q=h.Q,
            K=h.K,
            eps=h.eps,
            scale=h.scale,
            q_weight=h.wq,
            k_weight=h.wk,
            masked=masked,
            window=h.window,
        )
    return B.bounded_logits_local_upper(
        X, h.V, h.A, softcap=h.kappa, masked=masked, window=h.window
    )


# ---------------------------------------------------------------------------------------------
# the bounds against the exact Jacobian
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["softcap", "qk_norm", "window"])
def test_bounds_hold_at_random_inputs(form):
    """exact <= local (to rounding) <= ball bound, and exact <= mean-field bound (unmasked)."""
    rng = np.random.default_rng({"softcap": 1, "qk_norm": 2, "window": 3}[form])
    worst = 0.0
    for trial in range(60):
        n, d, k = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
        R = float(rng.choice([0.3, 1.0, 3.0, 30.0]))
        h = random_head(rng, form, d, k)
        X = ball_points(rng, n, d, R)
        if form == "qk_norm" and trial % 3 == 0:
            X[0] -= np.linalg.pinv(h.Q) @ (h.Q @ X[0])  # a query with Q x = 0 (if k < d)
        masked = bool(trial % 2)
        Rm = radius(X)
        exact = exact_norm(X, h.params(), masked=masked)
        local = local_bound(h, X, masked=masked)
        ball = ball_bound(h, Rm, n, masked=masked)
        assert exact <= local * (1 + ROUND), (trial, exact, local)
        assert local <= ball * (1 + ROUND), (trial, local, ball)
        if form != "window":
            assert ball_bound(h, Rm, math.inf, masked=masked) >= ball * (1 - ROUND)
            if not masked and h.window is None:
                assert exact <= mean_field_bound(h, Rm) * (1 + ROUND)
        worst = max(worst, exact / ball)
    assert 0.05 < worst <= 1.0  # the ball bound is not vacuous on these inputs


def test_local_bound_is_certified_local_for_plain_logits(rng):
    """Plain logits: the same three terms as certified_local_upper (which adds a rounding margin)."""
    for _ in range(20):
        n, d = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        X = ball_points(rng, n, d, float(rng.uniform(0.5, 3.0)))
        A, V = rng.standard_normal((d, d)), rng.standard_normal((2, d))
        for masked in (False, True):
            ours = B.bounded_logits_local_upper(X, V, A, masked=masked)
            cert = B.certified_local_upper(X, [(A, V)], masked=masked)
            assert ours <= cert <= ours * (1 + CERTIFIED_INFLATION)


def test_local_bound_is_attained_at_equal_tokens_mpmath():
    """n equal tokens: ||Df|| = ||V|| exactly (P = 11^T/n, no spread); the bound is ||V|| too."""
    rng = np.random.default_rng(5)
    V = rng.standard_normal((2, 3))
    X = np.tile(rng.standard_normal(3), (4, 1))
    A = rng.standard_normal((3, 3))
    with mp.workdps(50):
        exact_mp = max(mp.svd_r(mp.matrix(V.tolist()), compute_uv=False))
    local = B.bounded_logits_local_upper(X, V, A, softcap=0.7)
    assert abs(local - float(exact_mp)) <= 4 * np.finfo(float).eps * float(exact_mp)
    h = meanfield.AttentionParams(torch.as_tensor(A), torch.as_tensor(V), softcap=0.7)
    assert exact_norm(X, h) == pytest.approx(float(exact_mp), rel=ROUND)


def test_mean_field_bounds_hold_on_weighted_measures():
    """L_W(mu) <= the mean-field bound on random weighted measures (masses down to e^-12)."""
    rng = np.random.default_rng(7)
    worst = 0.0
    for trial in range(40):
        form = ("softcap", "qk_norm")[trial % 2]
        n, d, k = int(rng.integers(2, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        h = random_head(rng, form, d, k)
        h.window = None
        X = ball_points(rng, n, d, float(rng.choice([0.5, 2.0, 10.0])))
        log_a = rng.uniform(-12.0, 0.0, n)
        got = wasserstein_local(X, log_a, h.params())
        bound = mean_field_bound(h, radius(X))
        assert got <= bound * (1 + ROUND), (trial, got, bound)
        worst = max(worst, got / bound)
    assert worst > 0.01


def test_plain_limits():
    """kappa = inf is plain attention: at most the triangle √n bound and the refined mean field."""
    a, v = np.array([0.1, 0.7, 2.0]), 1.3
    for R in (0.5, 1.0, 3.0):
        for n in (1, 2, 10, 1000):
            ours = B.softcap_sqrt_n_upper(a, v, R, n, np.inf)
            tri = B.sqrt_n_upper(a, v, R, n, form="triangle")
            assert np.all(ours <= tri * (1 + ROUND))
            np.testing.assert_allclose(B.window_sqrt_n_upper(a, v, R, n, n), tri, rtol=F64_FEW_ULPS)
        mf = B.softcap_mean_field_upper(a, v, R, np.inf)
        theta = a * R**2
        np.testing.assert_allclose(
            mf, v * (np.exp(theta) * (1 + theta) + theta), rtol=F64_REWRITTEN
        )
        assert np.all(mf <= B.mean_field_upper(a, v, R, form="refined") * (1 + ROUND))


def test_bounded_in_n_and_growth_in_R():
    """The √n saturates at e^B; R enters polynomially: R^2 (cap), R (QK-norm)."""
    n = np.array([1.0, 10.0, 1e3, 1e6, np.inf])
    sc = B.softcap_sqrt_n_upper(1.0, 1.0, 2.0, n, 1.5)
    assert np.all(np.diff(sc) >= 0) and np.isfinite(sc[-1])
    np.testing.assert_allclose(
        sc[-1], B.softcap_mean_field_upper(1.0, 1.0, 2.0, 1.5), rtol=F64_FEW_ULPS
    )
    R = np.array([1e3, 1e4])
    for masked in (False, True):
        s = B.softcap_sqrt_n_upper(0.5, 1.0, R, 64, 2.0, masked=masked)
        q = B.qk_norm_sqrt_n_upper(1.0, 1.0, 1.0, R, 64, 1e-4, 8, scale=0.35, masked=masked)
        assert np.log(s[1] / s[0]) / np.log(10) == pytest.approx(2.0, abs=ASYMPTOTE)
        assert np.log(q[1] / q[0]) / np.log(10) == pytest.approx(1.0, abs=ASYMPTOTE)
    # causal: finite for every n through Hardy's inequality
    assert np.isfinite(B.softcap_sqrt_n_upper(1.0, 1.0, 2.0, np.inf, 1.5, masked=True))


def test_logit_bounds_against_logits(rng):
    """|s| <= B: the capped and QK-normed logits of random inputs, and B approached."""
    for _ in range(20):
        d, k = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        for form in ("softcap", "qk_norm"):
            h = random_head(rng, form, d, k)
            X = ball_points(rng, 6, d, float(rng.choice([0.5, 5.0, 500.0])))
            Xt = torch.as_tensor(X)
            S = head_logits(Xt, Xt, h.params()).abs().max().item()
            if form == "softcap":
                Bv = B.softcap_logit_bound(np.linalg.norm(h.A, 2), radius(X), h.kappa)
            else:
                Bv = B.qk_norm_logit_bound(
                    np.linalg.norm(h.Q, 2), np.linalg.norm(h.K, 2), radius(X), h.eps, k,
                    scale=h.scale, weight_max=np.max(np.abs(h.wq * h.wk)),
                )  # fmt: skip
            assert S <= Bv * (1 + ROUND)
    # attained by the cap at x = y = R u, u the top eigenvector of a PSD A
    assert B.softcap_logit_bound(2.0, 3.0, 1.5) == pytest.approx(1.5 * math.tanh(18.0 / 1.5))


# ---------------------------------------------------------------------------------------------
# the counterexamples: exact growth R^2 and R / sqrt(eps)
# ---------------------------------------------------------------------------------------------

RADII = [0.0, 0.5, 1.0, 10.0, 1e2, 1e3, 1e4]


@pytest.mark.parametrize(("a", "kappa"), [(0.7, 2.0), (1.0, 0.2), (3.0, 8.0)])
def test_softcap_two_token_is_the_exact_jacobian_norm(a, kappa):
    V = 1.4
    h = meanfield.AttentionParams(
        torch.tensor([[a]], dtype=torch.float64),
        torch.tensor([[V]], dtype=torch.float64),
        softcap=kappa,
    )
    for R in RADII:
        X = np.array([[0.0], [R]])
        exact = exact_norm(X, h)
        closed = float(B.softcap_two_token_lower(a, R, kappa, V))
        assert closed == pytest.approx(exact, rel=ROUND), R
        assert closed <= float(B.softcap_sqrt_n_upper(a, V, R, 2, kappa)) * (1 + ROUND)
    # growth R^2, with the slope of the sympy limit
    slope = SB.softcap_two_token().lambdify("slope", (SB.kappa,))(kappa)
    big = np.array([1e4, 1e5])
    val = B.softcap_two_token_lower(a, big, kappa, V) / (V * a * big**2)
    np.testing.assert_allclose(val, slope, rtol=ASYMPTOTE)


@pytest.mark.parametrize(("Q", "K", "scale"), [(1.3, 0.8, 0.9), (0.5, 2.0, 0.25), (2.0, 2.0, 3.0)])
def test_qk_norm_two_token_is_the_exact_jacobian_norm(Q, K, scale):
    for eps in (1e-6, 1e-3, 0.5):
        h = meanfield.AttentionParams(
            None,
            torch.tensor([[1.0]], dtype=torch.float64),
            Q=torch.tensor([[Q]], dtype=torch.float64),
            K=torch.tensor([[K]], dtype=torch.float64),
            q_norm=meanfield.params.RMSNorm(torch.ones(1, dtype=torch.float64), eps),
            k_norm=meanfield.params.RMSNorm(torch.ones(1, dtype=torch.float64), eps),
            logit_scale=scale,
        )
        for R in RADII:
            X = np.array([[0.0], [R]])
            exact = exact_norm(X, h)
            closed = float(B.qk_norm_two_token_lower(Q, K, R, eps, scale=scale))
            assert closed == pytest.approx(exact, rel=ROUND), (eps, R)
            upper = float(B.qk_norm_sqrt_n_upper(Q, K, 1.0, R, 2, eps, 1, scale=scale))
            assert closed <= upper * (1 + ROUND)
    # linear growth with slope ∝ 1/sqrt(eps), from the sympy limit
    slope = SB.qk_norm_two_token().lambdify("slope", (SB.Qs, SB.Ks, SB.eps, SB.sigma))
    for eps in (1e-4, 1e-2):
        R = np.array([1e6, 1e7])
        val = B.qk_norm_two_token_lower(Q, K, R, eps, scale=scale) / R
        np.testing.assert_allclose(val, slope(Q, K, eps, scale), rtol=ASYMPTOTE_FAR)
    ratio = B.qk_norm_two_token_lower(Q, K, 1e7, 1e-6, scale=scale) / B.qk_norm_two_token_lower(
        Q, K, 1e7, 1e-4, scale=scale
    )
    assert ratio == pytest.approx(10.0, rel=ASYMPTOTE)


def test_counterexamples_against_mpmath():
    """The float closed forms against the sympy expression evaluated at 50 digits."""
    sc, qk = sym.softcap_two_token(), sym.qk_norm_two_token()
    sc_mp = sp.lambdify(sc.args, sc.expr, modules="mpmath")
    qk_mp = sp.lambdify(qk.args, qk.expr, modules="mpmath")
    with mp.workdps(50):
        for R in (0.5, 3.0, 40.0, 1e3):
            for a, kappa in ((0.7, 2.0), (2.0, 0.3)):
                truth = sc_mp(mp.mpf(a), mp.mpf(R), mp.mpf(kappa))
                got = B.softcap_two_token_lower(a, R, kappa)
                assert abs(got - truth) <= F64_VS_MPMATH_COND * truth
            truth = qk_mp(*(mp.mpf(v) for v in (1.3, 0.8, R, 1e-3, 0.9)))
            got = B.qk_norm_two_token_lower(1.3, 0.8, R, 1e-3, scale=0.9)
            assert abs(got - truth) <= F64_VS_MPMATH_COND * truth


# ---------------------------------------------------------------------------------------------
# the sympy derivations against the numeric functions
# ---------------------------------------------------------------------------------------------


def test_symbolic_closed_forms_match_numeric():
    sc = sym.softcap_two_token()
    a, R, kappa = np.array([0.3, 1.0, 2.5]), np.array([0.7, 2.0, 9.0]), np.array([0.5, 2.0, 6.0])
    np.testing.assert_allclose(
        sc.func(a, R, kappa), B.softcap_two_token_lower(a, R, kappa), rtol=F64_CLOSED_FORM
    )
    qk = sym.qk_norm_two_token()
    Q, K, e, s = (
        np.array([1.3, 0.5]),
        np.array([0.8, 2.0]),
        np.array([1e-3, 0.5]),
        np.array([0.9, 2.0]),
    )
    R2 = np.array([3.0, 40.0])
    np.testing.assert_allclose(
        qk.func(Q, K, R2, e, s),
        B.qk_norm_two_token_lower(Q, K, R2, e, scale=s),
        rtol=F64_CLOSED_FORM,
    )
    cs = sym.column_sums()
    n, Delta = np.array([1.0, 5.0, 1e4]), np.array([0.5, 3.0, 1.0])
    # R = 0 isolates t1 = sqrt(c(n)) in bounded_logits_upper
    np.testing.assert_allclose(
        B.bounded_logits_upper(1.0, 0.0, n, Delta / 2, 0.0, 0.0),
        np.sqrt(cs.func(n, Delta)),
        rtol=F64_REWRITTEN,
    )
    lim = float(cs.extras["limit"].subs(SB.Delta, 3.0))
    assert float(B.bounded_logits_upper(1.0, 0.0, np.inf, 1.5, 0.0, 0.0)) ** 2 == pytest.approx(
        lim, rel=F64_REWRITTEN
    )
    causal = cs.lambdify("causal_integral", (SB.n, SB.Delta))
    got = B.bounded_logits_upper(1.0, 0.0, n, Delta / 2, 0.0, 0.0, masked=True) ** 2
    np.testing.assert_allclose(
        got,
        np.minimum(np.minimum(n, 1 + causal(n, Delta)), 4 * np.exp(2 * Delta)),
        rtol=F64_REWRITTEN_EXP,
    )


def test_rms_normalisation_derivative_against_finite_differences(rng):
    d = sym.rms_normalisation()
    for _ in range(10):
        kk, e = int(rng.integers(1, 5)), float(rng.choice([1e-3, 0.1, 1.0]))
        z = rng.standard_normal(kk) * float(rng.choice([0.01, 1.0, 30.0]))

        def r(u, kk=kk, e=e):
            return u / np.sqrt(u @ u / kk + e)

        J = np.stack([(r(z + 1e-6 * c) - r(z - 1e-6 * c)) / 2e-6 for c in np.eye(kk)], axis=1)
        t = float(np.linalg.norm(z))
        # k >= 2: ||DN|| = 1/r (tangential); k = 1 has only the radial eigenvalue eps/r^3 <= 1/r
        radial = d.lambdify("radial", (SB.t, SB.k, SB.eps))(t, kk, e)
        expected = d.func(t, kk, e) if kk >= 2 else radial
        assert np.linalg.norm(J, 2) == pytest.approx(expected, rel=FD_REL)
        assert radial <= d.func(t, kk, e)
        assert np.linalg.norm(r(z)) == pytest.approx(
            d.lambdify("nu", (SB.t, SB.k, SB.eps))(t, kk, e), rel=F64_CLOSED_FORM
        )
    assert d.extras["sup_derivative"] == 1 / sp.sqrt(SB.eps)


# ---------------------------------------------------------------------------------------------
# multi-head, windows, inputs
# ---------------------------------------------------------------------------------------------


def test_multihead_sum_rule_with_capped_heads(rng):
    for _ in range(10):
        d, n = 3, 4
        heads = [random_head(rng, "softcap", d, 2) for _ in range(2)]
        for h in heads:
            h.window = None
        W_O = rng.standard_normal((d, 4))
        params = meanfield.MultiHeadParams(
            tuple(h.params() for h in heads), W_O=torch.as_tensor(W_O, dtype=torch.float64)
        )
        X = ball_points(rng, n, d, 4.0)
        exact = float(torch.linalg.matrix_norm(jacobian(X, params, masked=True), ord=2))
        per_head = [ball_bound(h, radius(X), n, masked=True) for h in heads]
        W_norms = [np.linalg.norm(W_O[:, 2 * i : 2 * i + 2], 2) for i in range(2)]
        assert exact <= B.multihead_upper(per_head, W_norms=W_norms) * (1 + ROUND)


def test_window_counts():
    """n replaced by min(n, W) (causal) or min(n, 2W - 1) (symmetric)."""
    v, a, R = 1.0, 0.5, 2.0
    theta = a * R**2
    for n, W in ((10, 3), (3, 10), (100, 1)):
        for masked, c in ((True, min(n, W)), (False, min(n, 2 * W - 1))):
            got = B.window_sqrt_n_upper(a, v, R, n, W, masked=masked)
            assert got == pytest.approx(v * (math.sqrt(c) * (1 + theta) + theta), rel=F64_FEW_ULPS)
    assert B.window_sqrt_n_upper(a, v, R, np.inf, 4, masked=True) == B.window_sqrt_n_upper(
        a, v, R, 4, 4, masked=True
    )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: B.softcap_sqrt_n_upper(1, 1, 1, 4, 0.0), "kappa must be > 0"),
        (lambda: B.softcap_sqrt_n_upper(1, 1, 1, 0, 1.0), "n must be >= 1"),
        (lambda: B.qk_norm_sqrt_n_upper(1, 1, 1, 1, 4, 0.0, 2), "eps must be > 0"),
        (lambda: B.qk_norm_logit_bound(1, 1, 1, 1e-3, 1.5), "k must be integer-valued"),
        (lambda: B.window_sqrt_n_upper(1, 1, 1, 4, 0), "window must be >= 1"),
        (lambda: B.bounded_logits_upper(1, 1, 4, -1.0, 1, 1), "logit_bound must be >= 0"),
        (
            lambda: B.bounded_logits_local_upper(np.zeros((2, 2)), np.eye(2), eps=1e-3),
            "needs Q and K",
        ),
        (lambda: B.bounded_logits_local_upper(np.zeros((2, 2)), np.eye(2)), "give A, or Q and K"),
        (lambda: B.softcap_two_token_lower(0.0, 1.0, 1.0), "a must be > 0"),
    ],
)
def test_invalid_inputs_raise_one_line_errors(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
