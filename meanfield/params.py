r"""Parameters of attention layers, in the toolkit's score convention.

One head (docs/conventions.md §1, docs/theory.md §B1) is a score matrix
:math:`A\in\mathbb R^{d\times d}` with :math:`\mathrm{score}(x_i, x_j) = x_i^\top A x_j` (query
:math:`i`, key :math:`j`), a value matrix
:math:`V\in\mathbb R^{d_v\times d}`, and two optional bias terms: the key logit
:math:`c^\top x_j` produced by a query bias and the value bias :math:`b`. Several heads plus an
output projection :math:`W^O` form a :class:`MultiHeadParams` (docs/theory.md §B1):

.. math:: f^{\mathrm{MH}}(X)_i = W^O\,\big[V_1 m^1_i + b_1; \dots; V_H m^H_i + b_H\big] + b^O .

The released code of Castin et al. uses the transposed convention
:math:`A_{\mathrm{code}} = A^\top`; constructors take it only through the explicit option
``score="key_query"``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ._numerics import as_float_tensor, check_finite

__all__ = [
    "AttentionParams",
    "L2AttentionParams",
    "MultiHeadParams",
    "RMSNorm",
    "RotaryEmbedding",
    "ScoreConvention",
]

ScoreConvention = Literal["query_key", "key_query"]


def _check_score(score: str) -> None:
    if score not in ("query_key", "key_query"):
        raise ValueError(f"score must be 'query_key' or 'key_query', got {score!r}")


def _float_dtype(x: object) -> torch.dtype | None:
    """The floating dtype ``x`` carries (a floating tensor or numpy array), else ``None``."""
    if isinstance(x, Tensor):
        return x.dtype if x.is_floating_point() else None
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        try:
            dt = np.dtype(x.dtype)
        except TypeError:
            return None
        return torch.from_numpy(np.empty(0, dtype=dt)).dtype if dt.kind == "f" else None
    return None


def _as_like(x: object, name: str, like: Tensor, leading: str) -> Tensor:
    """``x`` in the dtype and device of ``like`` (the leading matrix, named ``leading``).

    A floating input of another dtype is a one-line ``ValueError``, never a silent cast (the rule
    of docs/conventions.md §8); lists and integer or boolean inputs take the leading dtype.
    """
    dt = _float_dtype(x)
    if dt is not None and dt != like.dtype:
        raise ValueError(
            f"{name} has dtype {dt} but {leading} has {like.dtype}; the parameters of a layer "
            f"share one dtype: convert one of them with .to({like.dtype})"
        )
    return as_float_tensor(x, name, like=like)


def _finite_number(value: object, name: str, *, positive: bool) -> float:
    """``value`` as a float; a one-line ``ValueError`` unless it is a finite (positive) number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    x = float(value)
    if not (np.isfinite(x) and (x > 0 or not positive)):
        raise ValueError(
            f"{name} must be {'finite and positive' if positive else 'finite'}, got {value!r}"
        )
    return x


def _matrix(
    x: object, name: str, like: Tensor | None = None, leading: str = "the leading matrix"
) -> Tensor:
    t = as_float_tensor(x, name) if like is None else _as_like(x, name, like, leading)
    if t.ndim != 2:
        raise ValueError(f"{name} must be a matrix, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")
    check_finite(t, name)
    return t


def _vector(x: object, name: str, size: int, like: Tensor, leading: str) -> Tensor:
    t = _as_like(x, name, like, leading)
    if t.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {tuple(t.shape)}")
    check_finite(t, name)
    return t


def spectral_norm(M: Tensor) -> Tensor:
    """Largest singular value of a matrix (exact SVD, in the matrix's dtype)."""
    return torch.linalg.matrix_norm(M, ord=2)


@dataclass(frozen=True, eq=False)
class RotaryEmbedding:
    r"""Rotary position embedding (RoPE) in the ``rotate_half`` layout of Llama-style models.

    A query or key vector :math:`z\in\mathbb R^k` at integer position :math:`p` becomes
    :math:`z\odot\cos(p\theta) + \mathrm{rot}(z)\odot\sin(p\theta)`, with
    :math:`\theta = [\omega;\omega]` (``inv_freq`` repeated), :math:`\mathrm{rot}(z) = [-z_2; z_1]`
    for the halves :math:`z_1, z_2`, and cosines and sines multiplied by ``attention_scaling``.
    The score then depends on the relative position, :math:`x_i^\top A_{j-i}x_j`
    (docs/theory.md §B1).

    **Partial rotary** (GPT-NeoX/Pythia ``rotary_pct``, Phi ``partial_rotary_factor``): with
    ``head_dim`` larger than the rotary width :math:`r = 2\,|\omega|`, only the first :math:`r`
    coordinates :math:`z_{:r}` are rotated (in the ``rotate_half`` layout of those :math:`r`
    coordinates, cosines and sines scaled as above); :math:`z_{r:}` passes unchanged (and
    unscaled), as in ``transformers``' ``apply_rotary_pos_emb`` with ``q_rot, q_pass``.

    Parameters
    ----------
    inv_freq : Tensor, shape (r/2,)
        Angular frequencies :math:`\omega`; :math:`r` is the rotary width.
    attention_scaling : float, default 1.0
        Factor applied to cosines and sines (1 for plain RoPE).
    head_dim : int, optional
        Width :math:`k \ge r` of the heads the embedding acts on; default :math:`r` (full rotary).
    """

    inv_freq: Tensor
    attention_scaling: float = 1.0
    head_dim: int | None = None

    def __post_init__(self) -> None:
        inv_freq = as_float_tensor(self.inv_freq, "inv_freq")
        if inv_freq.ndim != 1:
            raise ValueError(f"inv_freq must be a vector, got shape {tuple(inv_freq.shape)}")
        check_finite(inv_freq, "inv_freq")
        object.__setattr__(self, "inv_freq", inv_freq)
        if self.head_dim is not None:
            hd, r = self.head_dim, 2 * inv_freq.shape[0]
            if isinstance(hd, bool) or not isinstance(hd, (int, np.integer)):
                raise ValueError(f"head_dim must be an integer, got {hd!r}")
            if hd < r:
                raise ValueError(f"head_dim must be at least the rotary width {r}, got {hd}")
            object.__setattr__(self, "head_dim", None if hd == r else int(hd))

    @property
    def rotary_dim(self) -> int:
        r"""Number of leading coordinates that are rotated, :math:`r = 2|\omega|`."""
        return 2 * self.inv_freq.shape[0]

    @property
    def k(self) -> int:
        """Head width the embedding acts on."""
        return self.rotary_dim if self.head_dim is None else self.head_dim

    def apply(self, Z: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``Z`` (..., n, k) at integer ``positions`` (..., n) or (n,)."""
        if self.head_dim is not None:
            r = self.rotary_dim
            full = RotaryEmbedding(self.inv_freq, self.attention_scaling)
            return torch.cat([full.apply(Z[..., :r], positions), Z[..., r:]], dim=-1)
        angles = positions.to(Z.dtype).unsqueeze(-1) * self.inv_freq.to(Z)
        angles = torch.cat([angles, angles], dim=-1)
        cos = angles.cos() * self.attention_scaling
        sin = angles.sin() * self.attention_scaling
        half = Z.shape[-1] // 2
        rotated = torch.cat([-Z[..., half:], Z[..., :half]], dim=-1)
        return Z * cos + rotated * sin

    def to(self, *args: Any, **kwargs: Any) -> RotaryEmbedding:
        """Move ``inv_freq``, as :meth:`torch.Tensor.to`."""
        return RotaryEmbedding(
            self.inv_freq.to(*args, **kwargs), self.attention_scaling, self.head_dim
        )


@dataclass(frozen=True, eq=False)
class RMSNorm:
    r"""RMS normalisation of a query or key vector (QK-norm of Qwen3, Gemma-3, OLMo-2).

    .. math:: \mathrm{norm}(z) = w\odot\frac{z}{\sqrt{\tfrac1k\sum_a z_a^2 + \varepsilon}} .

    ``transformers``' ``Qwen3RMSNorm`` stores :math:`w` as ``weight``; Gemma's RMS norms multiply
    by ``1 + weight``, so pass ``w = 1 + weight`` for them. Computed in the parameters' dtype
    (``transformers`` upcasts to float32; in float32 and float64 the two agree).

    Parameters
    ----------
    weight : Tensor, shape (k,)
        Elementwise gain :math:`w`.
    eps : float, default 1e-6
        :math:`\varepsilon \ge 0` (with ``0`` a zero vector gives NaN logits).
    """

    weight: Tensor
    eps: float = 1e-6

    def __post_init__(self) -> None:
        w = as_float_tensor(self.weight, "q_norm/k_norm weight")
        if w.ndim != 1 or w.numel() == 0:
            raise ValueError(f"RMSNorm weight must be a non-empty vector, got {tuple(w.shape)}")
        check_finite(w, "RMSNorm weight")
        eps = float(self.eps)
        if not np.isfinite(eps) or eps < 0:
            raise ValueError(f"RMSNorm eps must be finite and >= 0, got {self.eps!r}")
        object.__setattr__(self, "weight", w)
        object.__setattr__(self, "eps", eps)

    @property
    def k(self) -> int:
        """Width of the vectors it normalises."""
        return self.weight.shape[0]

    def apply(self, Z: Tensor) -> Tensor:
        """Normalise the rows ``Z`` (..., k)."""
        return self.weight * (Z * torch.rsqrt(Z.square().mean(-1, keepdim=True) + self.eps))

    def to(self, *args: Any, **kwargs: Any) -> RMSNorm:
        """Move ``weight``, as :meth:`torch.Tensor.to`."""
        return RMSNorm(self.weight.to(*args, **kwargs), self.eps)


@dataclass(frozen=True, eq=False, init=False)
class AttentionParams:
    r"""One attention head: :math:`f(X)_i = \sum_j P_{ij}(Vx_j + b)`, :math:`P = \mathrm{softmax}(XAX^\top + \mathbf 1 c^\top X^\top)`.

    Parameters
    ----------
    A : Tensor, shape (d, d), or None
        Score matrix, :math:`\mathrm{score}(x_i, x_j) = x_i^\top A x_j` (query :math:`i`, key
        :math:`j`). For a head with query/key maps :math:`Q, K\in\mathbb R^{k\times d}`,
        :math:`A = Q^\top K/\sqrt k`. May be ``None`` when ``Q`` and ``K`` are given; it is then
        computed as :math:`Q^\top K`.
    V : Tensor, shape (d_v, d)
        Value matrix.
    c : Tensor, shape (d,), optional
        Key logit term :math:`c = W_k^\top b_q/\sqrt k` produced by a query bias
        (docs/conventions.md §1): the logit of key :math:`j` gains :math:`c^\top x_j`. Key biases
        cancel in the softmax.
    b : Tensor, shape (d_v,), optional
        Value bias; it shifts every output by the same vector and does not enter Jacobians.
    Q, K : Tensor, shape (k, d), optional
        A factorisation :math:`A = Q^\top K` (scale folded into ``Q``). When given, logits are
        computed as :math:`(Qx_i)^\top(Kx_j)`, which costs :math:`O(ndk)` instead of
        :math:`O(nd^2)`. They must reproduce ``A``.
    score : {"query_key", "key_query"}, default "query_key"
        Convention of the ``A`` (and ``Q``, ``K``) passed in. ``"key_query"`` means the released
        code's :math:`A_{\mathrm{code}}` with score :math:`x_j^\top A_{\mathrm{code}} x_i`; it is
        transposed on construction (and ``Q``, ``K`` swapped), so the stored ``A`` always follows
        the query-key convention.
    rope : RotaryEmbedding, optional
        Rotary embedding applied to :math:`Qx_i` and :math:`Kx_j` at their token positions
        (requires ``Q`` and ``K``; no bias terms). ``A`` is then the score at relative position 0.
        The analytic Jacobian and the theory's bounds assume no rotary embedding.
    q_bias, k_bias : Tensor, shape (k,), optional
        Head-space query and key biases (Qwen2, and any head with QK-norm or soft-capping, where
        the reduced term ``c`` is not exact). Require ``Q`` and ``K``; exclude ``c``. In the
        scale of ``Q`` and ``K`` (with the logit scale folded into ``Q``, ``q_bias`` is
        ``scale * b_q``).
    q_norm, k_norm : RMSNorm, optional
        QK-norm (Qwen3, Gemma-3): RMS norms of width ``k`` applied to :math:`Qx_i + b_q` and
        :math:`Kx_j + b_k` before the rotary embedding. Require ``Q`` and ``K``; exclude ``c``.
    logit_scale : float, optional
        Factor :math:`s` multiplying the dot product after the norms and the rotation (needed
        with QK-norm, where the scale cannot be folded into ``Q``); default 1. ``A`` is then
        :math:`s\,Q^\top K`.
    softcap : float, optional
        Gemma-2 logit soft-capping :math:`\kappa > 0`: the score becomes
        :math:`\kappa\tanh(\mathrm{score}/\kappa)` before ALiBi, log-weights and masks.
    window : int, optional
        Sliding window :math:`W \ge 1` in token-index units: key :math:`j` is admissible for
        query :math:`i` only when :math:`|\tau_i - \tau_j| < W` (with ``masked``: the
        :math:`W` keys :math:`\tau_i - W < \tau_j \le \tau_i`, Mistral's and Gemma's
        ``sliding_window``; without: ModernBERT's symmetric window with
        ``window = local_attention // 2 + 1``). :math:`\tau` are the token indices
        (``token_index``, default ``0, ..., n-1``), docs/theory.md §B6.
    alibi_slope : float, optional
        ALiBi slope :math:`m` (BLOOM, MPT): the logit gains :math:`m(\tau_j - \tau_i)`,
        i.e. :math:`-m(i - j)` on causal rows (BLOOM adds :math:`m\,j`, which differs by a
        per-row constant).

    Notes
    -----
    Order of operations (docs/theory.md §B6), for a head with factors:

    .. math::
        q_i = R_{\tau_i}\,\mathrm{norm}_q(Qx_i + b_q),\quad
        k_j = R_{\tau_j}\,\mathrm{norm}_k(Kx_j + b_k),\quad
        s_{ij} = \kappa\tanh\big(s\,q_i^\top k_j/\kappa\big),\quad
        \ell_{ij} = s_{ij} + m(\tau_j - \tau_i) + \log a_j,

    then keys outside the causal mask and the window get :math:`-\infty`. Every field left at
    ``None`` is skipped, and a head without any of them follows the original code path.
    """

    # The stored A is always a matrix (computed from Q and K when the constructor gets None), so
    # the field is typed Tensor and the constructor below is written out to accept None.
    A: Tensor
    V: Tensor
    c: Tensor | None = None
    b: Tensor | None = None
    Q: Tensor | None = None
    K: Tensor | None = None
    rope: RotaryEmbedding | None = None
    q_bias: Tensor | None = None
    k_bias: Tensor | None = None
    q_norm: RMSNorm | None = None
    k_norm: RMSNorm | None = None
    logit_scale: float | None = None
    softcap: float | None = None
    window: int | None = None
    alibi_slope: float | None = None

    def __init__(
        self,
        A: Tensor | None,
        V: Tensor,
        c: Tensor | None = None,
        b: Tensor | None = None,
        Q: Tensor | None = None,
        K: Tensor | None = None,
        rope: RotaryEmbedding | None = None,
        score: ScoreConvention = "query_key",
        q_bias: Tensor | None = None,
        k_bias: Tensor | None = None,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        logit_scale: float | None = None,
        softcap: float | None = None,
        window: int | None = None,
        alibi_slope: float | None = None,
    ) -> None:
        values = (A, V, c, b, Q, K, rope, q_bias, k_bias, q_norm, k_norm, logit_scale, softcap,
                  window, alibi_slope)  # fmt: skip
        for name, value in zip(HEAD_FIELDS, values, strict=True):
            object.__setattr__(self, name, value)
        self._validate(A, score)

    def _validate(self, A_in: Tensor | None, score: ScoreConvention) -> None:
        """Check and convert the fields set by the constructor; ``A_in`` is the ``A`` passed."""
        _check_score(score)
        if (self.Q is None) != (self.K is None):
            raise ValueError("Q and K must be given together")
        if A_in is None and self.Q is None:
            raise ValueError("A is required unless the factors Q and K are given")
        Q = K = None
        if self.Q is not None:
            Q = _matrix(self.Q, "Q")
            K = _matrix(self.K, "K", like=Q, leading="Q")
            if Q.shape != K.shape:
                raise ValueError(
                    f"Q and K must have the same shape, got {tuple(Q.shape)} and {tuple(K.shape)}"
                )
        if self.logit_scale is not None:
            ls = _finite_number(self.logit_scale, "logit_scale", positive=True)
            if Q is None:
                raise ValueError("logit_scale needs the factors Q and K")
            object.__setattr__(self, "logit_scale", ls)
        if A_in is not None:
            A = _matrix(A_in, "A", like=Q, leading="Q")
        elif Q is not None and K is not None:
            A = Q.mT @ K if self.logit_scale is None else self.logit_scale * (Q.mT @ K)
        else:  # excluded above
            raise ValueError("A is required unless the factors Q and K are given")
        d = A.shape[0]
        if A.shape != (d, d):
            raise ValueError(f"A must be square, got shape {tuple(A.shape)}")
        if Q is not None and Q.shape[1] != d:
            raise ValueError(f"Q and K must have shape (k, {d}) to match A, got {tuple(Q.shape)}")
        V = _matrix(self.V, "V", like=A, leading="A")
        if V.shape[1] != d:
            raise ValueError(f"V must have shape (d_v, {d}) to match A, got {tuple(V.shape)}")
        if score == "key_query":
            A = A.mT
            Q, K = K, Q
        if Q is not None and K is not None and A_in is not None:
            tol = 1e3 * torch.finfo(A.dtype).eps * max(1.0, float(A.abs().max()))
            QK = Q.mT @ K if self.logit_scale is None else self.logit_scale * (Q.mT @ K)
            if float((QK - A).abs().max()) > tol:
                raise ValueError("Q and K do not reproduce A (A must equal Q^T K)")
        for name, value in (("A", A), ("V", V), ("Q", Q), ("K", K)):
            object.__setattr__(self, name, value)
        if self.rope is not None:
            if Q is None:
                raise ValueError("a rotary embedding needs the factors Q and K")
            if self.rope.k != Q.shape[0]:
                raise ValueError(
                    f"rotary embedding of width {self.rope.k} for heads of width {Q.shape[0]}"
                )
            if self.c is not None:
                raise ValueError(
                    "c with a rotary embedding is not exact: give the head-space biases "
                    "q_bias, k_bias instead"
                )
            object.__setattr__(self, "rope", self.rope.to(dtype=A.dtype, device=A.device))
        if self.c is not None:
            object.__setattr__(self, "c", _vector(self.c, "c", d, A, "A"))
        if self.b is not None:
            object.__setattr__(self, "b", _vector(self.b, "b", V.shape[0], A, "A"))
        self._validate_variants(Q, A)

    def _validate_variants(self, Q: Tensor | None, A: Tensor) -> None:
        """Check and convert the variant fields (QK-norm, biases, soft-cap, window, ALiBi)."""
        k = None if Q is None else Q.shape[0]
        for name in ("q_bias", "k_bias"):
            val = getattr(self, name)
            if val is None:
                continue
            if k is None:
                raise ValueError(f"{name} needs the factors Q and K")
            if self.c is not None:
                raise ValueError(f"{name} and c both given: use either c or q_bias/k_bias")
            object.__setattr__(self, name, _vector(val, name, k, A, "A"))
        for name in ("q_norm", "k_norm"):
            val = getattr(self, name)
            if val is None:
                continue
            if not isinstance(val, RMSNorm):
                raise ValueError(f"{name} must be an RMSNorm, got {type(val).__name__}")
            if Q is None:
                raise ValueError(f"{name} needs the factors Q and K")
            if val.k != k:
                raise ValueError(f"{name} has width {val.k} for heads of width {k}")
            if self.c is not None:
                raise ValueError(f"{name} with c is not exact: give q_bias, k_bias instead")
            object.__setattr__(self, name, val.to(dtype=A.dtype, device=A.device))
        if self.softcap is not None:
            cap = _finite_number(self.softcap, "softcap", positive=True)
            if self.c is not None:
                raise ValueError("softcap with c is not exact: give q_bias, k_bias instead")
            object.__setattr__(self, "softcap", cap)
        if self.window is not None:
            w = self.window
            if isinstance(w, bool) or not isinstance(w, (int, np.integer)):
                raise ValueError(f"window must be an integer, got {w!r}")
            if w < 1:
                raise ValueError(f"window must be at least 1, got {w}")
            object.__setattr__(self, "window", int(w))
        if self.alibi_slope is not None:
            m = _finite_number(self.alibi_slope, "alibi_slope", positive=False)
            object.__setattr__(self, "alibi_slope", m)

    @property
    def variants(self) -> tuple[str, ...]:
        """Names of the attention variants this head uses beyond the bilinear score.

        Empty for a plain head (with or without ``c``, ``b`` and a full rotary embedding).
        Consumers that model only the plain map raise an error naming these.
        """
        out = []
        if self.q_norm is not None or self.k_norm is not None:
            out.append("QK-norm")
        if self.q_bias is not None or self.k_bias is not None:
            out.append("head-space query/key biases")
        if self.logit_scale is not None:
            out.append("a logit scale after QK-norm")
        if self.softcap is not None:
            out.append("soft-capped logits")
        if self.window is not None:
            out.append("a sliding-window mask")
        if self.alibi_slope is not None:
            out.append("ALiBi biases")
        if self.rope is not None and self.rope.head_dim is not None:
            out.append("a partial rotary embedding")
        return tuple(out)

    @classmethod
    def _from_validated(cls, **fields: Tensor | RotaryEmbedding | None) -> AttentionParams:
        """Build a head from pieces of matrices that the caller has already validated."""
        head = object.__new__(cls)
        for name in HEAD_FIELDS:
            object.__setattr__(head, name, fields.get(name))
        return head

    @property
    def d(self) -> int:
        """Input dimension."""
        return self.A.shape[0]

    @property
    def d_v(self) -> int:
        """Output (value) dimension."""
        return self.V.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the parameters."""
        return self.A.dtype

    @property
    def device(self) -> torch.device:
        """Device of the parameters."""
        return self.A.device

    @property
    def factors(self) -> tuple[Tensor, Tensor] | None:
        """The factors ``(Q, K)`` of ``A``, or ``None`` for a head given by ``A`` alone."""
        if self.Q is None or self.K is None:
            return None
        return self.Q, self.K

    @property
    def heads(self) -> tuple[AttentionParams]:
        """The head itself, so one head and many heads iterate alike."""
        return (self,)

    def A_norm(self) -> Tensor:
        r""":math:`\|A\|_2` (an error for a head with variants, whose logits ``A`` does not give)."""
        if self.variants:
            raise ValueError(f"A_norm does not model {', '.join(self.variants)} yet")
        return spectral_norm(self.A)

    def V_norm(self) -> Tensor:
        r""":math:`\|V\|_2`."""
        return spectral_norm(self.V)

    def without_biases(self) -> AttentionParams:
        """Return the same head without ``c``, ``b``, ``q_bias``, ``k_bias`` (bias-free map)."""
        return replace(self, c=None, b=None, q_bias=None, k_bias=None)

    def to(self, *args: Any, **kwargs: Any) -> AttentionParams:
        """Move every tensor, as :meth:`torch.Tensor.to`."""

        def mv(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(*args, **kwargs)

        # With factors, A is recomputed from the moved Q and K: a cast of A rounded in another
        # dtype would not reproduce Q^T K to the new dtype's precision.
        return AttentionParams(
            None if self.Q is not None else self.A.to(*args, **kwargs),
            self.V.to(*args, **kwargs),
            c=mv(self.c),
            b=mv(self.b),
            Q=mv(self.Q),
            K=mv(self.K),
            rope=None if self.rope is None else self.rope.to(*args, **kwargs),
            q_bias=mv(self.q_bias),
            k_bias=mv(self.k_bias),
            q_norm=None if self.q_norm is None else self.q_norm.to(*args, **kwargs),
            k_norm=None if self.k_norm is None else self.k_norm.to(*args, **kwargs),
            logit_scale=self.logit_scale,
            softcap=self.softcap,
            window=self.window,
            alibi_slope=self.alibi_slope,
        )


#: Every field of a head, in the order of :class:`AttentionParams`.
HEAD_FIELDS = (
    "A", "V", "c", "b", "Q", "K", "rope", "q_bias", "k_bias", "q_norm", "k_norm", "logit_scale",
    "softcap", "window", "alibi_slope",
)  # fmt: skip


@dataclass(frozen=True, eq=False)
class MultiHeadParams:
    r"""Several heads and an optional output projection (docs/theory.md §B1).

    .. math:: f^{\mathrm{MH}}(X)_i = W^O\big[f^1(X)_i;\dots;f^H(X)_i\big] + b^O
              = \sum_h W_h f^h(X)_i + b^O,

    where :math:`W_h` is column block :math:`h` of :math:`W^O`. Without ``W_O`` the heads are
    concatenated, as in ``BertSelfAttention``.

    Parameters
    ----------
    heads : sequence of AttentionParams
        Heads with a common input dimension ``d`` and value dimension ``d_v``.
    W_O : Tensor, shape (d_out, H * d_v), optional
        Output projection (``nn.Linear`` layout: out, in).
    b_O : Tensor, shape (d_out,), optional
        Output bias; requires ``W_O``.
    """

    heads: tuple[AttentionParams, ...]
    W_O: Tensor | None = None
    b_O: Tensor | None = None

    def __post_init__(self) -> None:
        heads = tuple(self.heads)
        if not heads:
            raise ValueError("MultiHeadParams needs at least one head")
        if not all(isinstance(h, AttentionParams) for h in heads):
            raise TypeError("heads must be AttentionParams instances")
        h0 = heads[0]
        for i, h in enumerate(heads):
            if h.d != h0.d or h.d_v != h0.d_v:
                raise ValueError(
                    f"head {i} has (d, d_v) = ({h.d}, {h.d_v}), head 0 has ({h0.d}, {h0.d_v})"
                )
            if h.dtype != h0.dtype or h.device != h0.device:
                raise ValueError(
                    f"head {i} has dtype/device {h.dtype}/{h.device}, head 0 {h0.dtype}/{h0.device}"
                )
        object.__setattr__(self, "heads", heads)
        if self.W_O is not None:
            W_O = _matrix(self.W_O, "W_O", like=h0.A, leading="the heads' A")
            if W_O.shape[1] != len(heads) * h0.d_v:
                raise ValueError(
                    f"W_O must have {len(heads) * h0.d_v} columns (heads x d_v), got {tuple(W_O.shape)}"
                )
            object.__setattr__(self, "W_O", W_O)
        if self.b_O is not None:
            if self.W_O is None:
                raise ValueError("b_O requires W_O")
            object.__setattr__(
                self, "b_O", _vector(self.b_O, "b_O", self.W_O.shape[0], h0.A, "the heads' A")
            )

    @property
    def n_heads(self) -> int:
        """Number of heads ``H``."""
        return len(self.heads)

    @property
    def d(self) -> int:
        """Input dimension."""
        return self.heads[0].d

    @property
    def d_out(self) -> int:
        """Output dimension (``W_O`` rows, or ``H * d_v`` without projection)."""
        return self.W_O.shape[0] if self.W_O is not None else self.n_heads * self.heads[0].d_v

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the parameters."""
        return self.heads[0].dtype

    @property
    def device(self) -> torch.device:
        """Device of the parameters."""
        return self.heads[0].device

    def head_projection(self, h: int) -> Tensor | None:
        r"""Column block :math:`W_h` of :math:`W^O` acting on head ``h`` (``None`` without projection)."""
        if self.W_O is None:
            return None
        d_v = self.heads[0].d_v
        return self.W_O[:, h * d_v : (h + 1) * d_v]

    def head_output_matrix(self, h: int) -> Tensor:
        r""":math:`W_hV_h` (or :math:`V_h` without projection), shape (d_out_h, d)."""
        W = self.head_projection(h)
        V = self.heads[h].V
        return V if W is None else W @ V

    def without_biases(self) -> MultiHeadParams:
        """Return the same layer without any bias."""
        return MultiHeadParams(tuple(h.without_biases() for h in self.heads), W_O=self.W_O)

    def to(self, *args: Any, **kwargs: Any) -> MultiHeadParams:
        """Move every tensor, as :meth:`torch.Tensor.to`."""
        return MultiHeadParams(
            tuple(h.to(*args, **kwargs) for h in self.heads),
            W_O=None if self.W_O is None else self.W_O.to(*args, **kwargs),
            b_O=None if self.b_O is None else self.b_O.to(*args, **kwargs),
        )

    @classmethod
    def from_qkv(
        cls,
        W_Q: Tensor,
        W_K: Tensor,
        W_V: Tensor,
        W_O: Tensor | None = None,
        *,
        n_heads: int,
        n_kv_heads: int | None = None,
        b_Q: Tensor | None = None,
        b_K: Tensor | None = None,
        b_V: Tensor | None = None,
        b_O: Tensor | None = None,
        layout: Literal["linear", "conv1d"] = "linear",
        scale: float | None = None,
        score: ScoreConvention = "query_key",
        rope: RotaryEmbedding | None = None,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        softcap: float | None = None,
        window: int | None = None,
        alibi_slopes: object | None = None,
    ) -> MultiHeadParams:
        r"""Build a layer from projection weights, slicing heads (docs/conventions.md §2-§3).

        Head ``h`` has :math:`Q_h` = row block ``h`` of ``W_Q`` (``nn.Linear`` layout, (out, in)),
        :math:`K_h, V_h` = row block ``g(h)`` of ``W_K``, ``W_V`` with
        ``g(h) = h // (n_heads // n_kv_heads)`` (grouped-query attention), and

        .. math:: A_h = \mathrm{scale}\;Q_h^\top K_h,\qquad c_h = \mathrm{scale}\;K_h^\top b_{Q,h},

        so that :math:`x_i^\top A_hx_j + c_h^\top x_j` equals the logit
        :math:`\mathrm{scale}\,\langle Q_hx_i + b_{Q,h}, K_hx_j + b_{K,h}\rangle` up to terms that
        depend on the query only and cancel in the softmax (docs/conventions.md §1). ``b_K`` is
        accepted for completeness and drops out.

        Parameters
        ----------
        W_Q, W_K, W_V : Tensor
            Projection weights. ``layout="linear"``: shapes (H k, d), (H_kv k, d), (H_kv k_v, d),
            as stored by ``nn.Linear``. ``layout="conv1d"``: the transposes, as stored by GPT-2's
            ``Conv1D`` (in, out); heads are then *column* blocks.
        W_O : Tensor, optional
            Output projection, (d_out, H k_v) for ``linear`` and (H k_v, d_out) for ``conv1d``.
        n_heads : int
            Number of query heads ``H``.
        n_kv_heads : int, optional
            Number of key/value heads (grouped-query attention); default ``n_heads``.
        b_Q, b_K, b_V, b_O : Tensor, optional
            Biases.
        layout : {"linear", "conv1d"}
            Storage layout of the weight matrices.
        scale : float, optional
            Logit scale, default :math:`1/\sqrt k`.
        score : {"query_key", "key_query"}
            ``"key_query"`` swaps the roles of ``W_Q`` and ``W_K``, reproducing the released
            code's :math:`A_{\mathrm{code}} = K^\top Q/\sqrt k` as this toolkit's ``A``.
        rope : RotaryEmbedding, optional
            Rotary embedding shared by every head (Llama-style models). With ``b_Q``/``b_K``
            (Qwen2) the heads get the head-space biases ``q_bias = scale * b_Q[h]``,
            ``k_bias = b_K[g(h)]``.
        q_norm, k_norm : RMSNorm, optional
            QK-norm of width ``k`` shared by every head (Qwen3, Gemma-3). ``Q_h`` is then the
            unscaled row block and ``scale`` becomes the heads' ``logit_scale``; the biases are
            ``q_bias = b_Q[h]``, ``k_bias = b_K[g(h)]``.
        softcap : float, optional
            Logit soft-cap of every head (Gemma-2).
        window : int, optional
            Sliding window of every head (AttentionParams.window).
        alibi_slopes : sequence of float, optional
            One ALiBi slope per query head.

        Heads with any of these options are validated like :class:`AttentionParams` built by
        hand; without them the construction is unchanged.
        """
        _check_score(score)
        if layout not in ("linear", "conv1d"):
            raise ValueError(f"layout must be 'linear' or 'conv1d', got {layout!r}")
        W_Q, W_K, W_V = (_matrix(W, name) for W, name in ((W_Q, "W_Q"), (W_K, "W_K"), (W_V, "W_V")))
        for W, name in ((W_K, "W_K"), (W_V, "W_V")):
            if W.dtype != W_Q.dtype:
                raise ValueError(
                    f"{name} has dtype {W.dtype} but W_Q has {W_Q.dtype}; the parameters of a "
                    f"layer share one dtype: convert one of them with .to({W_Q.dtype})"
                )
        W_K, W_V = W_K.to(W_Q), W_V.to(W_Q)
        if W_O is not None:
            W_O = _matrix(W_O, "W_O", like=W_Q, leading="W_Q")
        if layout == "conv1d":
            W_Q, W_K, W_V = W_Q.mT, W_K.mT, W_V.mT
            W_O = None if W_O is None else W_O.mT
        if score == "key_query":
            W_Q, W_K = W_K, W_Q
            b_Q, b_K = b_K, b_Q
        H = int(n_heads)
        H_kv = H if n_kv_heads is None else int(n_kv_heads)
        if H < 1 or H_kv < 1 or H % H_kv:
            raise ValueError(f"n_heads ({H}) must be a positive multiple of n_kv_heads ({H_kv})")
        d = W_Q.shape[1]
        if W_K.shape[1] != d or W_V.shape[1] != d:
            raise ValueError(
                f"W_Q, W_K, W_V must share the input dimension, got {d}, {W_K.shape[1]}, {W_V.shape[1]}"
            )
        if W_Q.shape[0] % H or W_K.shape[0] % H_kv or W_V.shape[0] % H_kv:
            raise ValueError(
                f"projection sizes {W_Q.shape[0]}, {W_K.shape[0]}, {W_V.shape[0]} are not divisible "
                f"by the head counts ({H}, {H_kv}, {H_kv})"
            )
        k = W_Q.shape[0] // H
        if W_K.shape[0] // H_kv != k:
            raise ValueError(f"query and key heads differ in width: {k} and {W_K.shape[0] // H_kv}")
        k_v = W_V.shape[0] // H_kv
        s = 1.0 / k**0.5 if scale is None else float(scale)
        b_Qv = None if b_Q is None else _vector(b_Q, "b_Q", W_Q.shape[0], W_Q, "W_Q")
        b_Vv = None if b_V is None else _vector(b_V, "b_V", W_V.shape[0], W_Q, "W_Q")
        # Plain heads reduce b_Q to the key logit term c and drop b_K, which cancels in the
        # softmax; heads with variants keep both as head-space biases.
        b_Kv = None if b_K is None else _vector(b_K, "b_K", W_K.shape[0], W_Q, "W_Q")
        if rope is not None:
            if not isinstance(rope, RotaryEmbedding) or rope.k != k:
                raise ValueError(f"rope must be a RotaryEmbedding of width {k}")
            rope = rope.to(dtype=W_Q.dtype, device=W_Q.device)
        slopes = None
        if alibi_slopes is not None:
            slopes = [float(v) for v in np.asarray(alibi_slopes, dtype=float).reshape(-1)]
            if len(slopes) != H:
                raise ValueError(
                    f"alibi_slopes must have {H} entries (one per head), got {len(slopes)}"
                )
        normed = q_norm is not None or k_norm is not None
        variant = rope is not None or normed or softcap is not None
        heads = []
        for h in range(H):
            g = h // (H // H_kv)  # the key/value head of query head h
            Qh, Kh = W_Q[h * k : (h + 1) * k], W_K[g * k : (g + 1) * k]
            Vh = W_V[g * k_v : (g + 1) * k_v]
            b = None if b_Vv is None else b_Vv[g * k_v : (g + 1) * k_v]
            slope = None if slopes is None else slopes[h]
            qb = None if b_Qv is None else b_Qv[h * k : (h + 1) * k]
            kb = None if b_Kv is None else b_Kv[g * k : (g + 1) * k]
            c = None if variant or qb is None else Kh.mT @ qb * s
            if not variant:  # b_Q becomes the key logit term c; b_K cancels
                qb = kb = None
            if not normed:  # fold the scale into the query map and its bias
                Qh = s * Qh
                qb = None if qb is None else s * qb
            if not variant and window is None and slope is None:
                # Slices of matrices validated above: skip re-checking every head.
                heads.append(
                    AttentionParams._from_validated(A=Qh.mT @ Kh, V=Vh, c=c, b=b, Q=Qh, K=Kh)
                )
            else:
                heads.append(
                    AttentionParams(
                        None, Vh, c=c, b=b, Q=Qh, K=Kh, rope=rope, q_bias=qb, k_bias=kb,
                        q_norm=q_norm, k_norm=k_norm, logit_scale=s if normed else None,
                        softcap=softcap, window=window, alibi_slope=slope,
                    )
                )  # fmt: skip
        return cls(tuple(heads), W_O=W_O, b_O=b_O)


@dataclass(frozen=True, eq=False)
class L2AttentionParams:
    r"""L2 multi-head self-attention of Kim, Papamakarios & Mnih (ICML 2021), docs/theory.md §B4.

    Row-vector convention, width :math:`D`, :math:`H` heads of width :math:`D/H`, **tied**
    query and key maps :math:`W^{Q,h}\in\mathbb R^{D\times D/H}`:

    .. math::
        P^h_{ij}\propto\exp\Big(-\frac{\|x_i^\top W^{Q,h}-x_j^\top W^{Q,h}\|^2}{\sqrt{D/H}}\Big),\quad
        f^h(X) = P^hXA_h,\quad A_h = \frac{W^{Q,h}W^{Q,h\top}}{\sqrt{D/H}},\quad
        F(X) = \big[f^1(X)W^{V,1},\dots,f^H(X)W^{V,H}\big]W^O .

    Parameters
    ----------
    W_Q : Tensor, shape (H, D, D/H)
    W_V : Tensor, shape (H, D, D_v)
    W_O : Tensor, shape (H * D_v, D_out), optional (identity when omitted)

    Notes
    -----
    Provenance: definition *recalled and unverified*, consistent with public implementations
    (docs/theory.md §B4). Tying the query and key maps is required for Lipschitz continuity.
    """

    W_Q: Tensor
    W_V: Tensor
    W_O: Tensor | None = None

    def __post_init__(self) -> None:
        W_Q = as_float_tensor(self.W_Q, "W_Q")
        if W_Q.ndim != 3:
            raise ValueError(f"W_Q must have shape (H, D, D/H), got {tuple(W_Q.shape)}")
        check_finite(W_Q, "W_Q")
        H, D, _ = W_Q.shape
        W_V = _as_like(self.W_V, "W_V", W_Q, "W_Q")
        if W_V.ndim != 3 or W_V.shape[:2] != (H, D):
            raise ValueError(f"W_V must have shape ({H}, {D}, D_v), got {tuple(W_V.shape)}")
        check_finite(W_V, "W_V")
        object.__setattr__(self, "W_Q", W_Q)
        object.__setattr__(self, "W_V", W_V)
        if self.W_O is not None:
            W_O = _matrix(self.W_O, "W_O", like=W_Q, leading="W_Q")
            if W_O.shape[0] != H * W_V.shape[2]:
                raise ValueError(f"W_O must have {H * W_V.shape[2]} rows, got {tuple(W_O.shape)}")
            object.__setattr__(self, "W_O", W_O)

    @property
    def n_heads(self) -> int:
        """Number of heads ``H``."""
        return self.W_Q.shape[0]

    @property
    def D(self) -> int:
        """Model width ``D``."""
        return self.W_Q.shape[1]

    def scale(self) -> float:
        r""":math:`\sqrt{D/H}` with :math:`D/H` the query width."""
        return float(self.W_Q.shape[2]) ** 0.5
