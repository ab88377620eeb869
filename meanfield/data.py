r"""Token windows: non-overlapping windows of token ids over a grid of lengths.

Generic windowing of an already tokenized text (docs/experiments.md, "Token windows"): for each
``n`` of a grid, in increasing order, the next ``n_windows * n`` token ids are cut into
``n_windows`` consecutive windows of ``n`` tokens, with one running pointer across the whole
grid, so no two windows overlap (the released code reset the pointer in one run, defect D6 of
docs/experiments.md). Nothing here imports transformers; tokenizers are duck-typed.

The texts themselves (the offline corpora: King James Bible, pydoc topics, user files) are
experiment data and live in :mod:`experiments.corpora`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "TokenWindows",
    "cut_windows",
    "encode_text",
    "tokens_needed",
    "windows",
]


@dataclass(frozen=True, eq=False)
class TokenWindows:
    """``n_windows`` consecutive, non-overlapping windows of ``n`` token ids.

    Parameters
    ----------
    n : int
        Window length.
    token_ids : Tensor of int64, shape (n_windows, n)
        The windows, row ``i`` being ``ids[starts[i] : starts[i] + n]``.
    starts : tuple of int
        Start offset of each window in the tokenized text.
    next_start : int
        Offset just past the last window: the pointer from which the next ``n`` continues.
    """

    n: int
    token_ids: Tensor
    starts: tuple[int, ...]
    next_start: int

    @property
    def n_windows(self) -> int:
        """Number of windows."""
        return len(self.starts)


# ----------------------------------------------------------------------------------------------
# Tokens and windows
# ----------------------------------------------------------------------------------------------


def encode_text(tokenizer: Callable[..., object], text: str) -> list[int]:
    """Token ids of the whole ``text``, tokenized once, special tokens at its two ends only.

    Parameters
    ----------
    tokenizer : callable
        A Hugging Face tokenizer; BERT's adds [CLS] and [SEP] around the whole text, GPT-2's and
        SmolLM2's add nothing.
    text : str

    Returns
    -------
    list of int
    """
    try:
        enc = tokenizer(text, add_special_tokens=True, verbose=False)
    except TypeError:
        enc = tokenizer(text, add_special_tokens=True)
    if isinstance(enc, list):
        ids = enc
    elif isinstance(enc, Mapping):  # a BatchEncoding or a dict
        ids = enc["input_ids"]
    else:
        raise TypeError(f"the tokenizer returned a {type(enc).__name__}, not ids or a mapping")
    return [int(i) for i in ids]


def _as_ids(token_ids: Sequence[int] | Tensor) -> Tensor:
    if not isinstance(token_ids, Tensor):
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
    ids = token_ids[0] if token_ids.ndim == 2 and token_ids.shape[0] == 1 else token_ids
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be a 1-D sequence of ids, got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex():
        raise TypeError("token_ids must be integers")
    return ids.to(torch.long)


def tokens_needed(n_grid: Iterable[int], n_windows: int = 10) -> int:
    r"""Tokens consumed by a grid with a running pointer: :math:`n_{\mathrm{windows}}\sum n`."""
    return int(n_windows) * sum(int(n) for n in n_grid)


def cut_windows(
    token_ids: Sequence[int] | Tensor,
    n: int,
    n_windows: int = 10,
    *,
    start: int = 0,
    stride: int | None = None,
) -> TokenWindows:
    """Cut ``n_windows`` windows of ``n`` tokens starting at ``start``, ``stride`` apart.

    Parameters
    ----------
    token_ids : sequence of int or Tensor, shape (N,) or (1, N)
        The whole tokenized text.
    n : int
        Window length.
    n_windows : int, default 10
    start : int, default 0
        Offset of the first window (the running pointer).
    stride : int, optional
        Distance between window starts, at least ``n`` (default ``n``: consecutive windows).

    Returns
    -------
    TokenWindows
        With ``next_start`` just past the last window.

    Raises
    ------
    ValueError
        When the text is too short; the message says how many tokens are needed.
    """
    ids = _as_ids(token_ids)
    n, n_windows, start = int(n), int(n_windows), int(start)
    step = n if stride is None else int(stride)
    if n < 1 or n_windows < 1:
        raise ValueError(f"n and n_windows must be positive, got n={n}, n_windows={n_windows}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if step < n:
        raise ValueError(f"stride ({step}) must be >= n ({n}) so that windows do not overlap")
    end = start + (n_windows - 1) * step + n
    if end > ids.numel():
        raise ValueError(
            f"text too short: {n_windows} windows of n={n} from token {start} need {end} tokens, "
            f"the text has {ids.numel()}; use a longer corpus (e.g. more KJV books)"
        )
    starts = tuple(start + i * step for i in range(n_windows))
    block = torch.stack([ids[s : s + n] for s in starts])
    return TokenWindows(n=n, token_ids=block, starts=starts, next_start=end)


def windows(
    token_ids: Sequence[int] | Tensor,
    n_grid: Iterable[int],
    n_windows: int = 10,
    *,
    start: int = 0,
) -> tuple[TokenWindows, ...]:
    """Running-pointer, non-overlapping windows over a grid of lengths.

    Protocol in docs/experiments.md, "Protocols and defects".

    For each ``n`` of ``n_grid`` in the order given (the paper's grids are increasing), the next
    ``n_windows * n`` token ids are cut into ``n_windows`` consecutive windows of ``n``. The
    pointer is never reset, unlike the released BERT-enc Alice run (defect D6).

    Parameters
    ----------
    token_ids : sequence of int or Tensor, shape (N,) or (1, N)
        The whole tokenized text.
    n_grid : iterable of int
        Window lengths, e.g. ``range(2, 100, 2)``.
    n_windows : int, default 10
        Windows per length.
    start : int, default 0
        Initial pointer.

    Returns
    -------
    tuple of TokenWindows
        One entry per grid value, in grid order.

    Raises
    ------
    ValueError
        When the text is too short for the whole grid; the message gives the tokens needed
        (``start + n_windows * sum(n_grid)``) and the tokens available.
    """
    ids = _as_ids(token_ids)
    grid = [int(n) for n in n_grid]
    if not grid:
        raise ValueError("n_grid is empty")
    need = int(start) + tokens_needed(grid, n_windows)
    if need > ids.numel():
        raise ValueError(
            f"text too short: {n_windows} windows per n over the grid {_grid_repr(grid)} need "
            f"{need} tokens (n_windows * sum(n) = {tokens_needed(grid, n_windows)} from token "
            f"{int(start)}), the text has {ids.numel()}; use a longer corpus (e.g. more KJV books)"
        )
    out = [cut_windows(ids, grid[0], n_windows, start=int(start))]
    for n in grid[1:]:
        out.append(cut_windows(ids, n, n_windows, start=out[-1].next_start))
    return tuple(out)


def _grid_repr(grid: list[int]) -> str:
    if len(grid) <= 6:
        return str(grid)
    return f"[{grid[0]}, {grid[1]}, ..., {grid[-1]}] ({len(grid)} values)"
