r"""The result of :func:`~meanfield.lipschitz.local_lipschitz`: :class:`LipschitzEstimate`.

An estimate with its certified bracket, and its bit-exact ``.safetensors`` round trip
(:meth:`LipschitzEstimate.save`, :meth:`LipschitzEstimate.load`). Importable from
:mod:`meanfield.lipschitz` (and :mod:`meanfield.lipschitz.engine`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class LipschitzEstimate:
    r"""A local Lipschitz constant with its certified bracket.

    Tensor fields have the batch shape of the input (``()`` for one input).

    Attributes
    ----------
    value : Tensor
        Best estimate (dense: the top singular value; iterative: the final Ritz value).
    lower, upper : Tensor
        Certified bracket ``lower <= exact <= upper`` for the inputs as stored, rounding included
        (docs/rounding.md §4; ``geometry="split"`` uses the first-order relative margin of
        docs/rounding.md §6); ``upper = +inf`` when no certificate is available
        (``upper="none"``, rotary heads in the weighted Wasserstein geometry, or
        :func:`local_lipschitz_fn` without ``method="dense"``) or when the constant exceeds
        float64's range (docs/rounding.md §5). Never NaN, and ``lower <= upper``. With
        ``certify=False`` the trivial bracket ``lower = 0``, ``upper = +inf``.
    converged : Tensor of bool
        Whether the stopping rule (``stop_rule``) was met. ``"residual"``: the returned vector
        meets :math:`\|J^\top Jv-\sigma^2v\|\le\mathrm{tol}\,\sigma^2` (explicit products;
        docs/rounding.md §7). ``"width"``: the returned bracket meets
        ``upper_prob <= width * lower`` (and the residual rule too when ``tol`` was given), or,
        where that width is unreachable (``width_reachable`` false), the residual rule holds. A
        certified float32 solve is re-checked on the float64 operator. How far the computed
        operator may be from the exact one is what the bracket accounts for. Always true for
        ``"dense"`` unless the assembled Jacobian was not finite.
    n_iter, n_matvec : Tensor of int64
        Solver iterations and products with :math:`J` or :math:`J^\top` (0 for ``"dense"``).
    residual : Tensor
        :math:`\|J^\top Jv - \sigma^2v\|` for the returned vector.
    method : str
        ``"dense"``, ``"lanczos"`` or ``"power"`` (the resolved method).
    geometry : str
    upper_method : str
        ``"gram"``, ``"block"`` or ``"none"``.
    vector : Tensor or None, shape (..., n, d)
        Unit top right singular vector estimate of the operator of ``geometry`` (for ``"split"``,
        of the Wasserstein operator).
    history : Tensor or None, shape (n_steps, ...)
        Estimates after each iteration (``None`` for ``"dense"``).
    self_value : Tensor or None
        ``geometry="split"`` only: :math:`\max_i\|S_i\|_2`, the splitting term.
    upper_prob : Tensor or None
        Probabilistic upper bound: ``exact <= upper_prob`` with probability at least
        ``confidence`` over the random start vector of the Lanczos run (Kuczyński–Woźniakowski
        bound, docs/certificates.md). Never above ``upper``. ``None`` when ``delta=None`` or
        ``certify=False``; for ``"dense"``, ``"power"`` and a chosen ``start`` it equals
        ``upper``.
    confidence : float or None
        :math:`1-\delta` of ``upper_prob``.
    stop_rule : str
        How the iteration stopped: ``"width"`` (the certified bracket ``[lower, upper_prob]``
        reached the requested width), ``"residual"`` (the residual rule of ``tol``) or
        ``"dense"`` (no iteration). See :func:`local_lipschitz`, "Stopping rules".
    width : float or None
        The requested width ``1 + prob_rtol`` of ``upper_prob / lower``; ``None`` when the call
        asked for none (the residual rule by choice).
    width_reachable : Tensor of bool or None
        Where a width was requested: whether it can be reached at all at this input and
        precision (false where the rounding margins alone are wider, e.g. float32 at large n;
        such elements stopped on the residual rule instead, and where none can reach it
        ``stop_rule`` is ``"residual"``).
    path : str
        How the products were computed: ``"stored"`` (the attention matrices kept) or
        ``"streaming"`` (recomputed tile by tile, memory linear in :math:`n`).
    """

    value: Tensor
    lower: Tensor
    upper: Tensor
    converged: Tensor
    n_iter: Tensor
    n_matvec: Tensor
    residual: Tensor
    method: str
    geometry: str
    upper_method: str
    vector: Tensor | None = None
    history: Tensor | None = None
    self_value: Tensor | None = None
    upper_prob: Tensor | None = None
    confidence: float | None = None
    stop_rule: str = "residual"
    width: float | None = None
    width_reachable: Tensor | None = None
    path: str = "stored"

    @property
    def ratio(self) -> Tensor:
        """Bracket tightness ``upper / lower``."""
        return self.upper / self.lower

    @property
    def ratio_prob(self) -> Tensor | None:
        """Probabilistic bracket tightness ``upper_prob / lower`` (``None`` without one)."""
        return None if self.upper_prob is None else self.upper_prob / self.lower

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the estimate to one ``.safetensors`` file; :meth:`load` reads it back.

        Every tensor field is stored as a tensor of the file, on the CPU, with its dtype and
        shape (0-d and bool tensors included), bit for bit; the other fields (strings, floats,
        and which optional fields are ``None``) go as JSON into the file's metadata header. The
        file is a standard safetensors file: any safetensors reader opens it, and reading it
        never unpickles anything. Needs the ``safetensors`` package (``pip install safetensors``,
        or the ``hf`` extra).

        Parameters
        ----------
        path : str or os.PathLike
            Destination (conventionally ending in ``.safetensors``); overwritten if present.

        Returns
        -------
        pathlib.Path
        """
        from .. import __version__

        save_file = LipschitzEstimate._safetensors("save")[1]
        tensors: dict[str, Tensor] = {}
        other: dict[str, object] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                # a private contiguous CPU copy: safetensors refuses tensors that share storage
                tensors[f.name] = v.detach().to("cpu", copy=True).contiguous()
            else:
                other[f.name] = v
        meta = {
            "format": "meanfield.LipschitzEstimate",
            "format_version": "1",
            "meanfield_version": __version__,
            "fields": json.dumps(other),
        }
        path = Path(path)
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, device: str | torch.device = "cpu"
    ) -> LipschitzEstimate:
        """Read an estimate written by :meth:`save`.

        Every field comes back as saved: tensors with their dtype and shape, bit for bit (on
        ``device``, the CPU by default), ``None`` fields as ``None``.

        Parameters
        ----------
        path : str or os.PathLike
        device : str or torch.device, default "cpu"
            Where the tensors are placed.

        Returns
        -------
        LipschitzEstimate

        Raises
        ------
        ValueError
            One line, when ``path`` is not a file written by :meth:`save`.
        """
        safe_open = LipschitzEstimate._safetensors("load")[0]
        device = torch.device(device)
        what = f"{path} is not a LipschitzEstimate written by LipschitzEstimate.save"
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except OSError:
            raise
        except Exception as err:  # safetensors' own error: not a file of that format
            raise ValueError(f"{what} ({str(err).splitlines()[0]})") from err
        with handle as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != "meanfield.LipschitzEstimate":
                raise ValueError(f"{what} (no meanfield header)")
            if meta.get("format_version") != "1":
                raise ValueError(f"{what} (format version {meta.get('format_version')!r})")
            tensors = {k: fh.get_tensor(k).to(device) for k in fh.keys()}
        try:
            other = json.loads(meta.get("fields", ""))
        except json.JSONDecodeError as err:
            raise ValueError(f"{what} (malformed field header)") from err
        if not isinstance(other, dict):
            raise ValueError(f"{what} (malformed field header)")
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        values = {**other, **tensors}
        for name, value in values.items():
            kind = fields.get(name)  # the annotation, e.g. "Tensor | None" or "str"
            if kind is None or (name in tensors and name in other):
                ok = False
            elif value is None:
                ok = "None" in kind
            elif kind.startswith("Tensor"):
                ok = isinstance(value, Tensor)
            else:
                ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
            if not ok:
                raise ValueError(f"{what} (unexpected field {name!r})")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in values and f.default is dataclasses.MISSING
        )
        if missing:
            raise ValueError(f"{what} (missing fields {missing})")
        return cls(**values)

    @staticmethod
    def _safetensors(what: str):
        """``(safe_open, save_file)`` of safetensors, or a one-line ImportError."""
        try:
            from safetensors import safe_open
            from safetensors.torch import save_file
        except ImportError as err:
            raise ImportError(
                f"LipschitzEstimate.{what} needs safetensors: pip install safetensors "
                "(or pip install meanfield[hf])"
            ) from err
        return safe_open, save_file
