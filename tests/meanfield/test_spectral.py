"""Spectral drivers and certificates: Gram iteration, Cholesky check, Collatz–Wielandt, rank one."""

from __future__ import annotations

import math

import pytest
import torch

from meanfield._spectral import (
    certify_upper,
    collatz_wielandt_bound,
    gram_iteration,
    gram_sequence,
    lanczos_svd,
    power_iteration,
    rank_one_sigma_max,
    spectral_norm_upper,
    top_singular_value,
)

from ..tolerances import (
    CERT_GAP,
    F64_LANCZOS,
    F64_LANCZOS_GAP,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    F64_SMALL_DIFFERENCE,
    F64_SQRT_CANCELLATION,
    F64_TINY_DIFFERENCE,
    GRAM_CERT_DEFAULT,
)

D64 = torch.float64


def _ops(M: torch.Tensor):
    def mv(v):
        return (M @ v.unsqueeze(-1)).squeeze(-1)

    def rmv(u):
        return (M.mT @ u.unsqueeze(-1)).squeeze(-1)

    return mv, rmv


def _with_spectrum(gen, p, q, s):
    """A p x q matrix with singular values ``s`` (a list of length min(p, q))."""
    U, _ = torch.linalg.qr(torch.randn(p, p, generator=gen, dtype=D64))
    V, _ = torch.linalg.qr(torch.randn(q, q, generator=gen, dtype=D64))
    k = len(s)
    return U[:, :k] @ torch.diag(torch.tensor(s, dtype=D64)) @ V[:, :k].mT


@pytest.mark.parametrize("shape", [(7, 7), (9, 4), (4, 9), (3, 6, 5)])
def test_gram_monotone_and_bracketed(gen, shape):
    W = torch.randn(*shape, generator=gen, dtype=D64)
    T = 8
    seq = gram_sequence(W, T)
    sigma1 = torch.linalg.matrix_norm(W, 2)
    r = min(shape[-2:])
    assert seq.shape == (T + 1,) + tuple(shape[:-2]) and seq.dtype == D64
    assert bool((seq[1:] <= seq[:-1] * (1 + F64_REDUCTION)).all())
    for t in range(T + 1):
        assert bool((seq[t] >= sigma1 * (1 - F64_REDUCTION)).all())
        assert bool((seq[t] <= sigma1 * r ** (2.0 ** -(t + 1)) * (1 + F64_REDUCTION)).all())
    torch.testing.assert_close(gram_iteration(W, T), seq[-1], rtol=0, atol=0)


def test_gram_equals_schatten_norm(gen):
    W = torch.randn(6, 5, generator=gen, dtype=D64)
    s = torch.linalg.svdvals(W)
    for t in range(5):
        p = 2.0 ** (t + 1)
        expected = s.pow(p).sum().pow(1 / p)
        torch.testing.assert_close(gram_sequence(W, t)[-1], expected, rtol=F64_REDUCTION, atol=0)


def test_gram_rank_bound_is_attained_for_flat_spectrum(gen):
    """All singular values equal: Schatten norm = r^(2^-(T+1)) sigma1 exactly."""
    r = 5
    W = 3.0 * _with_spectrum(gen, 8, 6, [1.0] * r)
    for t in range(6):
        torch.testing.assert_close(
            gram_sequence(W, t)[-1],
            torch.tensor(3.0 * r ** (2.0 ** -(t + 1)), dtype=D64),
            rtol=F64_REDUCTION,
            atol=0,
        )


def test_gram_handles_huge_and_zero_matrices(gen):
    W = 1e200 * torch.randn(5, 5, generator=gen, dtype=D64)
    val = gram_iteration(W, 12)
    assert math.isfinite(float(val))
    assert float(val) >= float(torch.linalg.matrix_norm(W, 2)) * (1 - F64_REDUCTION)
    assert float(gram_iteration(torch.zeros(3, 4, dtype=D64), 5)) == 0.0


def test_certify_upper(gen):
    W = torch.randn(3, 12, 8, generator=gen, dtype=D64)
    s1 = torch.linalg.matrix_norm(W, 2)
    assert bool(certify_upper(W, s1 * (1 + 1e-8)).all())
    assert not bool(certify_upper(W, s1 * (1 - 1e-8)).any())
    assert bool(certify_upper(W, torch.full_like(s1, math.inf)).all())
    assert not bool(certify_upper(W, torch.full_like(s1, math.nan)).any())
    assert bool(certify_upper(torch.zeros(4, 3, dtype=D64), 0.0))
    assert not bool(certify_upper(W[0], 0.0))


@pytest.mark.parametrize("spectrum", [[5.0, 4.0, 1.0], [2.0, 2.0, 2.0, 0.5], [1.0, 1.0 - 1e-9]])
def test_spectral_norm_upper_is_tight_and_certified(gen, spectrum):
    W = _with_spectrum(gen, 9, 7, spectrum)
    s1 = max(spectrum)
    up = spectral_norm_upper(W)
    assert s1 <= float(up) <= s1 * (1 + CERT_GAP)
    up_c = spectral_norm_upper(W, candidate=torch.linalg.matrix_norm(W, 2), max_iter=0)
    assert s1 <= float(up_c) <= s1 * (1 + CERT_GAP)


def test_spectral_norm_upper_rejects_a_wrong_candidate(gen):
    W = _with_spectrum(gen, 6, 6, [3.0, 1.0])
    up = spectral_norm_upper(W, candidate=torch.tensor(1.0, dtype=D64), max_iter=3)
    assert float(up) >= 3.0


def test_collatz_wielandt_bounds_nonnegative_matrices(gen):
    cases = [
        torch.rand(20, 7, 7, generator=gen, dtype=D64),
        torch.rand(20, 9, 4, generator=gen, dtype=D64).square() ** 3,  # spread entries
        torch.rand(20, 6, 6, generator=gen, dtype=D64).tril(),  # reducible (masked blocks)
    ]
    zero_col = torch.rand(20, 5, 5, generator=gen, dtype=D64)
    zero_col[..., 2] = 0
    zero_col[..., 3, :] = 0
    cases.append(zero_col)
    for N in cases:
        exact = torch.linalg.matrix_norm(N, 2)
        cw0 = collatz_wielandt_bound(N, 0)
        cw = collatz_wielandt_bound(N, 64)
        assert bool((cw0 >= exact).all()) and bool((cw >= exact).all())
        assert bool((cw <= cw0).all())
    positive = cases[0]
    ratio = collatz_wielandt_bound(positive, 200) / torch.linalg.matrix_norm(positive, 2)
    assert float(ratio.max()) < 1 + GRAM_CERT_DEFAULT


def test_collatz_wielandt_rejects_negative_entries():
    with pytest.raises(ValueError, match="nonnegative"):
        collatz_wielandt_bound(torch.tensor([[1.0, -1.0]], dtype=D64))


@pytest.mark.parametrize("d", [1, 2, 3, 7])
def test_rank_one_closed_form_against_svd(gen, d):
    a = 3 * torch.randn(50, d, generator=gen, dtype=D64)
    b = torch.randn(50, d, generator=gen, dtype=D64)
    M = torch.eye(d, dtype=D64) + a.unsqueeze(-1) * b.unsqueeze(-2)
    torch.testing.assert_close(
        rank_one_sigma_max(a, b),
        torch.linalg.matrix_norm(M, 2),
        rtol=F64_REDUCTION,
        atol=F64_REDUCTION,
    )


def test_rank_one_closed_form_special_cases():
    u = torch.tensor([0.6, 0.8], dtype=D64)
    # reflection I - 2uu^T: every singular value is 1
    torch.testing.assert_close(
        rank_one_sigma_max(-2 * u, u),
        torch.tensor(1.0, dtype=D64),
        rtol=F64_SQRT_CANCELLATION,
        atol=0,
    )
    # orthogonal a, b: sigma_max = (1 + s^2/2 + s sqrt(1 + s^2/4))^(1/2) with s = |a||b|
    a, b = torch.tensor([2.0, 0.0], dtype=D64), torch.tensor([0.0, 1.5], dtype=D64)
    s = 3.0
    expected = math.sqrt(1 + s**2 / 2 + s * math.sqrt(1 + s**2 / 4))
    assert abs(float(rank_one_sigma_max(a, b)) - expected) < F64_REWRITTEN_EXP
    assert (
        float(rank_one_sigma_max(torch.tensor([-3.0], dtype=D64), torch.tensor([1.0], dtype=D64)))
        == 2.0
    )


def test_lanczos_matches_svd_batched(gen):
    M = torch.randn(4, 30, 20, generator=gen, dtype=D64)
    exact = torch.linalg.matrix_norm(M, 2)
    x0 = torch.randn(4, 20, generator=gen, dtype=D64)
    tol = 1e-10  # the residual rule, checked below
    res = lanczos_svd(*_ops(M), x0, tol=tol)
    assert res.sigma.shape == (4,) and res.vector.shape == (4, 20)
    assert bool(res.converged.all())
    torch.testing.assert_close(res.sigma, exact, rtol=F64_LANCZOS, atol=0)
    assert bool((res.sigma <= exact * (1 + F64_REDUCTION)).all())  # a lower bound
    assert bool((res.residual <= tol * res.sigma.square()).all())
    # the residual reported is the explicit one for the returned vector
    Jv = (M @ res.vector.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(Jv.norm(dim=-1), res.sigma, rtol=F64_REWRITTEN, atol=0)
    assert bool((res.n_matvec == 2 * res.n_iter + 2).all())  # no restart: 2 per step, 2 checks


def test_lanczos_restarts_and_degenerate_top(gen):
    M = _with_spectrum(gen, 40, 40, [3.0, 3.0] + [2.9 - 0.05 * k for k in range(38)])
    res = lanczos_svd(
        *_ops(M), torch.randn(40, generator=gen, dtype=D64), tol=1e-10, krylov_dim=4, max_iter=2000
    )
    assert bool(res.converged)
    assert abs(float(res.sigma) - 3.0) < F64_LANCZOS


def test_lanczos_reports_non_convergence(gen):
    M = _with_spectrum(gen, 50, 50, [1.0 - 0.01 * k for k in range(50)])
    res = lanczos_svd(*_ops(M), torch.randn(50, generator=gen, dtype=D64), tol=1e-12, max_iter=2)
    assert not bool(res.converged)
    assert float(res.sigma) <= 1.0 + F64_REDUCTION


def test_zero_operator():
    M = torch.zeros(3, 5, 4, dtype=D64)
    x0 = torch.ones(3, 4, dtype=D64)
    for method in ("lanczos", "power"):
        res = top_singular_value(*_ops(M), x0, method=method)
        assert bool((res.sigma == 0).all()) and bool(res.converged.all())


def test_power_iteration_matches_svd_and_lanczos(gen):
    s = [4.0, 3.6] + [1.0] * 10
    M = torch.stack([_with_spectrum(gen, 15, 12, s) for _ in range(3)])
    x0 = torch.randn(3, 12, generator=gen, dtype=D64)
    pw = power_iteration(*_ops(M), x0, tol=1e-10, max_iter=5000)
    lz = lanczos_svd(*_ops(M), x0, tol=1e-10)
    assert bool(pw.converged.all())
    torch.testing.assert_close(
        pw.sigma, torch.full((3,), 4.0, dtype=D64), rtol=F64_LANCZOS_GAP, atol=0
    )
    torch.testing.assert_close(pw.sigma, lz.sigma, rtol=F64_LANCZOS_GAP, atol=0)
    assert bool((pw.n_iter > lz.n_iter).all())  # Lanczos needs fewer iterations
    assert pw.history.shape[1:] == (3,)


def test_start_vector_validation():
    M = torch.eye(3, dtype=D64)
    with pytest.raises(ValueError, match="nonzero"):
        lanczos_svd(*_ops(M), torch.zeros(3, dtype=D64))
    with pytest.raises(ValueError, match="method"):
        top_singular_value(*_ops(M), torch.ones(3, dtype=D64), method="lobpcg")


def test_power_iteration_converged_means_residual_rule(gen):
    """``converged`` is the explicit residual rule, and then sigma^2 is within tol of an
    eigenvalue of M^T M; a stalled iteration whose estimates no longer move is not converged."""
    s = [1.0, 0.99999] + [0.5] * 8
    M = _with_spectrum(gen, 10, 10, s)
    _, _, Vh = torch.linalg.svd(M)
    for x0 in (Vh[1] + 1e-6 * Vh[0], Vh[0] + Vh[1], torch.randn(10, generator=gen, dtype=D64)):
        for max_iter, tol in ((50, 1e-7), (20000, 1e-10)):
            res = power_iteration(*_ops(M), x0, tol=tol, max_iter=max_iter)
            v = res.vector
            Jv = M @ v
            explicit = torch.linalg.vector_norm(M.mT @ Jv - Jv.square().sum() * v)
            assert bool(res.converged) == bool(
                explicit <= tol * res.sigma**2 * (1 + F64_SMALL_DIFFERENCE)
            )
            if bool(res.converged):  # sigma^2 near *some* eigenvalue of M^T M
                gaps = (torch.tensor(s, dtype=D64).square() - res.sigma**2).abs()
                assert float(gaps.min()) <= tol * float(res.sigma) ** 2 * (1 + F64_TINY_DIFFERENCE)
    # equal mix of the two top directions: the estimate stalls (relative change far below tol,
    # where the released rule stopped) while the residual stays ~1e-5: not converged
    short_tol = 1e-7
    short = power_iteration(*_ops(M), Vh[0] + Vh[1], tol=short_tol, max_iter=50)
    hist = short.history
    assert hist.shape[0] == 50
    assert float((hist[-1] - hist[-2]).abs()) <= short_tol * float(hist[-1])
    assert not bool(short.converged)


def test_lanczos_non_finite_products_do_not_raise(gen):
    """An operator that overflows: no LinAlgError, the element is reported unconverged."""
    M = torch.stack([_with_spectrum(gen, 6, 6, [2.0, 1.0, 0.5, 0.2, 0.1, 0.05])] * 2)
    M[1, 0, 0] = math.inf
    x0 = torch.randn(2, 6, generator=gen, dtype=D64)
    res = lanczos_svd(*_ops(M), x0, tol=1e-10)
    assert bool(res.converged[0]) and not bool(res.converged[1])
    assert abs(float(res.sigma[0]) - 2.0) < F64_LANCZOS
