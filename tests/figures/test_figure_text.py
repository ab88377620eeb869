"""Every figure reads at print size: no text below 6 pt, legends in each series' own colour.

Print size: a figure drawn one column wide (figure width at most 3.4 in) is printed 3.3 in wide,
a wider one 6.9 in (two columns). The saved file is cropped to its tight bounding box, so a
point of font size prints as ``print width / saved width`` points; every visible, non-empty text
must reach :data:`MIN_PT` after that scaling.

Legends: an entry's handle must have the colour of the series it names (the plotted artists with
the same label), a series drawn through a colour map (several colours) must show in the legend in
a neutral grey (the colour bar explains the colours), and two entries of one legend may not look
the same (colour, marker and line style).

The figures are drawn from small saved results: the tiny presets of the stages (those the
figures' own tests use) and, for figures B and C, the hand-made arrays of
``tests/cli/test_attacks_cli.py``. Figures F1–F3 (real data) are checked in
``tests/figures/test_figs_real.py`` on the results its module fixture already computes.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import Collection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.container import Container  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from ..tolerances import MATPLOTLIB_LAYOUT

MIN_PT = 6.0
ONE_COLUMN_PRINT, TWO_COLUMN_PRINT = 3.3, 6.9  # inches


# ------------------------------------------------------------------------------------ checks
def print_scale(fig) -> float:
    """Points printed per point of font size, given the saved (tight) figure size."""
    renderer = fig.canvas.get_renderer()
    saved_width = fig.get_tightbbox(renderer).width  # inches
    target = ONE_COLUMN_PRINT if fig.get_figwidth() <= 3.4 else TWO_COLUMN_PRINT
    return target / saved_width


def small_texts(fig, min_pt: float = MIN_PT) -> list[tuple[float, str]]:
    """``(printed size, text)`` of every visible, non-empty text below ``min_pt`` in print."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    scale = print_scale(fig)
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip():
            continue
        if not all(a.get_visible() for a in _ancestors(t)):
            continue
        if t.get_window_extent(renderer).width == 0:
            continue
        size = t.get_fontsize() * scale
        if size < min_pt - 1e-9:
            out.append((round(size, 2), t.get_text()))
    return out


def _ancestors(artist):
    """The axes (or subfigure) an artist is drawn in, for visibility."""
    ax = getattr(artist, "axes", None)
    return [ax] if ax is not None else []


def _rgb(c) -> tuple[float, float, float] | None:
    r, g, b, a = to_rgba(c)
    if a == 0:
        return None
    return (round(r, 3), round(g, 3), round(b, 3))


def main_colours(artist) -> set[tuple[float, float, float]]:
    """The colours that identify a series: line colour, else marker fill, else marker edge."""
    if isinstance(artist, Line2D):
        if artist.get_linestyle() not in ("None", "none", "", " "):
            c = _rgb(artist.get_color())
            return {c} if c else set()
        for c in (artist.get_markerfacecolor(), artist.get_markeredgecolor()):
            if isinstance(c, str) and c.lower() == "none":
                continue
            rgb = _rgb(c)
            if rgb:
                return {rgb}
        return set()
    if isinstance(artist, Collection):
        for cols in (artist.get_facecolor(), artist.get_edgecolor()):
            cols = np.atleast_2d(cols)
            rgbs = {_rgb(c) for c in cols if len(c) and c[3] > 0} - {None}
            if rgbs:
                return rgbs
        return set()
    if isinstance(artist, Patch):
        for c in (artist.get_facecolor(), artist.get_edgecolor()):
            rgb = _rgb(c)
            if rgb:
                return {rgb}
    return set()


def _signature(handle) -> tuple:
    colours = tuple(sorted(main_colours(handle)))
    marker = handle.get_marker() if isinstance(handle, Line2D) else type(handle).__name__
    style = handle.get_linestyle() if isinstance(handle, Line2D) else None
    if isinstance(style, tuple):
        style = str(style)
    mfc = handle.get_markerfacecolor() if isinstance(handle, Line2D) else None
    hollow = isinstance(mfc, str) and mfc.lower() == "none"
    alpha = handle.get_alpha()
    return colours, str(marker), str(style), hollow, None if alpha is None else round(alpha, 2)


def _series(fig, label: str) -> list:
    """The plotted artists (outside legends) labelled ``label``, containers unpacked."""
    found = []
    for ax in fig.get_axes():
        for c in ax.containers:
            if isinstance(c, Container) and c.get_label() == label:
                found += [a for a in c.get_children() if a is not None]
        for a in [*ax.lines, *ax.collections, *ax.patches]:
            if a.get_label() == label:
                found.append(a)
    return found


def legend_problems(fig) -> list[str]:
    """Legend entries whose handle does not show its series as plotted (see module doc)."""
    fig.canvas.draw()  # colour-mapped collections get their colours when drawn
    problems = []
    legends = list(fig.findobj(Legend))
    for lg in legends:
        seen: dict[tuple, str] = {}
        for handle, text in zip(lg.legend_handles, lg.get_texts()):
            label = text.get_text()
            if handle is None:
                continue
            sig = _signature(handle)
            if sig in seen:
                problems.append(f"{label!r} and {seen[sig]!r} share one look {sig}")
            seen.setdefault(sig, label)
            h_cols = main_colours(handle)
            series = _series(fig, label)
            if not series or not h_cols:
                continue  # a proxy handle: nothing to compare its colour with
            s_cols = set().union(*(main_colours(a) for a in series))
            mapped = any(
                isinstance(a, Collection) and a.get_array() is not None and len(main_colours(a)) > 1
                for a in series
            )
            if mapped:
                if not all(r == g == b for r, g, b in h_cols):
                    problems.append(f"{label!r}: colour-mapped series with a coloured handle")
            elif not h_cols <= s_cols:
                problems.append(f"{label!r}: handle colour {h_cols} not the series' {s_cols}")
    return problems


# ------------------------------------------------------------------- the checks can fail
def test_checks_catch_small_text_and_wrong_legends():
    fig, ax = plt.subplots(figsize=(3.2, 2.0))
    ax.plot([0, 1], [0, 1], color="red", label="a")
    ax.plot([0, 1], [1, 0], color="blue", label="b")
    ax.text(0.5, 0.5, "tiny", fontsize=4)
    ax.legend(fontsize=8)
    assert [t for _, t in small_texts(fig)] == ["tiny"]
    assert legend_problems(fig) == []

    # a proxy handle of the wrong colour, and two entries that look the same
    ax.get_legend().remove()
    wrong = Line2D([], [], color="green", label="a")
    ax.legend(
        handles=[wrong, Line2D([], [], color="blue", label="b"), Line2D([], [], color="blue")]
    )
    probs = legend_problems(fig)
    assert any("'a': handle colour" in p for p in probs)
    assert any("share one look" in p for p in probs)
    plt.close(fig)

    # a series drawn through a colour map, shown with one of its colours
    fig, ax = plt.subplots(figsize=(6.5, 2.0))
    ax.scatter([0, 1, 2], [0, 1, 2], c=[0.0, 0.5, 1.0], cmap="autumn", label="mapped")
    ax.legend()
    assert legend_problems(fig) == ["'mapped': colour-mapped series with a coloured handle"]
    plt.close(fig)


def test_print_scale_follows_the_saved_width():
    """A two-column figure printed at 6.9 in: 6 pt text drawn 8.5 in wide prints smaller."""
    fig = plt.figure(figsize=(9.0, 2.0))
    ax = fig.add_axes((0.03, 0.15, 0.94, 0.7))  # the saved (tight) width is about 8.5 in
    ax.set_title("six points", fontsize=6.0)
    fig.canvas.draw()
    assert print_scale(fig) == pytest.approx(6.9 / fig.get_tightbbox().width, rel=MATPLOTLIB_LAYOUT)
    assert print_scale(fig) < 0.85
    assert [t for _, t in small_texts(fig)] == ["six points"]
    plt.close(fig)


# ------------------------------------------------------------------------- every figure
def _stage_results(root: Path) -> Path:
    from experiments import adversarial, invertible, kim_tightness, synthetic
    from experiments import verify_bounds as vb
    from tests.cli.test_attacks_cli import _tiny_results

    synthetic.run(root, "tiny", progress=False)
    invertible.run(root, "tiny", progress=False)
    vb.run(root, "tiny", progress=False, n_instances=12)
    kim_tightness.run(root, "tiny", progress=False)
    try:
        import transformers  # noqa: F401

        adversarial.run(root, "tiny", progress=False)
    except ImportError:
        pass
    (root / "attacks").mkdir(parents=True, exist_ok=True)
    _tiny_results(root / "attacks")
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _stage_results(tmp_path_factory.mktemp("figure_text"))


def check_drawn_figures(draw, module, results_dir: Path, out_dir: Path, monkeypatch) -> int:
    """Draw through ``draw`` and check every figure handed to ``module.save``; returns the count."""
    checked = []
    original = module.save

    def checking_save(fig, stem, **kw):
        small = small_texts(fig)
        assert not small, f"{Path(stem).name}: text below {MIN_PT} pt in print: {small}"
        problems = legend_problems(fig)
        assert not problems, f"{Path(stem).name}: {problems}"
        checked.append(stem)
        return original(fig, stem, **kw)

    monkeypatch.setattr(module, "save", checking_save)
    draw(results_dir, out_dir)
    return len(checked)


def _figures(exclude=("F1", "F2", "F3", "L", "M")):
    # L (long contexts) is checked in tests/experiments/test_long_context_stage.py on its own tiny results,
    # M (bounded logits) in tests/experiments/test_bounded_logits_stage.py
    from meanfield_cli import registry

    return [f for f in registry.FIGURES if f.id not in exclude]


@pytest.mark.parametrize("figure", _figures(), ids=lambda f: f.id)
def test_figure_reads_at_print_size(results, tmp_path, monkeypatch, figure):
    if figure.id == "F4":
        pytest.importorskip("transformers")
    module = importlib.import_module(figure.draw_fn.__module__)
    assert check_drawn_figures(figure.draw, module, results, tmp_path, monkeypatch) >= 1
