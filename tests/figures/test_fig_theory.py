"""The theory figure renders under Agg, with and without the harness's report."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from experiments import verify_bounds as vb  # noqa: E402
from experiments.engine import load_json  # noqa: E402
from paper_figs import fig_theory_bounds as fig  # noqa: E402

from ..tolerances import F64_SCALAR_SEARCH


def _check_files(paths, out_dir):
    assert sorted(p.name for p in paths) == [f"{fig.STEM}.pdf", f"{fig.STEM}.png"]
    for p in paths:
        assert p.parent == out_dir and p.exists() and p.stat().st_size > 1000
    assert plt.get_fignums() == []  # save() closed the figure


def _words_outside_math(text: str) -> str:
    """``text`` without its ``$...$`` segments (where ``_`` is a subscript, not a code name)."""
    return re.sub(r"\$[^$]*\$", "", text)


def _drawn(draw, results, out, monkeypatch):
    """Draw through ``draw``; return the figure handed to ``fig.save`` and the files written."""
    kept = []
    original = fig.save

    def keep(figure, stem, **kw):
        kept.append(figure)
        return original(figure, stem, **kw)

    monkeypatch.setattr(fig, "save", keep)
    paths = draw(results, out)
    assert len(kept) == 1
    return kept[0], paths


def test_with_harness_report(tmp_path, monkeypatch):
    """Panel (d) names its rows in words and colours them as its legend says."""
    vb.run(tmp_path, "tiny", progress=False, n_instances=12)
    out = tmp_path / "figures"
    figure, paths = _drawn(fig.draw, tmp_path, out, monkeypatch)
    _check_files(paths, out)
    report = load_json(tmp_path / "verify_bounds" / "report.json")
    (ax_d,) = [ax for ax in figure.get_axes() if ax.get_title(loc="left").startswith("(d)")]
    rows, left_out = fig.tightness_rows(report)
    assert rows and len(rows) + len(left_out) == len(report["bounds"])
    ticks = [t.get_text() for t in ax_d.get_yticklabels()]
    assert ticks == [r[0] for r in rows]
    assert not set(ticks) & set(report["bounds"])  # no row keeps its code name
    # the range bar of each row (the first line at its height) has its row's colour
    bars = [ln for ln in ax_d.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 2]
    bar_at = {}
    for ln in bars:
        y0, y1 = ln.get_ydata()
        if y0 == y1:
            bar_at.setdefault(float(y0), ln)
    for i, (_, *_, key) in enumerate(rows):
        assert (
            to_rgba(bar_at[float(i)].get_color())[:3] == to_rgba(fig.TIGHTNESS_COLOURS[key][0])[:3]
        )
    legend = ax_d.get_legend()
    entries = [t.get_text() for t in legend.get_texts()]
    assert [w for _, w in fig.TIGHTNESS_COLOURS.values()] == entries[:3]
    for handle, (colour, _) in zip(legend.legend_handles, fig.TIGHTNESS_COLOURS.values()):
        assert to_rgba(handle.get_color())[:3] == to_rgba(colour)[:3]
    title = legend.get_title().get_text()
    assert all(words in title for words in left_out)
    assert fig.GLOSSARY in [t.get_text() for t in figure.findobj(Text)]


def test_every_verified_bound_has_words():
    """Each bound the harness checks has its own words, with no code name outside the math."""
    from theory.bounds import registry

    names = [b.name for b in registry.verified()]
    missing = [n for n in names if n not in fig.BOUND_WORDS]
    assert not missing, f"no words for {missing} in paper_figs.fig_theory_bounds.BOUND_WORDS"
    words = [fig.bound_words(n) for n in names]
    assert len(set(words)) == len(words)  # rows stay identifiable
    for w in words:
        plain = _words_outside_math(w)
        assert not re.search(r"[_\[\]]", plain), w
    assert fig.bound_words("not_a_registered_bound") == "not_a_registered_bound"


def _record(side, status="theorem", n_violations=0, lo=1.0, med=2.0, hi=3.0):
    return {
        "side": side,
        "status": status,
        "n_violations": n_violations,
        "tightness": {"min": lo, "median": med, "max": hi},
    }


def test_tightness_rows_colours_and_left_out():
    """Red is any bound that failed somewhere (the released heuristic too), not only candidates."""
    report = {
        "bounds": {
            "sqrt_n_upper[sqrt3]": _record("upper"),
            "kim_l2_upper[p=2]": _record("upper", "candidate", 1, lo=0.8),
            "released_data_dependent": _record("upper", "heuristic", 6, lo=7e-4),
            "two_dirac_lower": _record("lower", lo=0.01, med=0.6, hi=1.0),
            "large_radius_limit": _record("limit", "reported", None),
            "large_radius[limit-deviation]": _record("lower", lo=-350.0, med=-0.2, hi=1.0),
        }
    }
    rows, left_out = fig.tightness_rows(report)
    assert [(r[0], r[4]) for r in rows] == [
        (fig.BOUND_WORDS["sqrt_n_upper[sqrt3]"], "holds"),
        (fig.BOUND_WORDS["kim_l2_upper[p=2]"], "fails"),
        (fig.BOUND_WORDS["released_data_dependent"], "fails"),
        (fig.BOUND_WORDS["two_dirac_lower"], "lower"),
    ]
    assert left_out == [
        f"{fig.BOUND_WORDS['large_radius_limit']} (a limit, not a bound)",
        f"{fig.BOUND_WORDS['large_radius[limit-deviation]']} (below 0 on most instances)",
    ]
    assert fig.tightness_colour(_record("lower", n_violations=2)) == "fails"


def test_radius_for_n_inverts_the_crossover():
    from theory import regimes

    r = fig._radius_for_n(16, 1.0)
    assert float(regimes.crossover_n(fig.A_NORM, fig.V_NORM, r, c=1.0)) == pytest.approx(
        16, rel=F64_SCALAR_SEARCH
    )


def test_theory_only_from_the_command_line(tmp_path, capsys):
    """No results: the figure is theory-only (three panels); ``main`` prints the two paths."""
    out = tmp_path / "figures"
    fig.main(["--results", str(tmp_path / "no_results"), "--out", str(out)])
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / f"{fig.STEM}.pdf"), str(out / f"{fig.STEM}.png")]
    _check_files([out / f"{fig.STEM}.pdf", out / f"{fig.STEM}.png"], out)
