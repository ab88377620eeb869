r"""The records of a whole-model profile (docs/profile.md): per layer, per block, the chain rule.

Frozen dataclasses, each with ``to_dict`` for the JSON record that ``meanfield profile`` writes;
:class:`ModelProfile` holds them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AttentionRecord",
    "BlockRecord",
    "ChainRecord",
    "LayerRecord",
    "LinearNorm",
    "ModelProfile",
    "ProfileProgress",
]


@dataclass(frozen=True)
class AttentionRecord:
    r"""The attention sublayer's local constant at the hidden state entering it.

    Attributes
    ----------
    value, lower, upper : float
        Estimate and certified bracket of :math:`\|Df(X)\|_2` (:func:`local_lipschitz`,
        rounding included).
    upper_method : str
        ``"gram"`` (dense) or ``"block"`` (matrix-free block-norm bound).
    upper_prob : float
        Probabilistic upper end of the same run (Lanczos: holds with probability
        ``1 - delta`` over the random start; dense: ``upper``).
    converged : bool
    n_matvec : int
    seconds : float
    head_values, head_lowers, head_uppers : tuple of float, or None
        Per head :math:`h`, the same bracket for the head through its slice :math:`W_h` of the
        output projection (``None`` when heads were not profiled).
    """

    value: float
    lower: float
    upper: float
    upper_method: str
    upper_prob: float
    converged: bool
    n_matvec: int
    seconds: float
    head_values: tuple[float, ...] | None = None
    head_lowers: tuple[float, ...] | None = None
    head_uppers: tuple[float, ...] | None = None


@dataclass(frozen=True)
class BlockRecord:
    r"""The whole block's Jacobian norm :math:`\|D\,\mathrm{block}(x)\|_2` (autograd products).

    Attributes
    ----------
    value, lower : float
        Estimate and a true lower end (:math:`\|Jv\|` of the returned unit vector).
    upper : float
        Certified upper end (``inf`` for matrix-free runs; the dense path certifies the Jacobian
        as autograd computes it).
    upper_prob : float
        Upper end holding with probability ``confidence`` over the random start (Lanczos), or
        ``upper`` (dense).
    confidence : float
    method : str
        ``"dense"`` or ``"lanczos"``.
    converged : bool
    n_matvec : int
    seconds : float
    """

    value: float
    lower: float
    upper: float
    upper_prob: float
    confidence: float
    method: str
    converged: bool
    n_matvec: int
    seconds: float

    @property
    def bound(self) -> float:
        """The upper end used in the chain rule: ``upper`` if finite, else ``upper_prob``."""
        return self.upper if math.isfinite(self.upper) else self.upper_prob


@dataclass(frozen=True)
class LinearNorm:
    r"""Spectral norm of one weight matrix of a block.

    Attributes
    ----------
    name : str
        ``q``, ``k``, ``v``, ``o``, ``up``, ``gate`` or ``down``.
    shape : tuple of int
        (out, in).
    sigma : float
        Largest singular value, the square root of the top eigenvalue of the smaller Gram matrix
        :math:`W^\top W` or :math:`WW^\top` (float64; an estimate, not a bound).
    upper : float
        Certified upper bound: ``sigma`` inflated by the rounding margin and proved by a Cholesky
        test of :math:`s^2I-W^\top W\succeq0` (:func:`meanfield._spectral.spectral_norm_upper`,
        whose Gram iteration is the fallback), rounding included.
    """

    name: str
    shape: tuple[int, int]
    sigma: float
    upper: float


@dataclass(frozen=True)
class LayerRecord:
    """One layer at one window length.

    Attributes
    ----------
    layer, n : int
    radius : float
        Largest token norm of the hidden state entering the block.
    attention_radius : float
        Largest token norm entering the attention sublayer.
    attention : AttentionRecord
    block : BlockRecord
    """

    layer: int
    n: int
    radius: float
    attention_radius: float
    attention: AttentionRecord
    block: BlockRecord


@dataclass(frozen=True)
class ChainRecord:
    r"""The chain rule across the profiled layers at one window length.

    Attributes
    ----------
    n : int
    layers : tuple of int
    product_value : float
        :math:`\prod_\ell` of the block estimates.
    product_bound : float
        :math:`\prod_\ell` of the blocks' upper ends (:attr:`BlockRecord.bound`).
    bound_kind : {"certified", "probabilistic"}
        ``"probabilistic"`` when any factor is a Lanczos ``upper_prob``.
    confidence : float
        Probability that ``product_bound`` holds (union bound over the factors).
    end_to_end : BlockRecord
        The stack's own Jacobian norm at the first layer's input.
    holds : bool
        ``end_to_end.lower <= product_bound``: the chain rule, checked against a true lower end.
    slack : float
        ``product_value / end_to_end.value``: how much the layer-by-layer product overestimates.
    """

    n: int
    layers: tuple[int, ...]
    product_value: float
    product_bound: float
    bound_kind: str
    confidence: float
    end_to_end: BlockRecord
    holds: bool
    slack: float


@dataclass(frozen=True)
class ProfileProgress:
    """What :func:`profile_model` passes to a ``progress`` callback after each step.

    Attributes
    ----------
    step, total : int
        Steps finished and planned (one per layer and window length, plus one end-to-end run per
        window length).
    label : str
        E.g. ``"n=128 layer 3"`` or ``"n=128 end-to-end"``.
    cost, total_cost : float
        Estimated cost of this step and of the whole run (arbitrary units, for an ETA).
    """

    step: int
    total: int
    label: str
    cost: float
    total_cost: float


@dataclass(frozen=True)
class ModelProfile:
    """Result of :func:`profile_model`.

    Attributes
    ----------
    model : str
        Label of the model.
    arch : str
    n_layers, d, n_heads : int
    causal : bool
    layers, ns : tuple of int
        The profiled layers and window lengths.
    dtype, device : str
        Precision and device of every computation.
    records : tuple of LayerRecord
        One per (n, layer), ``n``-major.
    linear : tuple of (int, tuple of LinearNorm)
        Per layer, its weight matrices' norms.
    chains : tuple of ChainRecord
        One per ``n`` (empty when the layers are not consecutive).
    settings : dict
        ``tol``, ``delta``, ``seed``, ``heads``, ``start``, input kind.
    seconds : float
        Wall time of the whole profile.
    """

    model: str
    arch: str
    n_layers: int
    d: int
    n_heads: int
    causal: bool
    layers: tuple[int, ...]
    ns: tuple[int, ...]
    dtype: str
    device: str
    records: tuple[LayerRecord, ...]
    linear: tuple[tuple[int, tuple[LinearNorm, ...]], ...]
    chains: tuple[ChainRecord, ...]
    settings: dict[str, Any]
    seconds: float

    def record(self, layer: int, n: int) -> LayerRecord:
        """The record of ``layer`` at window length ``n``."""
        for r in self.records:
            if r.layer == layer and r.n == n:
                return r
        raise KeyError(f"no record for layer {layer} at n = {n}")

    def chain(self, n: int) -> ChainRecord:
        """The chain-rule record at window length ``n``."""
        for c in self.chains:
            if c.n == n:
                return c
        raise KeyError(f"no chain-rule record at n = {n}")

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dictionary (floats, ints, strings, lists; ``inf`` stays a float)."""

        def conv(obj: Any) -> Any:
            if hasattr(obj, "__dataclass_fields__"):
                return {k: conv(getattr(obj, k)) for k in obj.__dataclass_fields__}
            if isinstance(obj, dict):
                return {str(k): conv(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [conv(v) for v in obj]
            return obj

        out = conv(self)
        out["linear"] = [
            {"layer": layer, "maps": [conv(m) for m in maps]} for layer, maps in self.linear
        ]
        out["kind"] = "profile"
        return out
