"""Certified Gram-iteration bounds for convolutional layers (meanfield/convolution.py).

Oracles: dense SVDs of the unrolled operator, built here by applying ``F.conv2d`` to the basis
vectors (independently of ``conv2d_operator``); an mpmath evaluation of the frequency blocks; the
FFT of the kernel; invariances.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
import torch.nn.functional as F

from meanfield.convolution import (
    conv2d_frequency_blocks,
    conv2d_operator,
    conv2d_spectral_upper,
    gram_iteration_complex,
    module_spectral_upper,
    zero_padding_grid,
)
from tests import mpmath_oracle as oracle

from ..tolerances import (
    BRACKET_MARGIN,
    DIFFERS,
    F32_FORWARD,
    F64_LONG_CHAIN,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_REWRITTEN_EXP,
    GRAM_CERT,
    GRAM_CERT_DEFAULT,
    GRAM_CERT_EXACT,
    GRAM_CERT_SVD,
)


def _kernel(co, ci, kh, kw, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(co, ci, kh, kw, generator=g, dtype=torch.float64).to(dtype)


def _unrolled(K, size, padding, pad=None):
    """Dense matrix of the layer: column j is the layer applied to the j-th basis image."""
    co, ci, kh, kw = K.shape
    h, w = size
    E = torch.eye(ci * h * w, dtype=K.dtype).reshape(-1, ci, h, w)
    if padding == "circular":
        x = F.pad(E, (kw // 2, kw // 2, kh // 2, kh // 2), mode="circular")
        Y = F.conv2d(x, K)
    else:
        ph, pw = (kh // 2, kw // 2) if pad is None else pad
        Y = F.conv2d(E, K, padding=(ph, pw))
    return Y.reshape(ci * h * w, -1).T  # (n_out, n_in)


def _sigma(M):
    return float(torch.linalg.matrix_norm(M.to(torch.float64), ord=2))


CASES = [  # (c_out, c_in, kh, kw, h, w, seed)
    (2, 2, 3, 3, 5, 5, 0),
    (3, 2, 3, 3, 6, 6, 1),
    (2, 4, 3, 3, 7, 7, 2),
    (4, 4, 3, 3, 8, 8, 3),
    (3, 3, 3, 5, 5, 7, 4),  # non-square kernel and input
    (4, 2, 5, 5, 6, 8, 5),
]


@pytest.mark.parametrize("case", CASES)
def test_circular_against_dense_svd(case):
    co, ci, kh, kw, h, w, seed = case
    K = _kernel(co, ci, kh, kw, seed)
    exact = _sigma(_unrolled(K, (h, w), "circular"))
    r = conv2d_spectral_upper(K, (h, w), padding="circular", n_iter=6, exact=True)
    assert r.certified and r.grid == (h, w)
    assert float(r.circular_exact) == pytest.approx(exact, rel=F64_LONG_CHAIN)
    assert float(r.upper) >= exact
    # with the SVD candidate the certificate is tight up to the rounding margins
    assert float(r.upper) <= exact * (1 + GRAM_CERT_SVD)
    # Gram alone (no SVD): a certified bound, above the exact value
    g = conv2d_spectral_upper(K, (h, w), padding="circular", n_iter=3)
    assert g.certified and float(g.upper) >= exact
    assert float(g.upper) >= float(g.gram)


@pytest.mark.parametrize("case", CASES)
def test_circular_gram_converges_to_exact(case):
    co, ci, kh, kw, h, w, seed = case
    K = _kernel(co, ci, kh, kw, seed)
    exact = _sigma(_unrolled(K, (h, w), "circular"))
    ups = [float(conv2d_spectral_upper(K, (h, w), n_iter=t).upper) for t in (0, 1, 2, 3, 5, 8, 12)]
    assert all(u >= exact for u in ups)
    # Schatten 2^(T+1) norms decrease with T (up to the ~1e-13 rounding margins)
    assert all(b <= a * (1 + F64_REDUCTION) for a, b in zip(ups, ups[1:]))
    assert ups[0] > exact * (1 + DIFFERS)  # T = 0 (Frobenius) is loose on these layers
    assert ups[-1] <= exact * (1 + GRAM_CERT)


@pytest.mark.parametrize("case", CASES)
def test_zero_padding_against_dense_svd(case):
    co, ci, kh, kw, h, w, seed = case
    K = _kernel(co, ci, kh, kw, seed)
    for pad in [None, (0, 0), (kh - 1, kw - 1), (1, 0), (kh, kw + 1)]:
        exact = _sigma(_unrolled(K, (h, w), "zeros", pad))
        r = conv2d_spectral_upper(K, (h, w), padding="zeros", pad=pad, n_iter=8, exact=True)
        assert r.certified
        assert float(r.upper) >= exact
        # the bound is the circular norm on the enlarged grid: check that value independently
        circ = _sigma(_unrolled(K, r.grid, "circular")) if kh % 2 and kw % 2 else None
        if circ is not None:
            assert float(r.circular_exact) == pytest.approx(circ, rel=F64_LONG_CHAIN)
        assert float(r.upper) <= float(r.circular_exact) * (1 + GRAM_CERT_SVD)


@pytest.mark.parametrize("case", CASES[:4])
def test_zero_padded_operator_is_a_submatrix_of_the_circular_one(case):
    """The embedding behind the zero-padding bound (docs/derivations/gram_convolution.md §3)."""
    co, ci, kh, kw, h, w, seed = case
    K = _kernel(co, ci, kh, kw, seed)
    for pad in [(1, 1), (0, 2), (2, 0), (kh, kw + 1)]:
        Z = _unrolled(K, (h, w), "zeros", pad)
        N = zero_padding_grid((kh, kw), (h, w), pad)
        # circular correlation on the N grid with taps at offset -p: y[i] = sum_a K[a] x[i + a - p]
        E = torch.zeros(ci, *N, ci * h * w, dtype=K.dtype)
        E[:, :h, :w, :] = torch.eye(ci * h * w, dtype=K.dtype).reshape(ci, h, w, -1)
        X = torch.roll(E.permute(3, 0, 1, 2), shifts=(pad[0], pad[1]), dims=(2, 3))
        Xp = F.pad(X, (0, kw - 1, 0, kh - 1), mode="circular")  # taps start at -p
        Yc = F.conv2d(Xp, K)  # (n_in, co, N_h, N_w)
        ho, wo = h + 2 * pad[0] - kh + 1, w + 2 * pad[1] - kw + 1
        sub = Yc[:, :, :ho, :wo].reshape(ci * h * w, -1).T
        torch.testing.assert_close(sub, Z, rtol=0, atol=F64_REDUCTION)


def test_float32_kernel_is_certified_for_the_stored_values():
    K32 = _kernel(4, 3, 3, 3, 7, dtype=torch.float32)
    K64 = K32.to(torch.float64)  # the same numbers, exactly
    for padding in ("circular", "zeros"):
        exact = _sigma(_unrolled(K64, (6, 6), padding))
        r = conv2d_spectral_upper(K32, (6, 6), padding=padding, n_iter=12)
        assert r.certified and r.upper.dtype == torch.float64
        assert r.per_frequency.dtype == torch.float32
        assert float(r.upper) >= exact
        if padding == "circular":
            assert float(r.upper) <= exact * (1 + F32_FORWARD)
        r64 = conv2d_spectral_upper(K64, (6, 6), padding=padding, n_iter=12)
        assert float(r.upper) == pytest.approx(float(r64.upper), rel=F32_FORWARD)


def test_blocks_match_the_fft_and_their_error_bound_holds():
    K = _kernel(3, 2, 3, 3, 11)
    blocks, eta = conv2d_frequency_blocks(K, (6, 7))
    assert blocks.shape == (6, 7 // 2 + 1, 3, 2) and blocks.dtype == torch.complex128
    full = torch.fft.fft2(K, s=(6, 7)).permute(2, 3, 0, 1)  # same sign convention
    torch.testing.assert_close(blocks, full[:, : 7 // 2 + 1], rtol=0, atol=F64_REWRITTEN_EXP)
    # the mirrored half: conjugate blocks
    torch.testing.assert_close(
        full[1:, 4:], full[1:, 1:4].flip(0, 1).conj(), rtol=0, atol=F64_REWRITTEN_EXP
    )
    # exact blocks with mpmath (40 digits) on a few frequencies: error <= eta
    mpmath.mp.dps = 40
    Kl = K.tolist()
    for w1, w2 in [(0, 0), (1, 2), (5, 3), (3, 1)]:
        Zt = []
        for o in range(3):
            row = []
            for c in range(2):
                s = mpmath.mpc(0)
                for a in range(3):
                    for b in range(3):
                        s += mpmath.mpf(Kl[o][c][a][b]) * mpmath.expjpi(
                            -2 * mpmath.mpf(w1 * a) / 6 - 2 * mpmath.mpf(w2 * b) / 7
                        )
                row.append(s)
            Zt.append(row)
        D = [
            [abs(Zt[o][c] - mpmath.mpc(complex(blocks[w1, w2, o, c]))) for c in range(2)]
            for o in range(3)
        ]
        err = float(mpmath.sqrt(sum(d**2 for r_ in D for d in r_)))  # Frobenius >= 2-norm
        assert err <= eta
    assert eta < F64_REDUCTION * float(K.abs().sum())


def test_gram_iteration_complex_against_svd():
    g = torch.Generator().manual_seed(3)
    Z = torch.complex(
        torch.randn(10, 5, 3, generator=g, dtype=torch.float64),
        torch.randn(10, 5, 3, generator=g, dtype=torch.float64),
    )
    s = torch.linalg.matrix_norm(Z, ord=2)
    prev = None
    for t in range(0, 9):
        v = gram_iteration_complex(Z, t)
        sv = torch.linalg.svdvals(Z)
        p = 2.0 ** (t + 1)
        top = sv[..., :1]
        schatten = top[..., 0] * (sv / top).pow(p).sum(-1).pow(1 / p)  # no overflow
        torch.testing.assert_close(v, schatten, rtol=F64_REDUCTION, atol=0)
        assert bool((v >= s * (1 - F64_REWRITTEN)).all())
        if prev is not None:
            assert bool((v <= prev * (1 + F64_REWRITTEN)).all())
        prev = v
    # wide matrices are transposed (conjugate) to the smaller side: same value
    torch.testing.assert_close(gram_iteration_complex(Z.mH, 4), gram_iteration_complex(Z, 4))


def test_scaling_and_zero_kernel():
    K = _kernel(3, 3, 3, 3, 13)
    a = float(conv2d_spectral_upper(K, 6, n_iter=5).upper)
    b = float(conv2d_spectral_upper(1e-3 * K, 6, n_iter=5).upper)
    assert b == pytest.approx(1e-3 * a, rel=F64_REDUCTION)
    z = conv2d_spectral_upper(torch.zeros(2, 3, 3, 3, dtype=torch.float64), 5)
    assert z.certified and float(z.upper) == 0.0


def test_transposed_kernel_same_norm():
    """The adjoint layer (channels swapped, taps flipped) has the same norm."""
    K = _kernel(4, 2, 3, 3, 17)
    Kt = K.transpose(0, 1).flip(-1, -2)
    r1 = conv2d_spectral_upper(K, 7, exact=True)
    r2 = conv2d_spectral_upper(Kt, 7, exact=True)
    assert float(r1.circular_exact) == pytest.approx(float(r2.circular_exact), rel=F64_REDUCTION)


@pytest.mark.parametrize("padding", ["circular", "zeros"])
def test_operator_and_adjoint(padding):
    K = _kernel(3, 2, 3, 3, 19)
    mv, rmv, n_in, n_out = conv2d_operator(K, (5, 6), padding=padding)
    M = _unrolled(K, (5, 6), padding)
    assert M.shape == (n_out, n_in)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, n_in, generator=g, dtype=torch.float64)
    y = torch.randn(4, n_out, generator=g, dtype=torch.float64)
    torch.testing.assert_close(mv(x), x @ M.T)
    torch.testing.assert_close(rmv(y), y @ M)


def test_module_dispatch():
    torch.manual_seed(0)
    lin = torch.nn.Linear(7, 5).double()
    u = float(module_spectral_upper(lin))
    s = _sigma(lin.weight.detach())
    assert s <= u <= s * (1 + GRAM_CERT_DEFAULT)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1).double()
    Kc = conv.weight.detach()
    uz = float(module_spectral_upper(conv, (6, 6), n_iter=8))
    assert uz >= _sigma(_unrolled(Kc, (6, 6), "zeros"))
    circ = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular").double()
    uc = float(module_spectral_upper(circ, 6, n_iter=12))
    ec = _sigma(_unrolled(circ.weight.detach(), (6, 6), "circular"))
    assert ec <= uc <= ec * (1 + GRAM_CERT_DEFAULT)
    with pytest.raises(NotImplementedError, match="stride"):
        module_spectral_upper(torch.nn.Conv2d(3, 4, 3, stride=2), 8)
    with pytest.raises(ValueError, match="input_size"):
        module_spectral_upper(conv)
    with pytest.raises(TypeError):
        module_spectral_upper(torch.nn.ReLU())


def test_errors():
    K = _kernel(2, 2, 3, 3, 0)
    with pytest.raises(NotImplementedError, match="stride 1"):
        conv2d_spectral_upper(K, 8, stride=2)
    with pytest.raises(ValueError, match="padding"):
        conv2d_spectral_upper(K, 8, padding="reflect")
    with pytest.raises(ValueError, match="pad applies"):
        conv2d_spectral_upper(K, 8, pad=1)
    with pytest.raises(ValueError, match="shape"):
        conv2d_spectral_upper(K[0], 8)
    with pytest.raises(ValueError, match="no output"):
        conv2d_spectral_upper(_kernel(2, 2, 5, 5, 0), 2, padding="zeros", pad=0)
    assert zero_padding_grid(3, 32, 1) == (33, 33)
    assert zero_padding_grid((3, 5), (8, 9), (0, 4)) == (8, 13)
    assert zero_padding_grid((3, 3), (8, 9), (0, 4)) == (8, 15)  # pad > k - 1
    assert math.isfinite(float(conv2d_spectral_upper(K, 8).upper))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_device_follows_kernel():
    K = _kernel(8, 8, 3, 3, 23)
    r_cpu = conv2d_spectral_upper(K, 10, n_iter=8)
    for dt in (torch.float64, torch.float32):
        r = conv2d_spectral_upper(K.to(dtype=dt, device="cuda"), 10, n_iter=8)
        assert r.upper.device.type == "cuda" and r.per_frequency.device.type == "cuda"
        assert r.certified
        assert float(r.upper) == pytest.approx(float(r_cpu.upper), rel=F32_FORWARD)


def test_kernel_wider_than_grid_aliases_and_half_precision():
    K = _kernel(2, 3, 5, 5, 29)
    exact = _sigma(_unrolled(K, (3, 3), "circular"))  # 5x5 taps on a 3x3 torus
    r = conv2d_spectral_upper(K, 3, n_iter=10)
    assert r.certified and exact <= float(r.upper) <= exact * (1 + GRAM_CERT)
    Kb = K.to(torch.bfloat16)
    rb = conv2d_spectral_upper(Kb, 6, n_iter=8)
    eb = _sigma(_unrolled(Kb.to(torch.float64), (6, 6), "circular"))
    assert rb.certified and rb.per_frequency.dtype == torch.bfloat16
    assert eb <= float(rb.upper) <= eb * (1 + F32_FORWARD)


@pytest.mark.parametrize("case", CASES)
def test_reshaped_kernel_bound_holds_for_every_padding_and_stride(case):
    from meanfield.convolution import conv2d_reshaped_upper

    co, ci, kh, kw, h, w, seed = case
    K = _kernel(co, ci, kh, kw, seed)
    ub = float(conv2d_reshaped_upper(K))
    assert ub >= _sigma(_unrolled(K, (h, w), "circular"))
    for pad in [(0, 0), (kh // 2, kw // 2), (kh, kw + 1)]:
        assert ub >= _sigma(_unrolled(K, (h, w), "zeros", pad))
    # stride 2: a subsampling of the stride-1 outputs
    E = torch.eye(ci * h * w, dtype=K.dtype).reshape(-1, ci, h, w)
    M2 = F.conv2d(E, K, stride=2, padding=(kh // 2, kw // 2)).reshape(ci * h * w, -1).T
    assert ub >= _sigma(M2)
    # the four reshapes, checked with a naive loop for the first one
    R1 = torch.zeros(co * kh, ci * kw, dtype=K.dtype)
    for o in range(co):
        for a in range(kh):
            for c in range(ci):
                for b in range(kw):
                    R1[o * kh + a, c * kw + b] = K[o, c, a, b]
    assert ub <= math.sqrt(kh * kw) * _sigma(R1) * (1 + GRAM_CERT_DEFAULT)
    # looser than the circular Gram bound on large grids (sampled symbol <= reshaped bound)
    assert ub >= float(conv2d_spectral_upper(K, 16, exact=True).circular_exact)


# ------------------------------------------------- range: kernels from 1e-300 to 1e300 (§4.4)
def _mp_layer_norm(K, size, padding="circular"):
    """50-digit norm of the dense layer, built by loops from the stored entries (read exactly),
    on the kernel scaled by the exact power of two that brings its largest entry into [1/2, 1)."""
    co, ci, kh, kw = K.shape
    h, w = size
    ph, pw = kh // 2, kw // 2
    ho, wo = (h, w) if padding == "circular" else (h + 2 * ph - kh + 1, w + 2 * pw - kw + 1)
    vals = K.tolist()
    e = math.frexp(float(K.abs().max()))[1]
    with mpmath.workdps(oracle.DPS):
        J = mpmath.zeros(co * ho * wo, ci * h * w)
        for o in range(co):
            for i in range(ho):
                for j in range(wo):
                    for c in range(ci):
                        for a in range(kh):
                            for b in range(kw):
                                y, x = i + a - ph, j + b - pw
                                if padding == "circular":
                                    y, x = y % h, x % w
                                elif not (0 <= y < h and 0 <= x < w):
                                    continue
                                J[(o * ho + i) * wo + j, (c * h + y) * w + x] += mpmath.ldexp(
                                    mpmath.mpf(vals[o][c][a][b]), -e
                                )
        return mpmath.ldexp(oracle.spectral_norm(J), e)


def _times_pow2(K, k):
    """``K * 2**k`` in two exact steps (the factor alone may not be representable)."""
    return (K * 2.0 ** (k // 2)) * 2.0 ** (k - k // 2)


_BASE = (3, 2, 3, 3, 41)  # kernel of the extreme-magnitude instances, on a 4 x 4 input
_SIZE = (4, 4)


def _extreme_kernel(name):
    """(kernel, k): the base kernel times 2**k, k chosen so that its circular norm (8.50 for the
    base kernel) is about the named magnitude; the "mixed" instances also hold entries far below
    the largest one (exact in the stored kernel; scaled into the subnormals, or subnormal)."""
    K0 = _kernel(*_BASE)
    target, mix = {
        "1e153": (1e153, None),
        "1e200": (1e200, None),
        "1e300": (1e300, None),
        "1e300-with-entries-1e-12": (1e300, 1e-12),
        "1e-300": (1e-300, None),
        "1e-310-subnormal": (1e-310, None),
    }[name]
    k = math.ceil(math.log2(target / 8.50))
    K = _times_pow2(K0, k)
    if mix is not None:  # a few entries ~1e-12: below 2^-1022 once the kernel is scaled by 2^-e
        K[0, 0, 0, :] = torch.tensor([1e-12, -3e-13, 7e-14], dtype=torch.float64)
    return K, k


_EXTREMES = ["1e153", "1e200", "1e300", "1e300-with-entries-1e-12", "1e-300", "1e-310-subnormal"]


@pytest.mark.parametrize("name", _EXTREMES)
def test_extreme_magnitudes_are_finite_certified_upper_bounds(name):
    """Kernels of norm 1e153 to 1e300 (the old Frobenius norm of the error bound overflowed:
    ``upper = inf`` with ``certified=True``) and 1e-300 to subnormal, against 50-digit norms of
    the dense layer; the bound stays tight (docs/derivations/gram_convolution.md §4.4)."""
    K, _ = _extreme_kernel(name)
    ref = _mp_layer_norm(K, _SIZE)
    ref_zeros = _mp_layer_norm(K, _SIZE, "zeros")
    for exact, n_iter, tol in [(True, 6, 1e-12), (False, 6, 1e-2), (False, 2, 0.2)]:
        r = conv2d_spectral_upper(K, _SIZE, exact=exact, n_iter=n_iter)
        up = float(r.upper)
        assert r.certified and math.isfinite(up), (exact, n_iter, up)
        assert mpmath.mpf(up) >= ref, (exact, n_iter, up, ref)
        assert mpmath.mpf(up) <= ref * (1 + tol), (exact, n_iter, up / ref)
        # the a priori block error is a positive bound, far below the norm (the old code gave
        # inf above ~1e153 and an underflowed 0 near 1e-300)
        assert 0 < r.block_error <= F64_LONG_CHAIN * up
        assert float(r.gram) >= float(ref) * (1 - BRACKET_MARGIN)
    rz = conv2d_spectral_upper(K, _SIZE, padding="zeros", n_iter=8)
    assert rz.certified and math.isfinite(float(rz.upper))
    assert mpmath.mpf(float(rz.upper)) >= ref_zeros
    assert float(rz.upper) <= float(ref_zeros) * 1.25  # circular norm on the 5 x 5 grid


def test_norm_1e153_layer_whose_error_bound_overflowed():
    """A wide layer of norm ~1e153 whose unscaled sum of squares overflows (the old code:
    ``upper = inf``, ``certified=True``); reference: float64 SVD of the dense layer of the kernel
    scaled down by an exact power of two, scaled back."""
    g = torch.Generator().manual_seed(5)
    K0 = (torch.randint(0, 2, (16, 16, 7, 7), generator=g) * 2 - 1).to(torch.float64)  # +-1 taps
    sigma0 = _sigma(_unrolled(K0, (7, 7), "circular"))  # 55.08
    k = math.ceil(math.log2(1e153 / sigma0))
    K = K0 * 2.0**k
    assert 1e153 <= sigma0 * 2.0**k < 2e153
    A = K.abs().sum((-2, -1))
    assert not math.isfinite(float(A.square().sum()))  # the regime of the defect
    for exact in (True, False):
        r = conv2d_spectral_upper(K, 7, exact=exact, n_iter=8)
        assert r.certified and math.isfinite(float(r.upper))
        ratio = float(r.upper) / 2.0**k / sigma0
        assert 1 <= ratio <= (1 + GRAM_CERT_EXACT if exact else 1.01), ratio


@pytest.mark.parametrize("k", [1000, -1000, -1040])
def test_block_error_bound_holds_at_extreme_magnitudes(k):
    """``conv2d_frequency_blocks`` at 2^1000 (the old bound was inf), 2^-1000 (products underflow;
    the old bound was an underflowed 0) and 2^-1040 (subnormal kernel), against 40-digit blocks."""
    K = _times_pow2(_kernel(3, 2, 3, 3, 11), k)
    blocks, eta = conv2d_frequency_blocks(K, (6, 7))
    assert math.isfinite(eta) and eta > 0
    assert eta <= F64_REDUCTION * float(K.abs().sum()) + K.numel() * 2.0**-1071
    Kl = K.tolist()
    with mpmath.workdps(40):
        worst = mpmath.mpf(0)
        for w1, w2 in [(0, 0), (1, 2), (5, 3), (3, 1), (2, 0)]:
            err2 = mpmath.mpf(0)
            for o in range(3):
                for c in range(2):
                    z = mpmath.mpc(0)
                    for a in range(3):
                        for b in range(3):
                            z += mpmath.mpf(Kl[o][c][a][b]) * mpmath.expjpi(
                                -2 * mpmath.mpf(w1 * a) / 6 - 2 * mpmath.mpf(w2 * b) / 7
                            )
                    err2 += abs(z - mpmath.mpc(complex(blocks[w1, w2, o, c]))) ** 2
            worst = max(worst, mpmath.sqrt(err2))  # Frobenius >= 2-norm
        assert 0 < worst <= eta


@pytest.mark.parametrize("padding", ["circular", "zeros"])
def test_power_of_two_scaling_is_exact(padding):
    """The bound is computed on the kernel scaled into [1/2, 1): for 2^k K with everything in
    the normal range, every reported value is exactly 2^k times that of K (§4.4)."""
    K = _kernel(3, 3, 3, 3, 13)
    r0 = conv2d_spectral_upper(K, 5, padding=padding, n_iter=5, exact=True)
    for k in (-1000, -600, -7, 7, 600, 1000):
        Kk = _times_pow2(K, k)
        assert bool((_times_pow2(Kk, -k) == K).all())  # no rounding in building 2^k K
        r = conv2d_spectral_upper(Kk, 5, padding=padding, n_iter=5, exact=True)
        assert r.certified
        assert float(r.upper) == math.ldexp(float(r0.upper), k)
        assert float(r.gram) == math.ldexp(float(r0.gram), k)
        assert float(r.circular_exact) == math.ldexp(float(r0.circular_exact), k)
        be = math.ldexp(r0.block_error, k)
        if be >= 2.0**-1022:
            assert r.block_error == be
        else:  # scaled into the subnormals: rounded upwards
            assert math.ldexp(r.block_error, -k) >= r0.block_error
            assert r.block_error <= math.nextafter(be, math.inf)
        assert torch.equal(r.per_frequency, _times_pow2(r0.per_frequency, k))
    # float32 kernels: the same within float32's range
    K32 = _kernel(3, 2, 3, 3, 7, dtype=torch.float32)
    s0 = conv2d_spectral_upper(K32, 6, n_iter=8)
    for k in (-100, 100):
        s = conv2d_spectral_upper(K32 * 2.0**k, 6, n_iter=8)
        assert s.certified and float(s.upper) == math.ldexp(float(s0.upper), k)


@pytest.mark.parametrize("case", CASES)
def test_scaled_bound_agrees_with_the_unscaled_computation(case):
    """On moderate kernels the scaled computation (§4.4) and the same steps on the kernel as
    given (§4.1-§4.3) agree up to the roundings of the Gram iteration's logarithms."""
    from meanfield.convolution import _unscaled_upper

    co, ci, kh, kw, h, w, seed = case
    for factor in (1.0, 1e3, 1e-3, 37.0):
        K = factor * _kernel(co, ci, kh, kw, seed)
        assert math.frexp(float(K.abs().max()))[1] != 0  # the scaling is not the identity
        for exact in (False, True):
            r = conv2d_spectral_upper(K, (h, w), n_iter=6, exact=exact)
            u = _unscaled_upper(K, (h, w), 6, exact, single=False)
            assert r.certified and u.ok
            assert float(r.upper) == pytest.approx(u.upper, rel=F64_REWRITTEN_EXP, abs=0)
            assert float(r.gram) == pytest.approx(float(u.gram), rel=F64_REWRITTEN_EXP, abs=0)
            assert r.block_error == pytest.approx(u.eta, rel=F64_REWRITTEN_EXP, abs=0)
            if exact:
                assert float(r.circular_exact) == pytest.approx(
                    float(u.circ), rel=F64_REWRITTEN_EXP, abs=0
                )


def test_infinite_upper_only_without_certificate():
    """Over the whole float64 range the bound is finite and certified (and tight where the
    kernel 2^k K0 is stored exactly); ``inf`` comes only with ``certified=False``, for a layer
    whose norm exceeds the float64 range."""
    K0 = _kernel(2, 2, 3, 3, 3)
    sigma0 = _sigma(_unrolled(K0, (5, 5), "circular"))
    for k in range(-1070, 1024, 61):
        K = _times_pow2(K0, k)
        r = conv2d_spectral_upper(K, 5, n_iter=6)
        up = float(r.upper)
        assert r.certified and math.isfinite(up), (k, up, r.certified)
        if bool((_times_pow2(K, -k) == K0).all()):  # no entry rounded into the subnormals
            true = math.ldexp(sigma0, k)
            assert true * (1 - BRACKET_MARGIN) <= up <= true * 1.01, (k, up / true)
    # a layer of norm 9e308: nothing finite can be certified
    big = conv2d_spectral_upper(torch.full((1, 1, 3, 3), 1e308, dtype=torch.float64), 4)
    assert not big.certified and float(big.upper) == math.inf


def test_float32_kernel_at_the_top_of_its_range():
    """Blocks of a float32 kernel near 3e38 overflow complex64 (the old code: not certified);
    the scaled computation certifies them."""
    K32 = (_kernel(3, 3, 3, 3, 31) * 1e38).to(torch.float32)
    assert bool(torch.isfinite(K32).all())
    ref = _sigma(_unrolled(K32.to(torch.float64), (6, 6), "circular"))
    r = conv2d_spectral_upper(K32, 6, n_iter=10)
    assert r.certified and ref <= float(r.upper) <= ref * (1 + F32_FORWARD)
