"""Shared figure style: one rc_context, column widths, palette, and a PDF+PNG save.

Style is applied inside :func:`style` (a ``matplotlib.rc_context``); importing this module
never changes global rcParams.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np

matplotlib.use("Agg", force=False)

import matplotlib.pyplot as plt  # noqa: E402

from experiments.engine import default_file_mode  # noqa: E402

if TYPE_CHECKING:  # matplotlib >= 3.10 names the rc keys; annotations only
    from matplotlib.typing import RcKeyType

TWO_COLUMNS = 6.75  # inches
PALETTE = {
    "input": "0.45",
    "unmasked": "#1f4e9c",  # dark blue, as the paper's fitted curves
    "masked": "#c0392b",
    "bound": "#2c7d3f",
    "released": "#e08a1e",
    "fit": "#1f2a5c",
}

RC: dict[RcKeyType, Any] = {
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
        dict(ls="none", marker=marker, ms=3.8, mfc="none", mec=color, mew=0.9)
        for marker, color in zip(itertools.cycle(ATOM_MARKERS), colors)
    ]


@contextlib.contextmanager
def style() -> Iterator[None]:
    """Apply the shared style for the duration of a ``with`` block."""
    with plt.rc_context(RC):
        yield


def save(fig: plt.Figure, stem: str | os.PathLike) -> list[Path]:
    """Save ``fig`` as ``stem.pdf`` and ``stem.png`` atomically, then close it."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for ext in ("pdf", "png"):
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


def attack_paths(
    results_path: str | os.PathLike, name: str, out_dir: str | os.PathLike | None
) -> tuple[Path, Path]:
    """The ``.npz`` an attack figure reads and the directory its files go to.

    ``results_path`` is that ``.npz`` (any other suffix is replaced by ``.npz``) or the directory
    holding the file ``name``; ``out_dir`` defaults to the directory of the ``.npz``.
    """
    p = Path(results_path)
    npz = p / name if p.is_dir() else p.with_suffix(".npz")
    return npz, npz.parent if out_dir is None else Path(out_dir)


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


# ------------------------------------------------------------ panels of the real-data figures
#: Offline corpora in words (figure titles); other corpora are shown by their file name.
CORPUS_WORDS = {"kjv": "KJV Bible", "pydoc": "Python docs"}

#: Characters per line of a panel title before it wraps (at a comma); fits a third of two
#: columns at the title size :data:`PANEL_TITLE_PT`.
TITLE_WIDTH = 44
PANEL_TITLE_PT = 6.5
#: Size of the per-panel notes written under a panel (:func:`panel_note`).
NOTE_PT = 6.5


def sweeps_or_raise(results_dir: Path) -> list[dict[str, Any]]:
    """Saved real-data sweeps (:func:`experiments.real_data.load_sweeps`), or an error.

    Raises
    ------
    FileNotFoundError
        When ``results_dir`` has no finished real-data record; the message names the experiment
        to run.
    """
    from experiments.real_data import load_sweeps

    sweeps = load_sweeps(Path(results_dir))
    if not sweeps:
        raise FileNotFoundError(
            f"no finished real-data records in {Path(results_dir) / 'real_data'}; run "
            "`meanfield reproduce --only real_data` first"
        )
    return sweeps


def panel_grid(n_panels: int, *, height: float = 2.3):
    """A figure with ``n_panels`` axes on a grid of at most 3 columns (unused axes removed).

    One panel gets a one-column figure (3.2 in wide), more a figure two columns wide
    (:data:`TWO_COLUMNS`).

    Returns
    -------
    fig : Figure
    axes : list of Axes
        The ``n_panels`` axes, row by row.
    """
    import math

    ncols = min(3, n_panels)
    nrows = math.ceil(n_panels / ncols)
    w = TWO_COLUMNS if ncols > 1 else 3.2
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, height * nrows + 0.4), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.remove()
    return fig, flat[:n_panels]


def wrap_at_commas(text: str, width: int = TITLE_WIDTH) -> str:
    """``text`` broken into lines of at most ``width`` characters, after commas only.

    A single comma-separated part longer than ``width`` stays whole on its line.
    """
    parts = text.split(", ")
    lines: list[str] = []
    for i, part in enumerate(parts):
        comma = 1 if i < len(parts) - 1 else 0  # a line that is not the last ends with ","
        if lines and len(lines[-1]) + 2 + len(part) + comma <= width:
            lines[-1] += ", " + part
        else:
            if lines:
                lines[-1] += ","
            lines.append(part)
    return "\n".join(lines)


def corpus_words(corpus: str) -> str:
    """The corpus as a reader names it: ``"kjv"`` → ``"KJV Bible"``; a file by its name."""
    return CORPUS_WORDS.get(corpus) or Path(corpus).name


def panel_title(
    s: Mapping[str, Any], *, with_map: bool = True, papers: Sequence[str] | None = None
) -> str:
    """Model measured, layer and map in words, corpus, and the paper configuration it replaces.

    Parameters
    ----------
    s : Mapping
        A sweep of :func:`experiments.real_data.load_sweeps`.
    with_map : bool
        Name the map differentiated (``False``: model and layer only, for the radius, which
        does not depend on the map).
    papers : sequence of str, optional
        The paper configurations to name (default: the sweep's own).

    Returns
    -------
    str
        Lines of at most :data:`TITLE_WIDTH` characters (the last, the corpus and the paper
        configuration, may be longer), e.g. "all-MiniLM-L6-v2, layer 0," / "residual block with
        layer norm" / "KJV Bible → paper: BERT-enc L0, Alice".
    """
    from experiments.real_data import CORPUS_STANDS_IN

    what = s["map_desc"] if with_map else f"layer {s['config']['layer']}"
    head = wrap_at_commas(f"{s['model_short']}, {what}")
    if papers is None:
        papers = [s["paper_configuration"]] if s.get("paper_configuration") else []
    stands = CORPUS_STANDS_IN.get(s["corpus"])
    grid = "" if s.get("grid", "short") == "short" else f", {s['grid']} grid"
    tail = ""
    if papers:
        tail = " → paper: " + " / ".join(papers) + (f", {stands}" if stands else "")
    return f"{head}\n{corpus_words(s['corpus'])}{grid}{tail}"


def log_axes(ax, *, x: bool = True) -> None:
    """Log axes with plain-number labels at 1, 2, 5 × 10^k (no minor labels).

    An x axis spanning more than 1.8 decades (the long grid, n up to 492), or a y axis spanning
    more than 1.2, is labelled at 1, 3 × 10^k instead, and one spanning more than 2.5 decades at
    10^k only, so that the labels of a short or narrow panel do not run into each other.
    """
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis, on in ((ax.xaxis, x), (ax.yaxis, True)):
        if not on:
            continue
        lo, hi = ax.get_xlim() if axis is ax.xaxis else ax.get_ylim()
        decades = math.log10(hi / lo) if lo > 0 else 0.0
        subs: tuple[float, ...] = (1.0, 2.0, 5.0)
        if decades > (1.8 if axis is ax.xaxis else 1.2):
            subs = (1.0, 3.0)
        if decades > 2.5:
            subs = (1.0,)
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def panel_ylabel(ax, text: str) -> None:
    """The y label, on the first column of a panel grid only (titles need the room)."""
    spec = ax.get_subplotspec()
    if spec is None or spec.is_first_col():
        ax.set_ylabel(text)


def panel_note(ax, lines: Sequence[tuple[str, Any]], *, below: float = 31.0) -> None:
    """Write ``(text, colour)`` lines under a panel, below its tick labels and x label.

    What differs between the panels of a figure (a fitted curve, the paper's formula) goes here;
    what they share goes in one legend (:func:`shared_legend`). The first line starts ``below``
    points under the axes; the layout makes room for the lines.
    """
    for i, (text, colour) in enumerate(lines):
        ax.annotate(
            text,
            xy=(0.0, 0.0),
            xycoords="axes fraction",
            xytext=(0.0, -below - 9.0 * i),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=NOTE_PT,
            color=colour,
        )


def shared_legend(fig: Any, axes: Iterable[Any], handles: Sequence[Any] | None = None) -> Any:
    """One legend for all panels, under them: their labelled series, or ``handles``.

    Two columns on a figure wider than one column, one column otherwise.
    """
    if handles is None:
        handles, labels = legend_entries(axes)
    else:
        labels = [h.get_label() for h in handles]
    ncol = 2 if fig.get_figwidth() > 3.4 else 1
    return legend_below(fig, handles, labels, ncol=ncol, fontsize=7, handlelength=1.8)


def near_constant(values: np.ndarray, rel: float = 0.01) -> float | None:
    """The median of ``values`` when their range is below ``rel`` of it, else ``None``.

    A radius constant to within 1 % (e.g. the RMS norm of a LayerNorm output) is drawn as an
    offset from this median, so that a spread of a few parts per million is not read as a trend.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    med = float(np.median(v))
    if med > 0 and float(v.max() - v.min()) < rel * med:
        return med
    return None


#: Legend labels of the two quantities of the real-data figures (F1, F2).
LABEL_VALUE = r"$\|J\|_2$, one window of text"
LABEL_RELEASED = r"released code's metric $\sqrt{\|J^\top f\|}$ (not a Lipschitz constant)"


def _sci(x: float) -> str:
    r"""Two significant digits in mathtext, ``-7.7\times10^{-6}`` for small numbers."""
    s = f"{x + 0.0:.2g}"
    if "e" not in s:
        return s
    mant, exp = s.split("e")
    return rf"{mant}\times10^{{{int(exp)}}}"


def fit_label(name: str, fit: Any, *, symbol: str = r"\alpha") -> str:
    r"""``name: c n^a, a in [lo, hi]`` (mathtext) for a power-law fit with a bootstrap interval.

    An interval narrower than the printed digits gets more of them (up to 4), so that it never
    reads ``[0.09, 0.09]``; one narrower still is printed with two significant digits
    (``[-7.7\times10^{-6},-6.8\times10^{-6}]``).
    """
    lo, hi = fit.alpha_ci
    digits = 2
    while digits < 4 and f"{lo:.{digits}f}" == f"{hi:.{digits}f}":
        digits += 1
    if f"{lo:.{digits}f}" == f"{hi:.{digits}f}":
        a, lo_s, hi_s = (_sci(x) for x in (fit.alpha, lo, hi))
    else:
        a, lo_s, hi_s = (f"{x + 0.0:.{digits}f}" for x in (fit.alpha, lo, hi))
    return rf"{name}: ${fit.c:.3g}\,n^{{{a}}}$, ${symbol}\in[{lo_s},{hi_s}]$"


def percent_offset(values: np.ndarray, centre: float) -> np.ndarray:
    """``values`` as offsets from ``centre`` in per cent of it (the axis of a near-constant R)."""
    return 100.0 * (np.asarray(values, dtype=float) / centre - 1.0)


def constant_note(values: np.ndarray, centre: float, name: str = "$R(X)$") -> str:
    """``"R(X) constant: 27.71 ± 0.0017 %"``, the largest offset of ``values`` from ``centre``."""
    dev = float(np.nanmax(np.abs(percent_offset(values, centre))))
    return f"{name} constant: {centre:.4g} ± {dev:.2g} %"


def confidence_text(confidence: float) -> str:
    r"""A probability close to 1 as mathtext: ``0.999999`` → ``$1-10^{-6}$``, else ``0.9995``."""
    import math

    delta = 1.0 - float(confidence)
    if delta > 0:
        k = -math.log10(delta)
        if abs(k - round(k)) < 1e-6:
            return rf"$1-10^{{-{round(k)}}}$"
    return f"{confidence:g}"
