"""Log-domain helpers shared by attention, Jacobians and estimators.

Attention weights are always formed as ``softmax(logits)`` with
``logits[i, j] = score(x_i, x_j) + log a_j`` and masked entries set to ``-inf``
(docs/theory.md §A1). Nothing here exponentiates a raw score.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = [
    "as_float_tensor",
    "causal_mask",
    "check_finite",
    "check_row_max",
    "iter_chunks",
    "masked_softmax",
    "safe_log",
]


def as_float_tensor(
    x: object,
    name: str,
    *,
    like: Tensor | None = None,
) -> Tensor:
    """Convert ``x`` to a floating tensor without changing a floating dtype.

    Integer and boolean inputs become ``torch.get_default_dtype()`` (or the dtype of ``like``).
    When ``like`` is given, the result is moved to its dtype and device; a tensor already on
    another device is an error rather than a silent copy.
    """
    if isinstance(x, Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"{name} must be a tensor or array-like, got {type(x).__name__}"
            ) from err
    if like is not None:
        if t.device != like.device and isinstance(x, Tensor):
            raise ValueError(f"{name} is on {t.device} but the points are on {like.device}")
        return t.to(dtype=like.dtype, device=like.device)
    if not (t.is_floating_point() or t.is_complex()):
        t = t.to(torch.get_default_dtype())
    if t.is_complex():
        raise TypeError(f"{name} must be real, got dtype {t.dtype}")
    return t


def check_finite(t: Tensor, name: str) -> None:
    """Raise a one-line ``ValueError`` if ``t`` holds NaN or infinite entries."""
    if t.numel() == 0:
        return
    # Two reductions, no temporary: max and min propagate NaN, and +-inf show up in them.
    hi, lo = t.amax(), t.amin()
    if not (bool(torch.isfinite(hi)) and bool(torch.isfinite(lo))):
        bad = "NaN" if bool(torch.isnan(hi) | torch.isnan(lo)) else "infinite"
        raise ValueError(f"{name} contains {bad} values")


def safe_log(w: Tensor) -> Tensor:
    """Elementwise ``log`` with ``log 0 = -inf`` and no warning (weights are ``>= 0``)."""
    return torch.where(w > 0, torch.log(torch.where(w > 0, w, torch.ones_like(w))), -torch.inf)


def causal_mask(query_positions: Tensor, key_positions: Tensor) -> Tensor:
    """Boolean mask ``allowed[..., i, j] = key_position[j] <= query_position[i]``.

    Parameters
    ----------
    query_positions : Tensor, shape (..., n_q)
    key_positions : Tensor, shape (..., n_k)

    Returns
    -------
    Tensor of bool, shape (..., n_q, n_k)
        ``True`` where query ``i`` may attend to key ``j`` (docs/theory.md §A2: ``t' <= t``,
        so a token always sees itself and every token at the same position).
    """
    return key_positions.unsqueeze(-2) <= query_positions.unsqueeze(-1)


def masked_softmax(logits: Tensor, allowed: Tensor | None = None, *, dim: int = -1) -> Tensor:
    """Softmax of ``logits`` along ``dim`` with disallowed entries at ``-inf``.

    Rows in which every entry is ``-inf`` (every key masked, or every key of zero mass) have no
    attention distribution. The policy is to raise: such a row is always a caller error here,
    because causal rows contain their own token and measures have positive total mass.
    """
    return torch.softmax(admissible_logits(logits, allowed, dim=dim), dim=dim)


def admissible_logits(logits: Tensor, allowed: Tensor | None = None, *, dim: int = -1) -> Tensor:
    """``logits`` with disallowed entries at ``-inf``, after the checks every softmax row needs.

    Raises a one-line ``ValueError`` for a NaN logit, a logit that overflowed to ``+inf``, or a
    row with no admissible key (the policy of :func:`masked_softmax`).
    """
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -torch.inf)
    check_row_max(logits.amax(dim=dim))
    return logits


def check_row_max(row_max: Tensor) -> None:
    """Raise :func:`admissible_logits`' one-line ``ValueError`` unless every row maximum is finite.

    A NaN maximum means a NaN logit, ``+inf`` an overflow, ``-inf`` a row with no admissible key.
    The streaming path passes the maximum it keeps online over the key tiles.
    """
    if not bool(torch.isfinite(row_max).all()):
        if bool(torch.isnan(row_max).any()):
            raise ValueError("attention logits contain NaN")
        if bool((row_max == torch.inf).any()):
            raise ValueError(
                "attention logits overflowed to +inf; inputs are too large for this dtype"
            )
        raise ValueError("an attention row has no admissible key (all keys masked or of zero mass)")


def iter_chunks(n: int, chunk_size: int | None) -> Iterator[slice]:
    """Slices covering ``range(n)`` in blocks of ``chunk_size`` (one block when ``None``)."""
    if chunk_size is None or chunk_size >= n:
        yield slice(0, n)
        return
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    for start in range(0, n, chunk_size):
        yield slice(start, min(start + chunk_size, n))
