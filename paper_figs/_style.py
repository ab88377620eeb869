"""Shared figure style: one rc_context, column widths, palette, and a PDF+PNG save.

Style is applied inside :func:`style` (a ``matplotlib.rc_context``); importing this module
never changes global rcParams.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg", force=False)

import matplotlib.pyplot as plt  # noqa: E402

from experiments.results import default_file_mode  # noqa: E402

ONE_COLUMN = 3.25  # inches
TWO_COLUMNS = 6.75
PALETTE = {
    "input": "0.45",
    "unmasked": "#1f4e9c",  # dark blue, as the paper's fitted curves
    "masked": "#c0392b",
    "bound": "#2c7d3f",
    "released": "#e08a1e",
    "fit": "#1f2a5c",
}

RC = {
    "pdf.fonttype": 42,  # TrueType, no Type 3 fonts
    "ps.fonttype": 42,
    "text.usetex": False,
    "mathtext.fontset": "cm",
    "font.size": 8.5,
    "axes.titlesize": 9,
    "axes.labelsize": 8.5,
    "legend.fontsize": 7.5,
    "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.0,
    "savefig.dpi": 300,
    "savefig.bbox": "tight",
    "figure.constrained_layout.use": True,
}


def plot_curves(ax, x, curves: Sequence[tuple[object, str, dict]]) -> None:
    """Plot each ``(y, label, kwargs)`` of ``curves`` against ``x`` on ``ax``, in that order.

    ``kwargs`` are the keyword arguments of ``ax.plot``; an optional ``"fmt"`` entry is passed as
    its format string.
    """
    for y, label, kwargs in curves:
        kw = dict(kwargs)
        fmt = kw.pop("fmt", None)
        ax.plot(*((x, y) if fmt is None else (x, y, fmt)), label=label, **kw)


def legend_below(fig: Any, *args: Any, **kwargs: Any) -> Any:
    """The figure's legend under its panels, without a frame: ``fig.legend(*args, **kwargs)``."""
    return fig.legend(*args, loc="outside lower center", frameon=False, **kwargs)


def legend_entries(axes: Iterable[Any]) -> tuple[list[Any], list[str]]:
    """Handles and labels of the series of ``axes``, one per label, in order of appearance.

    For one legend shared by several panels: ``fig.legend(*legend_entries(axes), ...)``.
    """
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    return list(handles.values()), list(handles)


#: Marker shapes of the optimized measures, one per atom count (figures A and F6).
ATOM_MARKERS = ("o", "s", "^", "D", "v", "P")


def atom_markers(count: int) -> list[dict[str, Any]]:
    """``ax.plot`` keywords of the optimized measures of ``count`` atom counts (figures A and F6).

    Open markers without a line, of the shapes :data:`ATOM_MARKERS` in turn, coloured along
    viridis.
    """
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, count))
    return [
        dict(
            ls="none",
            marker=ATOM_MARKERS[i % len(ATOM_MARKERS)],
            ms=3.8,
            mfc="none",
            mec=colors[i],
            mew=0.9,
        )
        for i in range(count)
    ]


@contextlib.contextmanager
def style() -> Iterator[None]:
    """Apply the shared style for the duration of a ``with`` block."""
    with plt.rc_context(RC):
        yield


def save(
    fig: plt.Figure, stem: str | os.PathLike, *, formats: tuple[str, ...] = ("pdf", "png")
) -> list[Path]:
    """Save ``fig`` as ``stem.pdf`` and ``stem.png`` atomically, then close it."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for ext in formats:
            target = stem.with_suffix(f".{ext}")
            fd, tmp = tempfile.mkstemp(
                prefix=f".{target.name}.", suffix=f".{ext}", dir=target.parent
            )
            os.close(fd)
            try:
                fig.savefig(tmp, format=ext)
                os.chmod(tmp, default_file_mode())  # mkstemp's owner-only mode otherwise
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            written.append(target)
    finally:
        plt.close(fig)
    return written


def figure_main(
    draw: Callable[[Path, Path], list[Path]], doc: str | None, argv: Sequence[str] | None = None
) -> None:
    """The command line shared by the figure scripts: ``--results DIR --out DIR``.

    ``python -m paper_figs.<module> --results OUT/results --out OUT/figures`` draws one figure
    from the saved results of ``meanfield reproduce`` and prints the files written.
    """
    parser = argparse.ArgumentParser(description=(doc or "").strip().split("\n\n")[0])
    parser.add_argument(
        "--results", type=Path, default=Path("results"), help="results root (default ./results)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("figures"), help="output directory (default ./figures)"
    )
    args = parser.parse_args(argv)
    for p in draw(args.results, args.out):
        print(p)


def attack_figure_main(draw: Callable[..., list[Path]], doc: str | None, what: str) -> None:
    """The command line of the attack figures: ``RESULTS [--out DIR]``.

    ``RESULTS`` is ``what`` (an ``.npz`` of the attack experiment) or its directory, by default
    ``attack_out``; the files written are printed.
    """
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("results", nargs="?", default="attack_out", help=f"{what} or its directory")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for p in draw(args.results, args.out):
        print(p)
