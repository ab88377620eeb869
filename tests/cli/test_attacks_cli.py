"""The `attack` command (meanfield_cli/commands/attack.py) and the attack figures, on tiny inputs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from theory.bounds import optimal_split_k, split_gain

from ..oracles_attacks import seq_norm
from ..tolerances import BRACKET_MARGIN, F64_LANCZOS, F64_REDUCTION, SEARCH_START

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- CLI
def _main(argv):
    """The `meanfield` command (meanfield_cli.main)."""
    from meanfield_cli.main import main

    return main(argv)


def test_cli_construct_json_and_files(tmp_path, capsys):
    out = tmp_path / "c"
    assert (
        _main(
            [
                "attack",
                "construct",
                "--random-d",
                "3",
                "--seed",
                "2",
                "--R",
                "2",
                "--n",
                "6",
                "--variant",
                "symmetric",
                "--json",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "attack construct" and doc["n"] == 6
    assert doc["lower_bound"] <= doc["exact"]["value"] * (1 + BRACKET_MARGIN)
    from experiments.engine import load_json, load_npz

    data = load_npz(out / "construct.npz")
    assert data["X"].shape == (6, 3)
    assert seq_norm(data["X"], data["A"], data["V"]) == pytest.approx(
        doc["exact"]["value"], rel=F64_LANCZOS
    )
    assert load_json(out / "construct.json")["gamma"] == doc["gamma"]


def test_cli_construct_from_files_and_errors(tmp_path, capsys):
    A = np.array([[0.5, 1.0], [-0.3, -1.2]])
    np.save(tmp_path / "A.npy", A)
    np.savez(tmp_path / "AV.npz", A=A, V=2 * np.eye(2))
    construct, rest = ["attack", "construct", "--A-file"], "--R 1.5 --n 4 --json".split()
    assert _main(construct + [str(tmp_path / "A.npy")] + rest) == 0
    d1 = json.loads(capsys.readouterr().out)
    assert _main(construct + [str(tmp_path / "AV.npz")] + rest) == 0
    d2 = json.loads(capsys.readouterr().out)
    assert d2["lower_bound"] == pytest.approx(2 * d1["lower_bound"], rel=F64_REDUCTION)  # V = 2I
    np.save(tmp_path / "obj.npy", np.array([{"A": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "rect.npy", np.ones((2, 3)))
    np.savez(tmp_path / "noA.npz", B=A)
    (tmp_path / "A.txt").write_text("1")
    for f, msg in (
        ("obj.npy", "pickle"),
        ("rect.npy", "square"),
        ("noA.npz", "no array 'A'"),
        ("A.txt", ".npy or .npz"),
        ("missing.npy", "no such file"),
    ):
        assert (
            _main(["attack", "construct", "--A-file", str(tmp_path / f), "--R", "1", "--n", "3"])
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert err.startswith("meanfield: error:") and msg in err and "\n" not in err
    assert _main(["attack", "construct", "--random-d", "2", "--R", "-1", "--n", "3"]) == 2
    assert "R" in capsys.readouterr().err


def test_cli_search_and_split(tmp_path, capsys):
    search = "attack search --random-d 2 --R 1.5 --restarts 1".split()
    out = ["--json", "--out", str(tmp_path / "s")]
    assert _main(search + "--atoms 2 --steps 10".split() + out) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["value"] >= doc["construction_value"] * (1 - SEARCH_START)
    assert (tmp_path / "s" / "search.npz").exists() and (tmp_path / "s" / "search.json").exists()
    assert _main(search + "--sequence 4 --steps 5 --json".split()) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "sequence"
    assert _main(["attack", "split", "--s", "3", "--k-max", "30", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["k_opt"] == optimal_split_k(3.0) and doc["G_k"]["1"] == 1.0
    assert isinstance(doc["k_opt"], int)  # an exact integer is written as one
    split = "attack split --budget 0.3 --k-max 2 --restarts 1 --steps 10 --json".split()
    assert _main(split) == 0
    a = json.loads(capsys.readouterr().out)["attack"]
    assert a["split"]["ratio_w2"] >= a["move"]["ratio_w2"]
    assert _main(["attack", "split"]) == 2
    assert "give --s" in capsys.readouterr().err


# ----------------------------------------------------------------------------- figures
def _tiny_results(tmp_path):
    from experiments.engine import save_npz, write_json

    radii = np.array([1.0, 3.0])
    save_npz(
        tmp_path / "worst_measures.npz",
        radii=radii,
        d1_points=np.array([[[-1.0], [0.9], [1.0]], [[-3.0], [1.5], [3.0]]]),
        d1_log_weights=np.log(np.array([[0.9, 0.09, 0.01], [1 - 2e-9, 1e-9, 1e-9]])),
        d1_value=np.array([2.0, 30.0]),
        d1_two_dirac=np.array([0.6, 12.0]),
        d2_points=np.array(
            [[[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], [[0.0, 3.0], [2.0, -2.0], [0.0, -3.0]]]
        ),
        d2_log_weights=np.log(np.array([[0.5, 0.4, 0.1], [1 - 2e-6, 1e-6, 1e-6]])),
        d2_value=np.array([2.0, 300.0]),
    )
    write_json(
        tmp_path / "worst_measures.json",
        {"settings": {"d1": {"label": "d = 1"}, "d2": {"label": "d = 2"}}},
    )
    k = np.unique(np.round(np.logspace(0, 3, 30)))
    s = np.array([1.0, 4.0])
    save_npz(
        tmp_path / "mass_splitting.npz",
        k=k,
        radii=np.array([2.0, 4.0]),
        s=s,
        G=np.stack([split_gain(k, si) for si in s]),
        k_opt=np.array([2.0, 56.0]),
        budgets=np.array([0.1, 0.5]),
        dirac_move_w2=np.array([1.0, 1.0]),
        dirac_split_w2=np.array([2.5, 3.0]),
        dirac_move_winf=np.array([1.0, 1.0]),
        dirac_split_winf=np.array([0.9, 1.0]),
        V_norm=np.float64(1.0),
    )


def test_figures_render_from_tiny_results(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from paper_figs import fig_b_worst_measures, fig_c_mass_splitting

    _tiny_results(tmp_path)
    out = tmp_path / "out"
    for mod, arg in (
        (fig_b_worst_measures, tmp_path),
        (fig_c_mass_splitting, tmp_path / "mass_splitting.npz"),
    ):
        files = mod.draw(arg, out)
        assert {f.suffix for f in files} == {".pdf", ".png"}
        assert all(f.stat().st_size > 0 for f in files)


def test_figure_b_from_cli_results(tmp_path, capsys):
    assert (
        _main(
            [
                "attack",
                "search",
                "--figure-b",
                "--radii",
                "1,2",
                "--atoms",
                "2",
                "--restarts",
                "1",
                "--steps",
                "5",
                "--out",
                str(tmp_path),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["settings"]) == {"d1", "d2"}
    from paper_figs import fig_b_worst_measures

    assert all(p.exists() for p in fig_b_worst_measures.draw(tmp_path / "worst_measures.npz"))


@pytest.mark.slow
def test_figure_c_from_results_function(tmp_path):
    from experiments.mass_splitting import figure_c_results
    from paper_figs import fig_c_mass_splitting

    files = figure_c_results(
        tmp_path,
        radii=(2.0, 4.0),
        budgets=(0.1, 0.5),
        k_max=2,
        n_restarts=1,
        steps=10,
        k_curve_max=1000,
    )
    assert all(f.exists() for f in files)
    assert all(p.exists() for p in fig_c_mass_splitting.draw(tmp_path))


# ------------------------------------------------------------------- figure B: how it reads
def test_figure_b_mass_label():
    """Plain notation from the log-mass, exact far below the float64 range of the mass itself."""
    from paper_figs.fig_b_worst_measures import mass_label

    assert mass_label(np.log(0.84)) == "0.84"
    assert mass_label(np.log(0.0196)) == "0.02"
    assert mass_label(np.log(2.49e-4)) == "2e-4"
    assert mass_label(np.log(9.6e-5)) == "1e-4"  # rounds up a decade, not "10e-5"
    assert mass_label(-38.38063) == "2e-17"
    assert mass_label(-800.0) == "4e-348"  # exp(-800) underflows; its logarithm does not


def _clustered_results(root):
    """Figure B inputs like the quick run: near-coincident atoms, masses down to 2e-17."""
    from experiments.engine import save_npz, write_json

    lw = np.log(np.array([[0.14, 0.019, 1.0], [2.5e-4, 1.3e-4, 1.0], [4.6e-9, 2.6e-7, 1.0]]))
    lw[:, 2] = np.log1p(-np.exp(lw[:, :2]).sum(axis=1))
    lw[2, 0] = -38.38  # 2e-17
    save_npz(
        root / "worst_measures.npz",
        radii=np.array([1.0, 2.0, 4.0]),
        d1_points=np.array(
            [[[1.0], [0.99], [-1.0]], [[2.0], [1.98], [-2.0]], [[4.0], [2.3], [-4.0]]]
        ),
        d1_log_weights=lw,
        d1_value=np.array([2.0, 6.5, 25.0]),
        d1_two_dirac=np.array([0.6, 1.3, 12.9]),
        d2_points=np.array(
            [
                [[-1.0, 0.0], [-0.94, -0.33], [1.0, 0.03]],
                [[2.0, 0.0], [2.0, 1e-4], [-2.0, 0.0]],
                [[-2.5, -3.1], [-2.5, -3.1], [-1.0, 3.9]],
            ]
        ),
        d2_log_weights=lw,
        d2_value=np.array([2.0, 6.5, 490.0]),
    )
    write_json(
        root / "worst_measures.json",
        {"settings": {"d1": {"label": "d = 1", "A": [[1.0]]}, "d2": {"label": "d = 2"}}},
    )


def test_figure_b_rows_masses_and_note(tmp_path, monkeypatch):
    """Each measure stays in its own row band; masses are plain; the notes say what is shown."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import PathCollection

    from paper_figs import fig_b_worst_measures as mod

    _clustered_results(tmp_path)
    kept = []
    original = mod.save
    monkeypatch.setattr(
        mod, "save", lambda fig, stem, **kw: kept.append(fig) or original(fig, stem)
    )
    mod.draw(tmp_path, tmp_path / "out")
    (fig,) = kept
    fig.canvas.draw()
    data = np.load(tmp_path / "worst_measures.npz")
    radii, lw = data["radii"], data["d1_log_weights"]
    (ax,) = [a for a in fig.axes if a.get_title(loc="left").endswith("d = 1")]
    rows = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(rows) == len(radii)
    for i, (coll, R) in enumerate(zip(rows, radii)):
        xy = coll.get_offsets()
        assert np.all(np.abs(xy[:, 1] - i) <= mod.SPREAD) and mod.SPREAD < 0.5  # inside its band
        x = data["d1_points"][i, :, 0] / R
        clustered = np.array([np.sum(np.abs(x - xi) < mod.CLUSTER) > 1 for xi in x])
        on_line = np.isclose(xy[:, 1], i)
        assert sorted(on_line) == sorted(~clustered)  # only clustered atoms leave the line
        for xi, yi in xy[~on_line]:  # each joined to the line by a stem at its position
            assert any(
                np.allclose(ln.get_xdata(), [xi, xi]) and np.allclose(ln.get_ydata(), [i, yi])
                for ln in ax.get_lines()
            )
    texts = [t.get_text() for t in ax.texts]
    assert {mod.mass_label(v) for v in lw.ravel()} <= set(texts)
    assert "2e-17" in texts
    everything = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    assert not any(re.search(r"10\^\{-?\d+\.\d", t) for t in everything)  # no 10^{-16.7}
    # d = 2: two atoms at one point get one label, heavier mass first
    (ax4,) = [a for a in fig.axes if a.get_title().startswith("R = 4,")]
    assert f"{mod.mass_label(lw[2, 1])} & {mod.mass_label(lw[2, 0])}" in [
        t.get_text() for t in ax4.texts
    ]
    # the colour bar speaks in masses, from 1 down
    (cax,) = [a for a in fig.axes if "mass" in a.get_ylabel()]
    ticks = [t.get_text() for t in cax.get_yticklabels()]
    assert sorted(ticks) == ["1", "1e-10", "1e-15", "1e-5"]  # masses down to 2e-17
    note = fig.get_supxlabel()
    assert note == mod.mass_note({"settings": {"d1": {"A": [[1.0]]}}}, radii)
    assert "2e-17" in note and "exp(\\|A\\|R^2)$ = 9e6 at $R$ = 4" in note
