"""The `attack` command (meanfield_cli/commands/attack.py) and the attack figures, on tiny inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from meanfield.attacks import optimal_split_k, split_gain

from .oracles_attacks import seq_norm

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
    assert doc["lower_bound"] <= doc["exact"]["value"] * (1 + 1e-12)
    from experiments.results import load_json, load_npz

    data = load_npz(out / "construct.npz")
    assert data["X"].shape == (6, 3)
    assert seq_norm(data["X"], data["A"], data["V"]) == pytest.approx(
        doc["exact"]["value"], rel=1e-9
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
    assert d2["lower_bound"] == pytest.approx(2 * d1["lower_bound"], rel=1e-12)  # V = 2I
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
    assert doc["value"] >= doc["construction_value"] * (1 - 1e-12)
    assert (tmp_path / "s" / "search.npz").exists() and (tmp_path / "s" / "search.json").exists()
    assert _main(search + "--sequence 4 --steps 5 --json".split()) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "sequence"
    assert _main(["attack", "split", "--s", "3", "--k-max", "30", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["k_opt"] == optimal_split_k(3.0) and doc["G_k"]["1"] == 1.0
    split = "attack split --budget 0.3 --k-max 2 --restarts 1 --steps 10 --json".split()
    assert _main(split) == 0
    a = json.loads(capsys.readouterr().out)["attack"]
    assert a["split"]["ratio_w2"] >= a["move"]["ratio_w2"]
    assert _main(["attack", "split"]) == 2
    assert "give --s" in capsys.readouterr().err


# ----------------------------------------------------------------------------- figures
def _tiny_results(tmp_path):
    from experiments.results import save_npz, write_json

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
