"""Synthetic theory sweeps (experiments/synthetic/) and figures F5, F6, F7, A.

The tiny preset runs once per module into a temporary directory; the tests then check the results
schema, resumability (a rerun must not call any per-point computation), physics that could fail
(closed-form construction norm against an independent loop implementation of the Jacobian blocks
and against certified engine brackets; lower and upper bounds of docs/theory.md §1, §3, §4, §6 around the
measured values; convergence to the large-radius limit within our deviation bound), and that every
figure renders under Agg.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import synthetic
from experiments.engine import load_json, load_jsonl, load_npz
from meanfield import AttentionParams, local_lipschitz
from meanfield.attacks import adversarial_sequence
from paper_figs import fig_a_lipschitz_vs_R, fig_f5_sqrt_n, fig_f6_mean_field, fig_f7_large_radius
from theory import bounds

from ..oracles_jacobian import block_formula_loops, nonsymmetric
from ..tolerances import (
    BRACKET_MARGIN,
    F64_CLOSED_FORM,
    F64_FEW_ULPS,
    F64_LANCZOS,
    F64_LARGE_RADIUS_REL,
    F64_NONSYM_EIG_VECTOR,
    F64_REDUCTION,
    F64_REWRITTEN,
    F64_SCALAR_SEARCH,
    F64_ZERO,
    SEARCH_START,
    SEARCH_START_REPARAM,
)

FIGURES = {
    "fig_f5_sqrt_n": fig_f5_sqrt_n,
    "fig_f6_mean_field": fig_f6_mean_field,
    "fig_f7_large_radius": fig_f7_large_radius,
    "fig_a_lipschitz_vs_R": fig_a_lipschitz_vs_R,
}
SWEEPS = ("f5_engine", "worst_measures", "off_axis", "f7")
PARTS = ("f5", "f6", "f7", "a")


@pytest.fixture(scope="module")
def tiny(run_tiny) -> tuple[Path, list[Path]]:
    return run_tiny(synthetic, "synthetic_tiny")


def _npz(root: Path, part: str) -> dict[str, np.ndarray]:
    return load_npz(root / "synthetic" / f"{part}.npz")


# --------------------------------------------------------------------------- closed form
@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_construction_norm_matches_block_loops(gen: torch.Generator, n: int) -> None:
    """Closed-form reduction == SVD of the Jacobian assembled by the independent loop oracle."""
    d, d_v = 2, 3
    A = nonsymmetric(gen, d, scale=1.5).numpy()
    V = torch.randn(d_v, d, generator=gen, dtype=torch.float64).numpy()
    a, b = torch.randn(2, d, generator=gen, dtype=torch.float64).numpy()
    X = np.vstack([a] + [b] * (n - 1))
    J = block_formula_loops(X, A, V)
    exact = np.linalg.norm(J, 2)
    got = float(synthetic.construction_norm(A, V, a, b, n))
    assert got == pytest.approx(exact, rel=F64_REDUCTION)


def test_construction_norm_vectorised_and_validated(gen: torch.Generator) -> None:
    A = nonsymmetric(gen, 2).numpy()
    V = np.eye(2)
    a, b = np.array([1.0, -0.5]), np.array([0.3, 0.8])
    ns = np.array([[2, 5], [9, 40]])
    vec = synthetic.construction_norm(A, V, a, b, ns)
    assert vec.shape == (2, 2)
    one = [float(synthetic.construction_norm(A, V, a, b, int(k))) for k in ns.ravel()]
    np.testing.assert_allclose(vec.ravel(), one, rtol=F64_REWRITTEN)
    with pytest.raises(ValueError, match="n must be"):
        synthetic.construction_norm(A, V, a, b, 0)
    with pytest.raises(ValueError, match="need A"):
        synthetic.construction_norm(A, V, a, np.ones(3), 4)


@pytest.mark.slow
def test_construction_norm_inside_lanczos_bracket_at_large_n() -> None:
    """At n = 2000 (matrix-free Lanczos + block certificate) the closed form lies in the bracket."""
    gamma, n = 5.0, 2000
    A, V = np.array([[-gamma / 2]]), np.eye(1)
    params = AttentionParams(torch.tensor(A), torch.tensor(V))
    seq = adversarial_sequence(params, 1.0, n)
    est = local_lipschitz(seq.X, params, method="lanczos", tol=1e-10)
    closed = float(synthetic.construction_norm(A, V, seq.X[0].numpy(), seq.X[1].numpy(), n))
    assert (
        float(est.lower) * (1 - BRACKET_MARGIN) <= closed <= float(est.upper) * (1 + BRACKET_MARGIN)
    )


# --------------------------------------------------------------------------- contract
def test_presets_and_overrides(tmp_path: Path) -> None:
    assert {"tiny", "quick", "paper"} <= set(synthetic.PRESETS)
    keys = set(synthetic.PRESETS["tiny"].options())
    assert all(set(p.options()) == keys for p in synthetic.PRESETS.values())
    with pytest.raises(ValueError, match="unknown synthetic option"):
        synthetic.run(tmp_path, "tiny", progress=False, not_a_key=1)
    with pytest.raises(ValueError, match="unknown preset"):
        synthetic.run(tmp_path, "huge", progress=False)
    with pytest.raises(ValueError, match=r"mf\.settings must include"):
        synthetic.run(tmp_path, "tiny", progress=False, **{"mf.settings": ["d1_pos"]})
    with pytest.raises(ValueError, match=r"synthetic: setting f5\.R must be a number"):
        synthetic.run(tmp_path, "tiny", progress=False, **{"f5.R": "far"})
    with pytest.raises(ValueError, match=r"unknown synthetic option\(s\) f7\.radius"):
        synthetic.run(tmp_path, "tiny", progress=False, f7={"radius": 2.0})
    assert not (tmp_path / "synthetic").exists()


def test_results_schema(tiny: tuple[Path, list[Path]]) -> None:
    root, files = tiny
    base = root / "synthetic"
    assert all(Path(f).exists() and Path(f).parent == base for f in files)
    for part in PARTS:
        assert base / f"{part}.npz" in files and base / f"{part}.json" in files
        doc = load_json(base / f"{part}.json")
        assert doc["kind"] == f"synthetic/{part}"
        meta = doc["metadata"]
        assert meta["dtype"] == "float64" and meta["device"] == "cpu" and meta["seed"] == 0
        assert {"versions", "git_commit", "config", "schema_version"} <= set(meta)
        assert "findings" in doc
    for sweep in SWEEPS:
        assert base / f"{sweep}.jsonl" in files
        recs = load_jsonl(base / f"{sweep}.jsonl")
        assert recs and all({"key", "config_hash", "point", "seconds"} <= set(r) for r in recs)
        assert len({r["key"] for r in recs}) == len(recs)
    run_doc = load_json(base / "run.json")
    assert run_doc["preset"] == "tiny"
    cfg = synthetic.PRESETS["tiny"]
    f5 = _npz(root, "f5")
    G, N = len(cfg.f5.gammas), len(f5["n_grid"])
    assert f5["closed_grid"].shape == f5["lower_formula"].shape == (G, N)
    assert f5["closed_all"].shape == (G, cfg.f5.n_max - 1)
    assert f5["masked_value"].shape == (G, len(f5["masked_n"]))
    a = _npz(root, "a")
    assert tuple(str(s) for s in a["settings"]) == cfg.mf.settings
    for s in cfg.mf.settings:
        assert a[f"{s}__opt_value"].shape == (len(cfg.mf.a_atoms), len(cfg.mf.radii))
    f6 = _npz(root, "f6")
    assert f6["opt_value"].shape == (len(cfg.mf.f6_atoms), len(cfg.mf.radii))
    f7 = _npz(root, "f7")
    assert f7["unmasked_value"].shape == (cfg.f7.inputs, cfg.f7.R_points)
    doc = synthetic.summary(root)
    assert set(PARTS) <= set(doc)
    json.dumps(doc)  # JSON-able


def test_resume_recomputes_nothing(
    tiny: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, files = tiny
    shutil.copytree(root / "synthetic", tmp_path / "synthetic")
    lines = {s: (tmp_path / "synthetic" / f"{s}.jsonl").read_text() for s in SWEEPS}

    def boom(*args, **kwargs):
        raise AssertionError("a finished point was recomputed")

    for module, name in (
        (synthetic.sqrt_n_regime, "_f5_point"),
        (synthetic.mean_field, "_worst_point"),
        (synthetic.mean_field, "_off_axis_point"),
        (synthetic.large_radius, "_f7_point"),
    ):
        monkeypatch.setattr(module, name, boom)
    again = synthetic.run(tmp_path, "tiny", progress=False)
    assert sorted(p.name for p in again) == sorted(Path(p).name for p in files)
    for s in SWEEPS:
        assert (tmp_path / "synthetic" / f"{s}.jsonl").read_text() == lines[s]
    for part in PARTS:
        old, new = _npz(root, part), _npz(tmp_path, part)
        assert old.keys() == new.keys()
        for k in old:
            np.testing.assert_array_equal(old[k], new[k])


def test_off_axis_records_of_the_old_layout_are_recomputed(
    tiny: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """An output directory written before the logit gap was renamed ``gamma`` (layout 1: ``s``,
    a configuration without ``layout``) resumes: its off-axis records belong to another
    configuration and are computed again, with the same values under the new name."""
    from experiments.engine._keys import config_hash, point_key

    root, _ = tiny
    shutil.copytree(root / "synthetic", tmp_path / "synthetic")
    sdir = tmp_path / "synthetic"
    meta = load_json(sdir / "off_axis.meta.json")
    old_cfg = {k: v for k, v in meta["config"].items() if k != "layout"}
    assert meta["config"]["layout"] == synthetic.mean_field.OFF_AXIS_LAYOUT == 2
    digest = config_hash(old_cfg)
    meta.update(config=old_cfg, config_hash=digest)
    (sdir / "off_axis.meta.json").write_text(json.dumps(meta))
    old = load_jsonl(sdir / "off_axis.jsonl")
    rows = []
    for r in old:
        r = dict(r, config_hash=digest, key=point_key(digest, r["point"]))
        r["s"] = r.pop("gamma")
        rows.append(json.dumps(r))
    (sdir / "off_axis.jsonl").write_text("\n".join(rows) + "\n")
    synthetic.run(tmp_path, "tiny", progress=False)
    again = {
        json.dumps(r["point"], sort_keys=True): r
        for r in load_jsonl(sdir / "off_axis.jsonl")
        if r["config_hash"] == config_hash(load_json(sdir / "off_axis.meta.json")["config"])
    }
    assert len(again) == len(old)
    for r in old:
        assert again[json.dumps(r["point"], sort_keys=True)]["gamma"] == r["gamma"]


def test_report_section_links_figures(tiny: tuple[Path, list[Path]], tmp_path: Path) -> None:
    root, _ = tiny
    text = synthetic.report_section(root, tmp_path / "figures")
    for stem in FIGURES:
        assert f"(figures/{stem}.png)" in text
    assert "docs/theory.md §17" in text  # the c' = 1 bound is cited with its proof


def test_summary_missing_results(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="synthetic"):
        synthetic.summary(tmp_path)


# --------------------------------------------------------------------------- physics: F5
def test_f5_measured_between_bounds(tiny: tuple[Path, list[Path]]) -> None:
    root, _ = tiny
    d = _npz(root, "f5")
    closed = d["closed_grid"]
    # exact unmasked value >= the §3 lower-bound formula (and the k=1 copy bound) ...
    assert np.all(closed >= d["lower_formula"] * (1 - BRACKET_MARGIN))
    # ... and <= the §1 upper bound (triangle form, the smallest of the three)
    assert np.all(closed <= d["upper_triangle"])
    # the closed form lies inside the certified engine brackets at the check points
    assert np.all(d["check_lower"] <= d["check_closed"] * (1 + BRACKET_MARGIN))
    assert np.all(d["check_closed"] <= d["check_upper"] * (1 + BRACKET_MARGIN))
    # masked: certified bracket, above the §4 formula, below the √n bound (valid masked, §1)
    m = len(d["masked_n"])
    mv = d["masked_value"]
    assert np.all(d["masked_lower"] <= mv) and np.all(mv <= d["masked_upper"])
    assert np.all(d["masked_upper"] >= d["masked_lower_formula"][:, :m] * (1 - BRACKET_MARGIN))
    assert np.all(d["masked_lower"] <= d["upper_triangle"][:, :m])
    # the masked lower bound increases in n towards its limit
    assert np.all(d["masked_lower_formula"][:, :m] <= d["masked_limit"][:, None])


def test_f5_peak_and_mean_field_level(tiny: tuple[Path, list[Path]]) -> None:
    root, _ = tiny
    d = _npz(root, "f5")
    for gi, g in enumerate(d["gammas"]):
        closed = d["closed_all"][gi]
        k = int(np.argmax(closed))
        # the exact curve peaks in the interior, at n - 1 of order e^gamma (here within [1/2, 4])
        assert 0 < k < closed.size - 1
        assert 0.5 <= (d["n_all"][k] - 1) / np.exp(g) <= 4.0
        # the peak is at least sup_eps g (= the lower-bound formula's continuous peak)
        assert closed[k] >= d["sup_g"][gi] * (1 - BRACKET_MARGIN)
        # Lip(f | B_R^n) <= Lip(F | P(B_R)) <= the c' = 1 bound (docs/theory.md §16, §6, proof in §17)
        assert closed.max() <= d["mf_upper_c1"][gi]


# --------------------------------------------------------------------------- physics: F6, A
def test_mean_field_optimizer_between_bounds(tiny: tuple[Path, list[Path]]) -> None:
    root, _ = tiny
    a = _npz(root, "a")
    f6 = _npz(root, "f6")
    blocks = [
        {k.split("__", 1)[1]: v for k, v in a.items() if k.startswith(f"{s}__")}
        for s in (str(x) for x in a["settings"])
    ] + [f6]
    for b in blocks:
        val = b["opt_value"]
        sup = b["at_radii_sup_g"][None, :]
        # starts include the exact two-Dirac optimum, so the search never ends below it
        assert np.all(val >= sup * (1 - F64_LANCZOS))
        assert np.all(val >= b["opt_construction_value"] * (1 - SEARCH_START))
        # certified bracket around the reported value
        assert np.all(b["opt_lower"] <= val) and np.all(val <= b["opt_upper"])
        # library two-Dirac bound (meanfield.attacks) == closed form (theory.bounds), V = I
        np.testing.assert_allclose(
            b["opt_two_dirac_bound"], np.broadcast_to(sup, val.shape), rtol=F64_NONSYM_EIG_VECTOR
        )
        # the upper bounds are not exceeded (c' = 1 is proved in docs/theory.md §17: a bug if it were)
        assert np.all(val <= b["at_radii_upper_c1"][None, :])
        assert np.all(val <= b["at_radii_upper_c2"][None, :])
        # the 2-atom search starts from the off-axis maximiser: never below its bound (§A3)
        two = list(b["atoms"]).index(2)
        assert np.all(val[two] >= b["off_axis_value"] * (1 - SEARCH_START_REPARAM))
        assert np.all(b["off_axis_value"] >= b["at_radii_sup_g"] * (1 - F64_SCALAR_SEARCH))
        # ordering of the closed-form curves: w = 1/2 and asymptote below sup g; global lower
        assert np.all(b["curve_half"] <= b["curve_sup_g"] * (1 + F64_CLOSED_FORM))
        assert np.all(b["curve_asymptote"] <= b["curve_sup_g"] * (1 + F64_CLOSED_FORM))
        np.testing.assert_allclose(
            b["curve_global_lower"], np.maximum(b["curve_trivial"], b["curve_sup_g"])
        )


def test_mean_field_curves_match_theory_global_lower(tiny: tuple[Path, list[Path]]) -> None:
    root, _ = tiny
    a = _npz(root, "a")
    for s in (str(x) for x in a["settings"]):
        A, V = synthetic.mf_setting(s)
        ref = bounds.mean_field_lower(A, V, a["curve_R"])
        np.testing.assert_allclose(a[f"{s}__curve_global_lower"], ref, rtol=F64_CLOSED_FORM)


# --------------------------------------------------------------------------- physics: F7
def test_f7_converges_to_large_radius_limit(tiny: tuple[Path, list[Path]]) -> None:
    root, _ = tiny
    d = _npz(root, "f7")
    n, v_norm = int(d["n"]), float(d["V_norm"])
    for tag in ("unmasked", "masked"):
        val, lim = d[f"{tag}_value"], d[f"{tag}_limit"]
        assert np.all(lim <= np.sqrt(n) * v_norm * (1 + F64_FEW_ULPS))
        np.testing.assert_array_equal(lim, v_norm * np.sqrt(d[f"{tag}_counts"].max(axis=1)))
        assert np.all(d[f"{tag}_counts"].sum(axis=1) == n)
        # at R = 1000 the attention is an exact selection: the limit is reached
        np.testing.assert_allclose(val[:, -1], lim, rtol=F64_LARGE_RADIUS_REL)
        # our quantitative deviation bound holds at every radius
        err = np.abs(val - lim[:, None])
        assert np.all(err <= d[f"{tag}_deviation_bound"] * (1 + F64_LARGE_RADIUS_REL) + F64_ZERO)
        assert np.all(d[f"{tag}_lower"] <= val) and np.all(val <= d[f"{tag}_upper"])


# --------------------------------------------------------------------------- figures
@pytest.mark.parametrize("stem", sorted(FIGURES))
def test_figure_renders(tiny: tuple[Path, list[Path]], tmp_path: Path, stem: str) -> None:
    root, _ = tiny
    paths = FIGURES[stem].draw(root, tmp_path / "figures")
    assert sorted(p.name for p in paths) == [f"{stem}.pdf", f"{stem}.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert FIGURES[stem].STEM == stem


@pytest.mark.parametrize("stem", sorted(FIGURES))
def test_figure_missing_results(tmp_path: Path, stem: str) -> None:
    with pytest.raises(FileNotFoundError, match="synthetic"):
        FIGURES[stem].draw(tmp_path, tmp_path / "figures")


def test_f6_dodged_markers_are_said_and_centred(
    tiny: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F6: the sideways offset of the 2–5-atom markers is stated under the legend and is honest.

    The markers of one radius are centred (geometric mean) on it, the off-axis × sit on it, groups
    of neighbouring radii do not interleave, and a dotted guide marks every measured radius.
    """
    root, _ = tiny
    mod = fig_f6_mean_field
    kept = []
    original = mod.save

    def keep(figure, stem, **kw):
        kept.append(figure)
        return original(figure, stem, **kw)

    monkeypatch.setattr(mod, "save", keep)
    mod.draw(root, tmp_path / "figures")
    (figure,) = kept
    f6 = _npz(root, "f6")
    radii, atoms = f6["radii"], f6["atoms"]
    (legend,) = figure.legends
    title = legend.get_title().get_text()
    assert title == mod.dodge_note(radii) and "offset sideways" in title
    assert all(f"{r:.3g}" in title for r in radii)
    ax0 = figure.axes[0]
    by_label = {ln.get_label(): ln for ln in ax0.get_lines()}
    xs = np.array([by_label[f"optimized measure, {k} atoms (measured)"].get_xdata() for k in atoms])
    assert len(atoms) > 1 and not np.allclose(xs, radii)  # dodged ...
    np.testing.assert_allclose(
        np.exp(np.log(xs).mean(axis=0)), radii, rtol=F64_CLOSED_FORM
    )  # ... around R
    np.testing.assert_array_equal(
        by_label["off-axis two atoms, maximised (lower bound)"].get_xdata(), radii
    )
    assert np.all(xs.max(axis=0)[:-1] < xs.min(axis=0)[1:])
    for ax in figure.axes[:2]:
        guides = {
            float(ln.get_xdata()[0])
            for ln in ax.get_lines()
            if ln.get_linestyle() == ":" and len(ln.get_xdata()) == 2
        }
        assert guides == {float(r) for r in radii}


@pytest.mark.parametrize("n_radii", [2, 5, 16])
def test_f6_dodge_step_keeps_groups_apart(n_radii: int) -> None:
    radii = np.geomspace(0.5, 10.0, n_radii)
    n = 4
    step = fig_f6_mean_field.dodge_step(radii, n)
    assert 0 < step <= fig_f6_mean_field.DODGE
    half_width = step * (n - 1) / 2
    gap = float(np.diff(np.log(radii)).min())
    assert 2 * half_width < gap  # the outermost markers of neighbours never meet
    if gap > 4 * fig_f6_mean_field.DODGE:
        assert step == fig_f6_mean_field.DODGE
    assert fig_f6_mean_field.dodge_step(radii[:1], n) == fig_f6_mean_field.DODGE
    note = fig_f6_mean_field.dodge_note(radii)
    if n_radii <= 6:
        assert all(f"{r:.3g}" in note for r in radii)
    else:  # too many to list under the legend: their number and range
        assert f"{n_radii} radii from 0.5 to 10 only" in note
