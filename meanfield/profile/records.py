r"""The records of a whole-model profile (docs/profile.md): per layer, per block, the chain rule.

Frozen dataclasses; :class:`ModelProfile` holds them all. ``ModelProfile.to_dict`` gives the
JSON record that ``meanfield profile`` writes; :meth:`ModelProfile.save` / :meth:`ModelProfile.load`
(and ``to_json`` / ``from_json``) store a profile as JSON and read it back as the same objects,
every field equal, floats bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
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
        ``"gram"`` (dense), ``"block"`` (matrix-free block-norm bound) or ``"none"`` (no
        deterministic end: ``upper`` is inf; the streaming path).
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

    @property
    def bound(self) -> float:
        """The upper end the table shows: ``upper`` if finite, else ``upper_prob``.

        ``upper`` is deterministic (rounding included); ``upper_prob`` holds with probability
        ``1 - delta`` over the solver's random start. The streaming path of
        :func:`meanfield.local_lipschitz` (attention variants: QK-norm, logit soft-cap, windows;
        long windows) forms no deterministic end, so there the bound is ``upper_prob``.
        """
        return self.upper if math.isfinite(self.upper) else self.upper_prob


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

        linear = [{"layer": layer, "maps": [conv(m) for m in maps]} for layer, maps in self.linear]
        return {**conv(self), "linear": linear, "kind": "profile"}

    def to_json(self, *, indent: int | None = None) -> str:
        """The profile as a JSON document, which :meth:`from_json` reads back exactly.

        The document is :meth:`to_dict` in strict JSON: floats are written with Python's
        shortest round-tripping repr, so they come back bit for bit, and non-finite floats as
        the strings ``"inf"``, ``"-inf"`` and ``"nan"`` (the JSON files of the ``meanfield``
        command write infinities the same way).

        Parameters
        ----------
        indent : int, optional
            Indentation of the document (default: one line).

        Returns
        -------
        str
        """
        return json.dumps(_encode_floats(self.to_dict()), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        """The profile of a JSON document written by :meth:`to_json` (or :meth:`to_dict`).

        Parameters
        ----------
        text : str

        Returns
        -------
        ModelProfile

        Raises
        ------
        ValueError
            One line, when the document is not a profile.
        """
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not a ModelProfile document (invalid JSON: {err})") from None
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Any) -> ModelProfile:
        """The profile of a dictionary made by :meth:`to_dict`, or the same through JSON.

        Lists come back as tuples and nested dictionaries as the records; non-finite floats may
        be floats or the strings ``"inf"``, ``"-inf"``, ``"nan"`` (``null`` is NaN where a float
        is required). Keys that are not fields are ignored, so the ``profile.json`` written by
        ``meanfield profile`` (with its run metadata) loads too.

        Parameters
        ----------
        doc : dict

        Returns
        -------
        ModelProfile

        Raises
        ------
        ValueError
            One line, when ``doc`` is not a profile (naming the first offending field).
        """
        if not isinstance(doc, dict) or doc.get("kind") != "profile":
            raise ValueError('not a ModelProfile document (no "kind": "profile")')
        doc = dict(doc)
        linear = doc.get("linear")
        if isinstance(linear, list) and all(isinstance(e, dict) for e in linear):
            doc["linear"] = [[e.get("layer"), e.get("maps")] for e in linear]
        try:
            return _decode_dataclass(cls, doc, "profile")
        except _NotARecord as err:
            raise ValueError(f"not a ModelProfile document ({err})") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as a JSON file (:meth:`to_json`); :meth:`load` reads it back.

        Parameters
        ----------
        path : str or os.PathLike
            Destination, conventionally ending in ``.json``; overwritten if present.

        Returns
        -------
        pathlib.Path
        """
        path = Path(path)
        path.write_text(self.to_json(indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ModelProfile:
        """Read a profile written by :meth:`save` (or the ``profile.json`` of ``meanfield profile``).

        Every field comes back as saved: records as records, tuples as tuples, floats bit for bit.

        Parameters
        ----------
        path : str or os.PathLike

        Returns
        -------
        ModelProfile

        Raises
        ------
        ValueError
            One line, when ``path`` does not hold a profile.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not a saved ModelProfile (not a text file)") from None
        try:
            return cls.from_json(text)
        except ValueError as err:
            raise ValueError(f"{path} is not a saved ModelProfile: {err}") from None


# ----------------------------------------------------------------------------------------------
# JSON encoding and type-directed decoding of the records
# ----------------------------------------------------------------------------------------------

#: Non-finite floats as JSON strings (as ``experiments.engine.write_json`` writes them).
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class _NotARecord(Exception):
    """A value that does not fit the field it is read into."""


def _encode_floats(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _encode_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode_floats(v) for v in obj]
    return obj


def _decode_dataclass(cls: Any, doc: Any, where: str) -> Any:
    if not isinstance(doc, dict):
        raise _NotARecord(f"{where}: expected an object, got {type(doc).__name__}")
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in doc:
            values[f.name] = _decode(hints[f.name], doc[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING:
            raise _NotARecord(f"{where}: missing field {f.name!r}")
    return cls(**values)


def _decode(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as the type ``tp`` of a record's field."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = (a for a in args if a is not type(None))
        return _decode(inner, value, where)
    if tp is float:
        if isinstance(value, str) and value in _NONFINITE:
            return _NONFINITE[value]
        if value is None:  # NaN, as experiments.engine.write_json stores it
            return math.nan
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp in (bool, int, str):
        if type(value) is tp:
            return value
    elif origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[T, ...]: one T per item
            args = (args[0],) * len(value)
        if len(args) == len(value):
            return tuple(
                _decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value))
            )
    elif origin is dict and isinstance(value, dict):
        return {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in value.items()}
    elif dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, value, where)
    name = getattr(tp, "__name__", None) or str(tp)
    raise _NotARecord(f"{where}: expected {name}, got {value!r}"[:200])
