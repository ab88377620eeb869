"""The theory figure renders under Agg, with and without the harness's report."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from experiments import verify_bounds as vb  # noqa: E402
from paper_figs import fig_theory_bounds as fig  # noqa: E402


def _check_files(paths, out_dir):
    assert sorted(p.name for p in paths) == [f"{fig.STEM}.pdf", f"{fig.STEM}.png"]
    for p in paths:
        assert p.parent == out_dir and p.exists() and p.stat().st_size > 1000
    assert plt.get_fignums() == []  # save() closed the figure


def test_with_harness_report(tmp_path):
    vb.run(tmp_path, "tiny", progress=False, n_instances=12)
    out = tmp_path / "figures"
    _check_files(fig.draw(tmp_path, out), out)


def test_radius_for_n_inverts_the_crossover():
    from theory import regimes

    r = fig._radius_for_n(16, 1.0)
    assert float(regimes.crossover_n(fig.A_NORM, fig.V_NORM, r, c=1.0)) == pytest.approx(
        16, rel=1e-9
    )


def test_theory_only_from_the_command_line(tmp_path, capsys):
    """No results: the figure is theory-only (three panels); ``main`` prints the two paths."""
    out = tmp_path / "figures"
    fig.main(["--results", str(tmp_path / "no_results"), "--out", str(out)])
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / f"{fig.STEM}.pdf"), str(out / f"{fig.STEM}.png")]
    _check_files([out / f"{fig.STEM}.pdf", out / f"{fig.STEM}.png"], out)
