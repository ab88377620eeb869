r"""The operators an estimate runs on: the input, its linearisations, precisions and scales.

:func:`parse_input` reads a sequence or a measure by the input rule (docs/conventions.md §8);
:func:`prepare` makes, from the linearisation at the input, its float64 copy scaled by a power of
two (the certificate's operator, docs/rounding.md §5) and the operator the iterative solver
runs on (float32 inputs keep float32 where its range allows); :func:`flat_ops`,
:func:`self_ops` and :func:`random_start` are the solver's products and start vector.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, overload

import torch
from torch import Tensor

from .. import _rounding as _rnd
from .._typing import Params, ProductGeometry
from .._validation import check_flag, check_measure, check_points, params_dtype_device
from ..jacobian import (
    AttentionLinearization,
    StreamingLinearization,
    jvp,
    linearize,
    linearize_streaming,
    self_jvp,
    self_vjp,
    streaming_jvp,
    streaming_vjp,
    vjp,
)
from ..measures import DiracMeasure
from ..params import AttentionParams, MultiHeadParams
from ._options import Plan

Operator = Callable[[Tensor], Tensor]
#: A linearisation of either path: stored attention matrices or streamed tiles.
Linearization = AttentionLinearization | StreamingLinearization


def lin_jvp(lin: Linearization, H: Tensor, geometry: ProductGeometry) -> Tensor:
    """:math:`JH` on the path of ``lin`` (stored or streaming products)."""
    if isinstance(lin, StreamingLinearization):
        return streaming_jvp(lin, H, geometry=geometry)
    return jvp(lin, H, geometry=geometry)


def lin_vjp(lin: Linearization, G: Tensor, geometry: ProductGeometry) -> Tensor:
    r""":math:`J^\top G` on the path of ``lin`` (stored or streaming products)."""
    if isinstance(lin, StreamingLinearization):
        return streaming_vjp(lin, G, geometry=geometry)
    return vjp(lin, G, geometry=geometry)


def scale_exponent(lin: Linearization, threshold: int = 128) -> int:
    """The power-of-two scale of docs/rounding.md §5 on the path of ``lin``."""
    if isinstance(lin, StreamingLinearization):
        return _rnd.streaming_scale_exponent(lin, threshold)
    return _rnd.scale_exponent(lin, threshold)


def scaled(lin: Linearization, e: int) -> Linearization:
    """``lin`` for the operator ``2**-e J`` (exact)."""
    if isinstance(lin, StreamingLinearization):
        return lin.scaled(e)
    return _rnd.scaled(lin, e)


def round_down(x64: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast ``x64`` to ``dtype`` rounding towards ``-inf``."""
    y = x64.to(dtype)
    if dtype == torch.float64:
        return y
    return torch.where(y.to(torch.float64) > x64, torch.nextafter(y, y.new_tensor(-math.inf)), y)


def round_up(x64: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast ``x64`` to ``dtype`` rounding towards ``+inf``."""
    return -round_down(-x64, dtype)  # the cast and nextafter are symmetric about zero


def eval_margin(n: int, d: int) -> float:
    """Relative evaluation margin of J in float64 (first-order model, heuristic constant)."""
    return 64 * (n + d) * _rnd.U64


def parse_input(
    x: Tensor | DiracMeasure, masked: bool | None, params: Params
) -> tuple[Tensor, Tensor | None, Tensor | None, bool]:
    """Points, log-weights, positions and the mask flag, by the input rule (docs/conventions.md §8)."""
    dtype, device = params_dtype_device(
        params, (AttentionParams, MultiHeadParams), "local_lipschitz"
    )
    if masked is not None:
        masked = check_flag(masked, "masked")
    if isinstance(x, DiracMeasure):
        check_measure(x, dtype, device, params.d, "local_lipschitz")
        is_masked = x.is_causal if masked is None else masked
        if is_masked and not x.is_causal:
            raise ValueError(
                "masked estimates on a measure need a position-tagged (causal) measure"
            )
        lw = x.log_weights
        uniform = bool((x.weights == x.weights[..., :1]).all())
        return x.points, None if uniform else lw, x.positions if is_masked else None, is_masked
    X = check_points(x, "x", params.d, dtype, device)
    return X, None, None, bool(masked)  # unmasked when not given


# ------------------------------------------------------------------- precisions and scales
_F64_CACHE: weakref.WeakKeyDictionary[Params, Params] = weakref.WeakKeyDictionary()


def params_to_float64(params: Params) -> Params:
    """Float64 copy (cached per ``params``, so certified weight norms are computed once).

    ``.to`` recomputes ``A = Q^T K`` of factored heads from the float64 factors.
    """
    if params.dtype == torch.float64:
        return params
    cached = _F64_CACHE.get(params)
    if cached is None:
        cached = _F64_CACHE[params] = params.to(dtype=torch.float64)
    return cached


def to_float64(lin: Linearization) -> Linearization:
    """The linearisation at the same input in float64 (``lin`` itself when it is float64)."""
    if lin.X.dtype == torch.float64:
        return lin
    return relinearize(lin, params_to_float64(lin.params))


@overload
def relinearize(lin: AttentionLinearization, params: Params) -> AttentionLinearization: ...
@overload
def relinearize(lin: StreamingLinearization, params: Params) -> StreamingLinearization: ...
def relinearize(lin: Linearization, params: Params) -> Linearization:
    """The linearisation at the input of ``lin`` with other parameters (the input in their dtype)."""

    def f(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(params.dtype)

    X = lin.X.to(params.dtype)
    common: dict[str, Any] = dict(
        log_weights=f(lin.log_weights),
        masked=lin.masked,
        positions=f(lin.positions),
        token_index=lin.token_index,
    )
    if isinstance(lin, StreamingLinearization):
        return linearize_streaming(X, params, block_size=lin.block_size, **common)
    return linearize(X, params, chunk_size=lin.chunk_size, **common)


def _float32_scaled(
    lin: Linearization, scale_from: Linearization
) -> tuple[Linearization, int] | None:
    r"""Float32 ``lin`` scaled by a power of two that brings the operator near norm one.

    The scale is read from ``scale_from`` (``lin`` itself or its float64 copy). ``None`` when
    that scale or the attention matrices leave float32's range (float32 norms underflow below
    ~1e-19 and overflow above ~1e19): the solver must then run in float64. A streaming
    linearisation has finite row normalisers by construction; with weighted atoms, whose
    :math:`\tilde P` it never stores, it runs in float64.
    """
    if isinstance(lin, StreamingLinearization):
        if lin.log_weights is not None:
            return None
    elif not bool(torch.isfinite(lin.P).all()):
        return None
    elif lin.P_w is not None and not bool(torch.isfinite(lin.P_w).all()):
        return None
    e32 = scale_exponent(scale_from, threshold=4)
    return None if abs(e32) > 100 else (scaled(lin, e32), e32)


@dataclass(frozen=True)
class Operators:
    """The linearisations of one estimate (docs/rounding.md §5, §9).

    Attributes
    ----------
    lin : AttentionLinearization or StreamingLinearization
        At the input, in its dtype, on the path of the call (stored or streaming).
    lin64 : AttentionLinearization or StreamingLinearization
        Its float64 copy (``lin`` itself on the uncertified fast path, which makes none).
    lin64s : AttentionLinearization or StreamingLinearization
        ``lin64`` for the operator :math:`2^{-e}J`: every certified norm is computed on it.
    e : int
        That power-of-two scale (0 on the fast path).
    lin_solve : AttentionLinearization or StreamingLinearization
        What the iterative solver runs on, for :math:`2^{-e_{solve}}J`.
    e_solve : int
    """

    lin: Linearization
    lin64: Linearization
    lin64s: Linearization
    e: int
    lin_solve: Linearization
    e_solve: int

    @property
    def batch(self) -> torch.Size:
        """Batch shape of the input."""
        return self.lin.batch_shape

    @property
    def float32_solve(self) -> bool:
        """Whether the iterative solver runs below float64."""
        return self.lin_solve.X.dtype != torch.float64


def prepare(lin: Linearization, plan: Plan) -> Operators:
    """The operators of the estimate at ``lin``.

    Uncertified matrix-free Euclidean and Wasserstein estimates run in the working precision of
    the inputs without a float64 copy where float32's range allows (docs/rounding.md §9); all
    others make the float64 copy and scale it (docs/rounding.md §5). Calls stopped by the
    width rule solve on that float64 copy; the other certified calls on float32 inputs solve
    in float32 where its range allows, their probabilistic end then carrying float32's model.
    """
    if not plan.certify and plan.method != "dense" and plan.geometry != "split":
        # the estimate alone, in the working precision of the inputs: float64 inputs their own
        # operator with the scale of docs/rounding.md §5, float32 inputs their own scaled as
        # _float32_scaled says with the scale read from it (else through float64, below)
        if lin.X.dtype == torch.float64:
            e = scale_exponent(lin)
            return Operators(lin, lin, lin, 0, scaled(lin, e), e)
        fast = _float32_scaled(lin, lin)
        if fast is not None:
            return Operators(lin, lin, lin, 0, *fast)
    lin64 = to_float64(lin)
    # scale safety (docs/rounding.md §5): every norm is computed on the operator 2**-e J, with e
    # a power-of-two scale, and brought back at the end
    e = scale_exponent(lin64)
    lin64s = scaled(lin64, e)
    # float64 inputs solve on lin64s, and so do calls stopped by the width rule: its
    # probabilistic end is that of the solver's operator, and a float32 operator's certified
    # distance to the exact one (docs/rounding.md §11.3) is far wider than the width on most
    # layers, so these calls solve in float64
    lin_solve, e_solve = lin64s, e
    if plan.rtol is None and lin.X.dtype != torch.float64:
        # the other float32 calls: their own operator, scaled as _float32_scaled says with the
        # scale read from lin64, or lin64s when that leaves float32's range
        out = _float32_scaled(lin, lin64)
        if out is not None:
            lin_solve, e_solve = out
    return Operators(lin, lin64, lin64s, e, lin_solve, e_solve)


# ---------------------------------------------------------------- products and start vectors
def random_start(shape: tuple[int, ...], like: Tensor, seed: int | None) -> Tensor:
    """Gaussian start vector in the dtype and on the device of ``like``.

    Drawn in float64 on the CPU from a generator seeded with ``seed`` (``None``: the global
    generator), so that a seed gives the same start on every device.
    """
    generator = None if seed is None else torch.Generator().manual_seed(int(seed))
    x0 = torch.randn(shape, generator=generator, dtype=torch.float64)
    return x0.to(dtype=like.dtype, device=like.device)


def flat_ops(lin: Linearization, geometry: ProductGeometry) -> tuple[Operator, Operator]:
    r"""Products with :math:`J` and :math:`J^\top` on flattened ``(..., n d)`` vectors."""
    shape_in = lin.batch_shape + (lin.n, lin.d)
    shape_out = lin.batch_shape + (lin.n, lin.d_out)

    def matvec(v: Tensor) -> Tensor:
        return lin_jvp(lin, v.reshape(shape_in), geometry).reshape(lin.batch_shape + (-1,))

    def rmatvec(u: Tensor) -> Tensor:
        return lin_vjp(lin, u.reshape(shape_out), geometry).reshape(lin.batch_shape + (-1,))

    return matvec, rmatvec


def self_ops(lin: Linearization) -> tuple[Operator, Operator]:
    """Batched products with the per-atom self-Jacobians :math:`S_i` and their transposes."""
    if isinstance(lin, StreamingLinearization):
        return lin.self_jvp, lin.self_vjp
    return partial(self_jvp, lin), partial(self_vjp, lin)
