r"""Certified spectral-norm bounds for 2-D convolutional layers by Gram iteration.

The derivation, with every rounding term, is in ``docs/derivations/gram_convolution.md``.

A stride-1 convolution with ``c_in`` input and ``c_out`` output channels on an :math:`h\times w`
grid with **circular** boundary conditions is block-diagonalised by the 2-D discrete Fourier
transform: in the frequency domain it acts on each frequency :math:`\omega` separately through the
``c_out x c_in`` complex matrix

.. math:: \hat K(\omega) = \sum_{a,b} K[:, :, a, b]\,
          e^{-2\pi i(\omega_1 a/h + \omega_2 b/w)},

so its operator norm is :math:`\max_\omega\|\hat K(\omega)\|_2`. Gram iteration (Delattre,
Barthélemy, Araujo and Allauzen, ICML 2023) bounds each block from above, the frequencies forming
one batch; the largest bound is the layer's. For real kernels :math:`\hat K(-\omega)` is the complex
conjugate of :math:`\hat K(\omega)`, so only half of the frequencies are formed.

A **zero-padded** convolution on an :math:`h\times w` input is a restriction of the circular
convolution on a larger grid :math:`(h+p_h)\times(w+p_w)` (the input is placed in a corner,
surrounded by enough zeros that no tap wraps around; the outputs are a subset of the circular
outputs). Its norm is therefore at most the circular norm on that grid, which is what
:func:`conv2d_spectral_upper` certifies for ``padding="zeros"`` (the derivation, §3, gives the
grid size and the proof). :func:`conv2d_reshaped_upper` gives a looser bound that holds for every
input size, padding and stride (four reshapes of the kernel, derivation §3.3).

Rounding: the frequency blocks are formed in float64 by an explicit discrete Fourier sum whose
error is bounded a priori, the candidate bound is checked a posteriori on every block by the
Cholesky test of :func:`meanfield._spectral.certify_upper`, and the two are added with an upward
rounding margin, so the returned ``upper`` holds in floating point (derivation §4). All of this
runs on the kernel scaled by a power of two so that its largest entry lies in
:math:`[\tfrac12, 1)`, and the bound is scaled back rounding upwards (derivation §4.4): no sum of
squares overflows or underflows, and the bound stays finite and certified for kernels of any
magnitude whose bound fits in float64. Explicit
matrices (``nn.Linear`` weights) are covered by :func:`meanfield._spectral.spectral_norm_upper`;
:func:`module_spectral_upper` dispatches on the module type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._spectral import U64, certify_upper, fro_norm, gamma_k, spectral_norm_upper

__all__ = [
    "ConvSpectralResult",
    "conv2d_frequency_blocks",
    "conv2d_operator",
    "conv2d_reshaped_upper",
    "conv2d_spectral_upper",
    "gram_iteration_complex",
    "module_spectral_upper",
    "zero_padding_grid",
]


@dataclass(frozen=True, eq=False)
class ConvSpectralResult:
    r"""Outcome of :func:`conv2d_spectral_upper`.

    Attributes
    ----------
    upper : Tensor, float64, shape ()
        Certified upper bound on the operator 2-norm of the layer; ``+inf`` exactly when
        ``certified`` is false (certification failed, or the bound exceeds the float64 range).
    gram : Tensor, float64, shape ()
        :math:`\max_\omega` of the Gram-iteration values: an upper bound in exact arithmetic on
        the circular norm on ``grid``, not certified against rounding.
    circular_exact : Tensor or None, float64, shape ()
        :math:`\max_\omega\|\hat K(\omega)\|_2` by one SVD per frequency (``exact=True`` only):
        the circular layer's norm on ``grid`` up to rounding. For ``padding="circular"`` this is
        the layer's norm; for ``"zeros"`` it is the quantity ``upper`` bounds, not the layer's
        norm.
    per_frequency : Tensor, shape (grid[0], grid[1] // 2 + 1)
        Gram-iteration value of each frequency block, in the kernel's real dtype; the other half
        of the spectrum mirrors this one.
    grid : tuple of int
        ``(H, W)``, the circular grid whose blocks were bounded.
    padding : str
        ``"circular"`` or ``"zeros"``.
    n_iter : int
        Gram steps per frequency.
    block_error : float
        A priori bound on :math:`\|\mathrm{fl}(\hat K(\omega)) - \hat K(\omega)\|_2`, every
        :math:`\omega`, for the blocks as used (those of the scaled kernel, scaled back), the
        rounding of the scaling included (derivation §4.1, §4.4); rounded upwards.
    certified : bool
        Whether a finite bound was certified: the Cholesky check succeeded on every block and
        the bound, scaled back, fits in float64.
    """

    upper: Tensor
    gram: Tensor
    circular_exact: Tensor | None
    per_frequency: Tensor
    grid: tuple[int, int]
    padding: str
    n_iter: int
    block_error: float
    certified: bool


def _pair(x: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    if isinstance(x, int):
        return (x, x)
    t = tuple(int(v) for v in x)
    if len(t) != 2:
        raise ValueError(f"{name} must be an int or a pair, got {x!r}")
    return (t[0], t[1])


def _check_kernel(kernel: Tensor) -> None:
    if kernel.ndim != 4:
        raise ValueError(
            f"kernel must have shape (c_out, c_in, kh, kw) as nn.Conv2d.weight, got {tuple(kernel.shape)}"
        )
    if kernel.is_complex() or not kernel.is_floating_point():
        raise TypeError(f"kernel must be a real floating tensor, got {kernel.dtype}")
    if not bool(torch.isfinite(kernel).all()):
        raise ValueError("kernel must be finite")


def _pow2_scale(x: Tensor, k: int) -> Tensor:
    r"""``x * 2**k`` in ``x``'s dtype: exact unless the result leaves the normal range.

    Scaling up is done in steps of at most :math:`2^{1023}` (each exact until an overflow to
    ``inf``); scaling down by :math:`2^{k}`, :math:`k\ge-1074`, is one multiplication, rounded
    only where the result is subnormal.
    """
    k = int(k)
    while k > 1023:
        x = x * 2.0**1023
        k -= 1023
    while k < -1074:
        x = x * 2.0**-1000
        k += 1000
    return x * math.ldexp(1.0, k)


def _ldexp_up(x: float, k: int) -> float:
    r""":math:`x\,2^k` rounded upwards, for ``x >= 0`` (``inf`` on overflow)."""
    try:
        r = math.ldexp(x, k)
    except OverflowError:
        return math.inf
    if math.isfinite(r) and math.ldexp(r, -k) < x:  # rounded down into the subnormals
        r = math.nextafter(r, math.inf)
    return r


def _fro_up(A: Tensor) -> float:
    r"""Frobenius norm of a nonnegative matrix, without overflow or harmful underflow.

    Computed on ``A`` scaled by the power of two that brings its largest entry into
    :math:`[\tfrac12, 1)`: no square overflows, and the squares lost to underflow (each below
    :math:`2^{-1074}`) change the sum (at least 1/4) by a relative :math:`<\#A\cdot2^{-1072}`;
    the result is scaled back upwards. ``inf`` if ``A`` is not finite.
    """
    amax = float(A.max()) if A.numel() else 0.0
    if not math.isfinite(amax):
        return math.inf
    if amax == 0.0:
        return 0.0
    p = math.frexp(amax)[1]  # amax in [2^(p-1), 2^p)
    return _ldexp_up(float(torch.linalg.matrix_norm(_pow2_scale(A, -p))), p)


def zero_padding_grid(
    kernel_size: int | tuple[int, int],
    input_size: int | tuple[int, int],
    pad: int | tuple[int, int],
) -> tuple[int, int]:
    r"""Smallest circular grid containing a zero-padded convolution (derivation §3).

    A stride-1 convolution with kernel size :math:`k`, zero padding :math:`p` on each side and
    input size :math:`n` has :math:`n + 2p - k + 1` outputs per axis; it is a restriction of the
    circular convolution on :math:`N = \max(n + p,\ n + 2p - k + 1)` points per axis.

    Parameters
    ----------
    kernel_size, input_size, pad : int or pair of int
        Per axis ``(height, width)``.

    Returns
    -------
    tuple of int
        ``(N_h, N_w)``.
    """
    ks, ns = _pair(kernel_size, "kernel_size"), _pair(input_size, "input_size")
    out = []
    for k, n, p in zip(ks, ns, _pair(pad, "pad")):
        if p < 0 or n < 1 or k < 1:
            raise ValueError(f"need k >= 1, n >= 1, p >= 0, got k={k}, n={n}, p={p}")
        if n + 2 * p - k + 1 < 1:
            raise ValueError(f"the layer has no output: n + 2p - k + 1 = {n + 2 * p - k + 1} < 1")
        out.append(max(n + p, n + 2 * p - k + 1))
    return (out[0], out[1])


def _twiddles(kh: int, kw: int, H: int, W: int) -> tuple[Tensor, Tensor]:
    r"""``cos`` and ``sin`` of :math:`2\pi(\omega_1aW + \omega_2bH \bmod HW)/(HW)`, float64, CPU.

    Shapes ``(kh*kw, H*(W//2+1))``. The phase index is an exact integer, so the only rounding is
    in the angle (three operations) and in ``cos``/``sin`` (derivation §4.1).
    """
    Wf = W // 2 + 1
    a, b, w1, w2 = (torch.arange(k, dtype=torch.int64) for k in (kh, kw, H, Wf))
    L = H * W
    idx = (
        (a[:, None, None, None] * w1[None, None, :, None] % H) * W
        + (b[None, :, None, None] * w2[None, None, None, :] % W) * H
    ) % L  # (kh, kw, H, Wf), exact integers below L
    ang = (2 * math.pi) * idx.to(torch.float64) / L
    ang = ang.reshape(kh * kw, H * Wf)
    return torch.cos(ang), torch.sin(ang)


def conv2d_frequency_blocks(kernel: Tensor, grid: int | tuple[int, int]) -> tuple[Tensor, float]:
    r"""The frequency blocks :math:`\hat K(\omega)` of the circular convolution on ``grid``.

    Computed in float64 by an explicit sum over the kernel taps (no FFT), so that the rounding
    error has the a priori bound of the derivation (§4.1), under the assumption that the math
    library's float64 ``cos`` and ``sin`` are accurate to 2 ulp.

    Parameters
    ----------
    kernel : Tensor, shape (c_out, c_in, kh, kw)
        As ``nn.Conv2d.weight`` (cross-correlation; the singular values do not depend on the
        correlation/convolution convention or on the offset of the taps).
    grid : int or pair of int
        ``(H, W)``; the kernel may be larger than the grid (taps then alias, as in the layer).

    Returns
    -------
    blocks : Tensor, complex128, shape (H, W // 2 + 1, c_out, c_in)
        On the kernel's device. The frequency :math:`(-\omega_1, -\omega_2)` carries the complex
        conjugate block, with the same singular values.
    block_error : float
        :math:`\eta` with :math:`\|\mathrm{fl}(\hat K(\omega))-\hat K(\omega)\|_2\le\eta` for
        every :math:`\omega`, products that underflow included; computed without overflow or
        underflow for any finite kernel (``inf`` only if a block overflowed).
    """
    _check_kernel(kernel)
    H, W = _pair(grid, "grid")
    if H < 1 or W < 1:
        raise ValueError(f"grid must be positive, got {(H, W)}")
    co, ci, kh, kw = kernel.shape
    K = kernel.detach().to(torch.float64).reshape(co * ci, kh * kw)
    c, s = _twiddles(kh, kw, H, W)
    c, s = c.to(K.device), s.to(K.device)
    re = (K @ c).reshape(co, ci, H, W // 2 + 1)
    im = -(K @ s).reshape(co, ci, H, W // 2 + 1)
    blocks = torch.complex(re, im).permute(2, 3, 0, 1).contiguous()
    # a priori error (derivation §4.1): per real component rho * sum_ab |K_oc,ab|, plus
    # 2^-1075 for each of the kh kw products that may underflow (sums underflow exactly)
    tau = 2 * math.pi * gamma_k(3) + 4 * U64
    rho = gamma_k(kh * kw) * (1 + tau) + tau
    A = K.abs().sum(-1).reshape(co, ci)
    if not bool(torch.isfinite(blocks).all()):
        return blocks, math.inf
    if not bool((A > 0).any()):  # zero kernel: every product and sum is an exact zero
        return blocks, 0.0
    eta = 2.0 * math.sqrt(2.0) * rho * _fro_up(A) + math.ldexp(float(K.numel()), -1072)
    return blocks, eta


def gram_iteration_complex(Z: Tensor, n_iter: int) -> Tensor:
    r"""Batched Gram iteration :math:`\hat\sigma_T\ge\|Z\|_2` for real or complex matrices.

    The algorithm of :func:`meanfield._spectral.gram_sequence` with the conjugate transpose:
    :math:`G\leftarrow G/\|G\|_F`, :math:`\ell\leftarrow2(\ell+\log\|G\|_F)`,
    :math:`G\leftarrow G^{*}G`, and :math:`\hat\sigma_T=\|G\|_F^{2^{-T}}e^{2^{-T}\ell}`, the
    Schatten :math:`2^{T+1}` norm of ``Z`` (an upper bound in exact arithmetic). Runs in the
    input's precision (the bound in floating point is the job of :func:`conv2d_spectral_upper`).

    Parameters
    ----------
    Z : Tensor, shape (..., p, q)
    n_iter : int
        Squaring steps ``T >= 0``.

    Returns
    -------
    Tensor, real dtype of ``Z``, shape (...)
    """
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    G = Z.mH if Z.shape[-1] > Z.shape[-2] else Z
    real = G.real.dtype if G.is_complex() else G.dtype
    ell = torch.zeros(G.shape[:-2], dtype=real, device=G.device)
    zero = fro_norm(G) == 0
    for _ in range(int(n_iter)):
        f = fro_norm(G)
        safe = torch.where(f > 0, f, torch.ones_like(f))
        G = G / safe[..., None, None].to(G.dtype)
        ell = 2 * (ell + torch.log(safe))
        G = G.mH @ G
    scale = 2.0 ** -int(n_iter)
    val = fro_norm(G).pow(scale) * torch.exp(scale * ell)
    return torch.where(zero, torch.zeros_like(val), val)


def _realify(Z: Tensor) -> Tensor:
    """Real embedding ``[[Re, -Im], [Im, Re]]`` (…, 2p, 2q): same singular values, doubled."""
    X, Y = Z.real, Z.imag
    return torch.cat([torch.cat([X, -Y], -1), torch.cat([Y, X], -1)], -2)


def _certify_blocks(blocks: Tensor, base: float, start_infl: float) -> tuple[float, bool]:
    """Smallest ``base * (1 + infl)`` (geometric schedule) certified on every block."""
    R = _realify(blocks.reshape(-1, *blocks.shape[-2:]))
    infl = start_infl
    for _ in range(13):
        s = base * (1 + infl)
        if bool(certify_upper(R, s).all()):
            return s, True
        infl *= 8
    return math.inf, False


def conv2d_spectral_upper(
    kernel: Tensor,
    input_size: int | tuple[int, int],
    *,
    padding: str = "circular",
    pad: int | tuple[int, int] | None = None,
    stride: int | tuple[int, int] = 1,
    n_iter: int = 6,
    exact: bool = False,
) -> ConvSpectralResult:
    r"""Certified upper bound on the spectral norm of a stride-1 2-D convolution.

    ``padding="circular"``: the layer is the circular convolution on the ``input_size`` torus
    (``nn.Conv2d(..., padding=(k-1)//2, padding_mode="circular")`` for odd kernels; output size
    = input size). ``padding="zeros"``: the layer is ``F.conv2d(x, kernel, padding=pad)`` on an
    ``input_size`` input, with ``pad`` defaulting to ``(kh // 2, kw // 2)``; the bound is the
    certified circular bound on the enlarged grid of :func:`zero_padding_grid` (derivation §3).
    In both cases: frequency blocks (:func:`conv2d_frequency_blocks`), Gram iteration per
    frequency in the kernel's precision (:func:`gram_iteration_complex`), then the largest value
    (or, with ``exact=True``, the smaller of it and the per-frequency SVD maximum) is certified
    in float64 on every block and the block rounding error is added (derivation §4). All of it
    runs on the kernel scaled by the power of two :math:`2^{-e}` that brings its largest entry
    into :math:`[\tfrac12, 1)` (exact but for entries pushed into the subnormals, whose rounding
    is added to the error); the bound is multiplied back by :math:`2^{e}` rounding upwards
    (derivation §4.4), so it is finite and certified whenever it fits in float64 (kernels of
    norm :math:`10^{-300}` and :math:`10^{300}` alike). ``upper = inf`` comes only with
    ``certified=False``.

    Parameters
    ----------
    kernel : Tensor, shape (c_out, c_in, kh, kw)
        Real; its device is used throughout.
    input_size : int or pair of int
        Spatial size ``(h, w)`` of the input.
    padding : {"circular", "zeros"}
    pad : int or pair of int, optional
        Zero padding per side (``padding="zeros"`` only).
    stride : int or pair of int, default 1
        Only 1 is supported.
    n_iter : int, default 6
        Gram steps per frequency.
    exact : bool, default False
        Also compute :math:`\max_\omega\|\hat K(\omega)\|_2` by SVD (cost
        :math:`O(HW\,c^3)`), returned as ``circular_exact`` and used as a candidate.

    Returns
    -------
    ConvSpectralResult
    """
    _check_kernel(kernel)
    if _pair(stride, "stride") != (1, 1):
        raise NotImplementedError(
            f"only stride 1 is supported (the Fourier block structure needs it), got {stride!r}"
        )
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    kh, kw = kernel.shape[-2:]
    h, w = _pair(input_size, "input_size")
    if padding == "circular":
        if pad is not None:
            raise ValueError("pad applies to padding='zeros' only; circular output size = input")
        if h < 1 or w < 1:
            raise ValueError(f"input_size must be positive, got {(h, w)}")
        grid = (h, w)
    elif padding == "zeros":
        p = (kh // 2, kw // 2) if pad is None else _pair(pad, "pad")
        grid = zero_padding_grid((kh, kw), (h, w), p)
    else:
        raise ValueError(f"padding must be 'circular' or 'zeros', got {padding!r}")

    # Scale by 2^-e so that the largest entry lies in [1/2, 1) (derivation §4.4): exact, except
    # that entries pushed below 2^-1022 are rounded, by at most 2^-1075 each; `sub` bounds the
    # effect, max_w ||E^(w)||_2 for the rounding error E, and is 0 when nothing was rounded
    # (scaling back up is exact, so equality detects it).
    K64 = kernel.detach().to(torch.float64)
    amax = float(K64.abs().max()) if K64.numel() else 0.0
    e = math.frexp(amax)[1] if amax > 0 else 0
    Ks = _pow2_scale(K64, -e)
    exact_scaling = bool((_pow2_scale(Ks, e) == K64).all())
    sub = 0.0 if exact_scaling else math.ldexp(float(K64.numel()), -1074)
    r = _unscaled_upper(Ks, grid, n_iter, exact, kernel.dtype != torch.float64, sub)
    # x 2^e, rounded upwards: exact unless the bound overflows (then not certified) or, for
    # tiny kernels, falls into the subnormals
    upper = _ldexp_up(r.upper, e) if r.ok else math.inf
    ok = r.ok and math.isfinite(upper)
    return ConvSpectralResult(
        upper=torch.tensor(upper, dtype=torch.float64, device=kernel.device),
        gram=_pow2_scale(r.gram, e),
        circular_exact=None if r.circ is None else _pow2_scale(r.circ, e),
        per_frequency=_pow2_scale(r.per_freq.to(torch.float64), e).to(kernel.dtype),
        grid=grid,
        padding=padding,
        n_iter=int(n_iter),
        block_error=_ldexp_up((r.eta + sub) * (1 + 2 * U64), e),
        certified=ok,
    )


class _Unscaled(NamedTuple):
    upper: float
    ok: bool
    eta: float
    gram: Tensor
    circ: Tensor | None
    per_freq: Tensor


def _unscaled_upper(
    K: Tensor, grid: tuple[int, int], n_iter: int, exact: bool, single: bool, extra: float = 0.0
) -> _Unscaled:
    r"""Derivation §4.1–§4.3 on the float64 kernel ``K`` as given (no scaling).

    ``upper`` is :math:`\mathrm{fl}(\mathrm{fl}(\mathrm{fl}(s+\eta)+\text{extra})(1+4u))\ge
    s+\eta+\text{extra}` (``inf`` unless ``ok``), with ``s`` certified on every stored block and
    :math:`\eta` the block error; ``single``: Gram iteration in complex64. Near the ends of the
    float64 range the blocks (or their complex64 copies) overflow or lose bits to underflow, so
    :func:`conv2d_spectral_upper` calls it on the kernel scaled into :math:`[\tfrac12, 1)`
    (derivation §4.4).
    """
    blocks, eta = conv2d_frequency_blocks(K, grid)
    work = blocks.to(torch.complex64) if single else blocks
    per_freq = gram_iteration_complex(work, n_iter)
    gram = per_freq.max().to(torch.float64)
    base = float(gram)
    circ = None
    if exact:
        circ = torch.linalg.matrix_norm(blocks, ord=2).max()
        base = min(base, float(circ))
    if base == 0.0:  # a zero candidate is only certified for zero blocks; else use Frobenius
        base = float(fro_norm(blocks).max())
    m = min(blocks.shape[-2:])
    start = 8 * gamma_k(2 * m + 1) * 2 * m + 16 * U64
    if single:
        start = max(start, 4 * torch.finfo(torch.float32).eps)
    s, ok = _certify_blocks(blocks, base, start)
    if not ok and base < float(gram):
        s, ok = _certify_blocks(blocks, float(gram), start)
    upper = (s + eta + extra) * (1 + 4 * U64) if ok else math.inf
    ok = ok and math.isfinite(upper)
    return _Unscaled(upper if ok else math.inf, ok, eta, gram, circ, per_freq)


def conv2d_reshaped_upper(kernel: Tensor) -> Tensor:
    r"""Input-size-free bound :math:`\sqrt{k_hk_w}\,\min_r\|R_r(K)\|_2` from reshaped kernels.

    The four reshapes of Singla and Feizi (ICLR 2021), ``(c_out*kh) x (c_in*kw)``,
    ``(c_out*kw) x (c_in*kh)``, ``c_out x (c_in*kh*kw)`` and ``c_in x (c_out*kh*kw)``, each bound
    the layer after multiplication by :math:`\sqrt{k_hk_w}` (derivation §3.3: a Cauchy–Schwarz
    argument over the overlapping patches). The bound holds for zero or circular padding, every
    input size and every stride; it is usually looser than :func:`conv2d_spectral_upper`. Each
    matrix norm is certified by :func:`meanfield._spectral.spectral_norm_upper` (Gram iteration
    plus the Cholesky check), and the product is rounded upwards.

    Parameters
    ----------
    kernel : Tensor, shape (c_out, c_in, kh, kw)

    Returns
    -------
    Tensor, float64, shape ()
    """
    _check_kernel(kernel)
    K = kernel.detach().to(torch.float64)
    co, ci, kh, kw = K.shape
    mats = [
        K.permute(0, 2, 1, 3).reshape(co * kh, ci * kw),
        K.permute(0, 3, 1, 2).reshape(co * kw, ci * kh),
        K.reshape(co, ci * kh * kw),
        K.transpose(0, 1).reshape(ci, co * kh * kw),
    ]
    best = min(float(spectral_norm_upper(M)) for M in mats)
    # sqrt(kh kw) rounded up, then the product rounded up
    root = math.sqrt(kh * kw) * (1 + 2 * U64)
    return torch.tensor(best * root * (1 + 2 * U64), dtype=torch.float64, device=kernel.device)


def conv2d_operator(
    kernel: Tensor,
    input_size: int | tuple[int, int],
    *,
    padding: str = "circular",
    pad: int | tuple[int, int] | None = None,
) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor], int, int]:
    r"""Matrix-free products with the layer and its adjoint, on flat vectors.

    For :func:`meanfield._spectral.power_iteration` and :func:`~meanfield._spectral.lanczos_svd`
    (lower bounds). ``matvec`` maps ``(*batch, c_in*h*w)`` to ``(*batch, c_out*h_out*w_out)``
    with ``F.conv2d`` and ``rmatvec`` is its exact adjoint (``F.conv_transpose2d``, with circular
    wrapping folded back for ``padding="circular"``).

    Returns
    -------
    matvec, rmatvec : callable
    n_in, n_out : int
        Lengths of the flat input and output vectors.
    """
    _check_kernel(kernel)
    co, ci, kh, kw = kernel.shape
    h, w = _pair(input_size, "input_size")
    if padding == "circular":
        if kh % 2 == 0 or kw % 2 == 0:
            raise ValueError("the circular operator here needs odd kernel sizes (output = input)")
        ph, pw = kh // 2, kw // 2
        if ph > h or pw > w:
            raise ValueError("kernel wider than the circular grid is not supported here")
        ho, wo = h, w
    elif padding == "zeros":
        ph, pw = (kh // 2, kw // 2) if pad is None else _pair(pad, "pad")
        ho, wo = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    else:
        raise ValueError(f"padding must be 'circular' or 'zeros', got {padding!r}")

    def matvec(v: Tensor) -> Tensor:
        x = v.reshape(-1, ci, h, w)
        if padding == "circular":
            y = F.conv2d(F.pad(x, (pw, pw, ph, ph), mode="circular"), kernel)
        else:
            y = F.conv2d(x, kernel, padding=(ph, pw))
        return y.reshape(*v.shape[:-1], co * ho * wo)

    def rmatvec(u: Tensor) -> Tensor:
        y = u.reshape(-1, co, ho, wo)
        if padding == "circular":
            z = F.conv_transpose2d(y, kernel)  # (h + 2ph, w + 2pw): adjoint of the valid conv
            z = _fold_circular(z, ph, pw)
        else:
            z = F.conv_transpose2d(y, kernel, padding=(ph, pw))
        return z.reshape(*u.shape[:-1], ci * h * w)

    return matvec, rmatvec, ci * h * w, co * ho * wo


def _fold_circular(z: Tensor, ph: int, pw: int) -> Tensor:
    """Adjoint of circular padding: add the halo back onto the opposite edges."""
    for dim, p in ((-2, ph), (-1, pw)):
        if p:
            t = z.transpose(dim, -1)  # the axis to fold, last
            core = t[..., p:-p].clone()
            core[..., :p] += t[..., -p:]
            core[..., -p:] += t[..., :p]
            z = core.transpose(dim, -1)
    return z


def module_spectral_upper(
    module: torch.nn.Module, input_size: int | tuple[int, int] | None = None, **kwargs
) -> Tensor:
    r"""Certified spectral-norm bound of an ``nn.Linear`` or ``nn.Conv2d`` weight map.

    ``nn.Linear``: :func:`meanfield._spectral.spectral_norm_upper` of the weight (the bias does
    not enter the Lipschitz constant). ``nn.Conv2d`` (stride 1, dilation 1, one group):
    :func:`conv2d_spectral_upper` with ``padding_mode="circular"`` (needs ``padding = (k-1)/2``)
    or ``"zeros"`` (``pad = module.padding``); ``input_size`` is then required. Extra keyword
    arguments go to the underlying function.

    Returns
    -------
    Tensor, float64, shape ()
    """
    if isinstance(module, torch.nn.Linear):
        return spectral_norm_upper(module.weight.detach(), **kwargs)
    if isinstance(module, torch.nn.Conv2d):
        if input_size is None:
            raise ValueError("input_size is required for a convolution")
        if tuple(module.stride) != (1, 1) or tuple(module.dilation) != (1, 1):
            raise NotImplementedError("only stride 1 and dilation 1 are supported")
        if module.groups != 1:
            raise NotImplementedError("grouped convolutions are not supported")
        if isinstance(module.padding, str):
            raise NotImplementedError("string paddings ('same', 'valid'): pass explicit integers")
        kh, kw = module.kernel_size
        ph, pw = module.padding
        mode = module.padding_mode
        if mode not in ("circular", "zeros"):
            raise NotImplementedError(f"padding_mode {mode!r} is not supported")
        if mode == "circular" and (2 * ph, 2 * pw) != (kh - 1, kw - 1):
            raise NotImplementedError("circular padding must be (k - 1) / 2 (output = input)")
        pad = (ph, pw) if mode == "zeros" else None
        return conv2d_spectral_upper(
            module.weight.detach(), input_size, padding=mode, pad=pad, **kwargs
        ).upper
    raise TypeError(f"expected nn.Linear or nn.Conv2d, got {type(module).__name__}")
