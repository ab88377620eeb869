r"""Weighted Dirac measures, the inputs of mean-field attention.

A measure :math:`\mu = \sum_j a_j \delta_{x_j}` is stored as ``points`` (..., n, d) and
``weights`` (..., n) on the probability simplex (docs/theory.md §A1). A causal (position-tagged)
measure also carries ``positions`` (..., n) in [0, 1] and lives on :math:`[0, 1]\times\mathbb R^d`
(docs/theory.md §B2). Leading dimensions are a batch of measures with the same number of atoms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch
from torch import Tensor

from ._numerics import as_float_tensor, check_finite, safe_log

__all__ = ["DiracMeasure"]


def _sum_tolerance(n: int, dtype: torch.dtype) -> float:
    """Tolerance on ``|sum(a) - 1|``: a few rounding errors per summand."""
    return 8.0 * max(n, 16) * torch.finfo(dtype).eps


def _per_atom(values: Tensor, name: str, points: Tensor) -> Tensor:
    """``values`` (weights or positions) as a finite float tensor of shape ``points.shape[:-1]``."""
    values = as_float_tensor(values, name, like=points)
    if values.shape != points.shape[:-1]:
        raise ValueError(
            f"{name} must have shape {tuple(points.shape[:-1])} to match points "
            f"{tuple(points.shape)}, got {tuple(values.shape)}"
        )
    check_finite(values, name)
    return values


@dataclass(frozen=True, eq=False)
class DiracMeasure:
    r"""A (batch of) weighted atomic probability measure(s) :math:`\sum_j a_j\delta_{x_j}`.

    Parameters
    ----------
    points : Tensor, shape (..., n, d)
        Atom locations :math:`x_j`. Integer inputs are converted to the default float dtype.
    weights : Tensor, shape (..., n), optional
        Masses :math:`a_j \ge 0` summing to 1 along the last axis. Default: uniform ``1/n``.
        Cast to the dtype of ``points``.
    positions : Tensor, shape (..., n), optional
        Positions :math:`t_j \in [0, 1]` of a causal measure (docs/theory.md §B2). ``None`` for an
        ordinary (unmasked) measure.
    normalize : bool, default False
        Divide ``weights`` by their sum instead of rejecting weights that do not sum to 1.

    Raises
    ------
    ValueError
        On wrong shapes, non-finite values, negative weights, weights that do not sum to 1
        (unless ``normalize=True``), or positions outside [0, 1]. Each message is one line.

    Notes
    -----
    Masses enter attention only as log-weights, so an atom duplicated ``k`` times equals one atom
    of ``k`` times the mass (see :meth:`split` and :meth:`merge`). Zero masses are allowed and
    behave as absent atoms (log-weight ``-inf``).
    """

    points: Tensor
    weights: Tensor = None  # type: ignore[assignment]
    positions: Tensor | None = None
    normalize: InitVar[bool] = False
    _log_weights: Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self, normalize: bool) -> None:
        points = as_float_tensor(self.points, "points")
        if points.ndim < 2:
            raise ValueError(f"points must have shape (..., n, d), got {tuple(points.shape)}")
        n, d = points.shape[-2], points.shape[-1]
        if n < 1 or d < 1:
            raise ValueError(
                f"a measure needs at least one atom in dimension >= 1, got n={n}, d={d}"
            )
        check_finite(points, "points")

        if self.weights is None:
            weights = points.new_full(points.shape[:-1], 1.0 / n)
        else:
            weights = _per_atom(self.weights, "weights", points)
            if bool((weights < 0).any()):
                raise ValueError(
                    f"weights must be non-negative, got a minimum of {weights.min().item():.3g}"
                )
            total = weights.sum(-1)
            if normalize:
                if bool((total <= 0).any()):
                    raise ValueError("weights sum to zero and cannot be normalized")
                weights = weights / total.unsqueeze(-1)
            else:
                err = (total - 1).abs().max().item()
                if err > _sum_tolerance(n, points.dtype):
                    raise ValueError(
                        f"weights must sum to 1 (off by {err:.3g}); pass normalize=True to rescale them"
                    )

        positions = self.positions
        if positions is not None:
            positions = _per_atom(positions, "positions", points)
            if bool(((positions < 0) | (positions > 1)).any()):
                raise ValueError("positions must lie in [0, 1]")

        object.__setattr__(self, "points", points)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "_log_weights", safe_log(weights))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_sequence(cls, X: Tensor, *, causal: bool = False) -> DiracMeasure:
        r"""The empirical measure :math:`\mathrm m(X) = \frac1n\sum_i\delta_{x_i}` of a sequence.

        Parameters
        ----------
        X : Tensor, shape (..., n, d)
        causal : bool, default False
            Tag token ``i`` (1-based) with position ``i/n`` (docs/theory.md §B2), so that masked
            mean-field attention reproduces causal self-attention.
        """
        X = as_float_tensor(X, "X")
        if X.ndim < 2:
            raise ValueError(f"X must have shape (..., n, d), got {tuple(X.shape)}")
        positions = None
        if causal:
            n = X.shape[-2]
            positions = torch.arange(1, n + 1, dtype=X.dtype, device=X.device) / n
            positions = positions.expand(X.shape[:-1])
        return cls(X, positions=positions)

    @classmethod
    def from_log_weights(
        cls, points: Tensor, log_weights: Tensor, positions: Tensor | None = None
    ) -> DiracMeasure:
        r"""A measure given by its log-masses, kept exact even below the float range.

        ``log_weights`` are normalised by ``logsumexp``. ``weights = exp(log_weights)`` may
        underflow to 0 for masses below ~1e-308, but :attr:`log_weights`, which is what attention
        uses (docs/theory.md §A1), keeps the exact values, so worst-case measures with masses such
        as :math:`e^{-2\lambda R^2}` at large :math:`R` are represented faithfully.
        """
        points = as_float_tensor(points, "points")
        lw = as_float_tensor(log_weights, "log_weights", like=points)
        if bool(torch.isnan(lw).any()) or bool((lw == torch.inf).any()):
            raise ValueError("log_weights must not contain NaN or +inf")
        lw = lw - torch.logsumexp(lw, -1, keepdim=True)
        mu = cls(points, torch.exp(lw), positions, normalize=True)
        object.__setattr__(mu, "_log_weights", lw)
        return mu

    # ------------------------------------------------------------------ properties
    @property
    def n(self) -> int:
        """Number of atoms."""
        return self.points.shape[-2]

    @property
    def d(self) -> int:
        """Ambient dimension."""
        return self.points.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        """Leading (batch) dimensions."""
        return self.points.shape[:-2]

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of points and weights."""
        return self.points.dtype

    @property
    def device(self) -> torch.device:
        """Device of points and weights."""
        return self.points.device

    @property
    def log_weights(self) -> Tensor:
        r"""Log-masses :math:`\log a_j` (``-inf`` for zero masses), shape (..., n)."""
        return self._log_weights

    @property
    def is_causal(self) -> bool:
        """Whether the measure is position-tagged."""
        return self.positions is not None

    def radius(self) -> Tensor:
        r"""Support radius :math:`\max_{j: a_j>0}\|x_j\|`, shape (...)."""
        norms = torch.linalg.vector_norm(self.points, dim=-1)
        return torch.where(self.weights > 0, norms, torch.zeros_like(norms)).amax(-1)

    def rms_radius(self) -> Tensor:
        r"""Root mean square norm :math:`(\sum_j a_j\|x_j\|^2)^{1/2}`, shape (...).

        For uniform weights this is the experiments' "mean radius" (docs/experiments.md, "The
        paper's experiments").
        """
        return (self.weights * self.points.square().sum(-1)).sum(-1).sqrt()

    def mean(self) -> Tensor:
        r"""Barycentre :math:`\sum_j a_j x_j`, shape (..., d)."""
        return (self.weights.unsqueeze(-1) * self.points).sum(-2)

    # ------------------------------------------------------------------ operations
    def _require_unbatched(self, what: str) -> None:
        if self.points.ndim != 2:
            raise ValueError(
                f"{what} needs a single measure, got batch shape {tuple(self.batch_shape)}"
            )

    def split(self, i: int, k: int, *, fractions: Tensor | None = None) -> DiracMeasure:
        """Duplicate atom ``i`` into ``k`` coincident copies (the same measure).

        The copies replace atom ``i`` at indices ``i, ..., i+k-1`` and keep its position, so in a
        causal measure they see each other (docs/theory.md §B2).

        Parameters
        ----------
        i : int
            Index of the atom to split (negative indices count from the end).
        k : int
            Number of copies, ``k >= 1``.
        fractions : Tensor, shape (k,), optional
            Shares of the atom's mass for each copy, non-negative and summing to 1.
            Default: equal shares ``1/k``.
        """
        self._require_unbatched("split")
        n = self.n
        if not -n <= i < n:
            raise IndexError(f"atom index {i} out of range for a measure with {n} atoms")
        i %= n
        if k < 1:
            raise ValueError(f"k must be a positive integer, got {k}")
        if fractions is None:
            shares = torch.full((k,), 1.0 / k, dtype=self.dtype, device=self.device)
        else:
            shares = as_float_tensor(fractions, "fractions", like=self.points)
            if shares.shape != (k,):
                raise ValueError(f"fractions must have shape ({k},), got {tuple(shares.shape)}")
            check_finite(shares, "fractions")
            off = abs(shares.sum().item() - 1)
            if bool((shares < 0).any()) or off > _sum_tolerance(k, self.dtype):
                raise ValueError("fractions must be non-negative and sum to 1")
        reps = torch.ones(n, dtype=torch.long, device=self.device)
        reps[i] = k
        idx = torch.repeat_interleave(torch.arange(n, device=self.device), reps)
        weights = self.weights[idx].clone()
        weights[i : i + k] = self.weights[i] * shares
        positions = None if self.positions is None else self.positions[idx]
        return DiracMeasure(self.points[idx], weights, positions, normalize=True)

    def merge(self, *, atol: float = 0.0, rtol: float = 0.0) -> DiracMeasure:
        """Merge coincident atoms (and equal positions) into one, summing their masses.

        Atoms within ``atol + rtol * scale`` (max-norm over coordinates and position) of the first
        atom of a group are merged into it, where ``scale`` is the largest absolute coordinate (or
        position) of the measure; the merged atom keeps the first atom's location. Groups are
        returned in order of first occurrence. Zero-mass atoms are kept.

        The default merges exactly equal atoms only, which is right for copies made by
        :meth:`split`. Atoms that are *computed* copies of each other (for instance the images of
        split copies under attention) may differ in the last bits, because a matrix product can
        round the same row differently at different row indices; merge those with an ``rtol`` of a
        few hundred machine epsilons, e.g. ``rtol=256 * torch.finfo(mu.dtype).eps``.
        """
        self._require_unbatched("merge")
        for name, tol in (("atol", atol), ("rtol", rtol)):
            if not tol >= 0:
                raise ValueError(f"{name} must be non-negative, got {tol}")
        keys = (
            self.points
            if self.positions is None
            else torch.cat([self.points, self.positions.unsqueeze(-1)], dim=-1)
        )
        n = self.n
        group = torch.full((n,), -1, dtype=torch.long)
        reps: list[int] = []
        keys_cpu = keys.detach().cpu()
        radius = float(atol) + (float(rtol) * float(keys_cpu.abs().amax()) if rtol else 0.0)
        for j in range(n):
            if group[j] >= 0:
                continue
            g = len(reps)
            reps.append(j)
            close = (keys_cpu - keys_cpu[j]).abs().amax(-1) <= radius
            close &= group < 0
            group[close] = g
        group = group.to(self.device)
        rep_idx = torch.tensor(reps, dtype=torch.long, device=self.device)
        weights = self.weights.new_zeros(len(reps)).index_add(0, group, self.weights)
        positions = None if self.positions is None else self.positions[rep_idx]
        return DiracMeasure(self.points[rep_idx], weights, positions, normalize=True)

    def push_forward(self, T: Callable[[Tensor], Tensor]) -> DiracMeasure:
        r"""The image measure :math:`T_\#\mu = \sum_j a_j\delta_{T(x_j)}`.

        ``T`` maps points of shape (..., n, d) to (..., n, d'); masses and positions are kept.
        """
        return DiracMeasure(T(self.points), self.weights, self.positions)

    def to(self, *args: Any, **kwargs: Any) -> DiracMeasure:
        """Move points, weights and positions, as :meth:`torch.Tensor.to`."""
        points = self.points.to(*args, **kwargs)
        return DiracMeasure(
            points,
            self.weights.to(points),
            None if self.positions is None else self.positions.to(points),
            normalize=True,
        )

    def __getitem__(self, index: int | slice | tuple) -> DiracMeasure:
        """Index the batch dimensions (never the atoms)."""
        if self.points.ndim == 2:
            raise IndexError("an unbatched measure cannot be indexed; use .points or .weights")
        if not isinstance(index, tuple):
            index = (index,)
        return DiracMeasure(
            self.points[index],
            self.weights[index],
            None if self.positions is None else self.positions[index],
        )

    def __len__(self) -> int:
        """Number of atoms."""
        return self.n

    def __repr__(self) -> str:
        batch = f", batch_shape={tuple(self.batch_shape)}" if self.batch_shape else ""
        causal = ", causal" if self.is_causal else ""
        return f"DiracMeasure(n={self.n}, d={self.d}{batch}, dtype={self.dtype}{causal})"
