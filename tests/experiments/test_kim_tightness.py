"""Lower bounds on the Lipschitz constants of L2 attention (Kim et al.) and their stage.

Oracles: the dense Jacobian of :func:`meanfield.l2_self_attention` from
``torch.autograd.functional.jacobian`` (max absolute row sum, SVD), the closed form of the
construction with Lambert W from :mod:`theory.lambert`, and Kim et al.'s upper bounds, which
are theorems for ``p = inf`` (a lower bound above one would be a finding).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from meanfield.attacks import (
    l2_construction,
    l2_construction_value,
    l2_jacobian_inf_norm,
    l2_jacobian_spectral_norm,
    l2_lipschitz_lower,
)
from meanfield.attacks import l2_lower as L
from meanfield.attention import l2_self_attention
from meanfield.params import L2AttentionParams
from theory.bounds import kim_l2_norms, kim_l2_upper
from theory.lambert import lambertw

from ..tolerances import (
    BRACKET_MARGIN,
    F64_CLOSED_FORM,
    F64_EXACT_FIT,
    F64_FEW_ULPS,
    F64_LANCZOS_GAP,
    F64_LONG_CHAIN,
    F64_LSTSQ,
    F64_LSTSQ_LOOSE,
    F64_REDUCTION,
    F64_REWRITTEN_EXP,
    F64_TWO_JACOBIANS,
    GRID_MAX,
    SEARCH_START,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

F64 = torch.float64


def _random_params(seed: int, D: int, H: int, wq_scale: float = 1.0) -> L2AttentionParams:
    g = torch.Generator().manual_seed(seed)
    k = D // H
    WQ = wq_scale * torch.randn(H, D, k, generator=g, dtype=F64) / math.sqrt(D)
    WV = torch.randn(H, D, k, generator=g, dtype=F64) / math.sqrt(D)
    WO = torch.randn(D, D, generator=g, dtype=F64) / math.sqrt(D)
    return L2AttentionParams(WQ, WV, WO)


def _scalar(w: float = 1.0) -> L2AttentionParams:
    one = torch.ones(1, 1, 1, dtype=F64)
    return L2AttentionParams(w * one, one, torch.ones(1, 1, dtype=F64))


def _dense_jacobian(X: torch.Tensor, params: L2AttentionParams) -> torch.Tensor:
    N, D = X.shape
    J = torch.autograd.functional.jacobian(lambda Y: l2_self_attention(Y, params), X)
    return J.reshape(-1, N * D)


def _upper(params: L2AttentionParams, N: int, p, **kw) -> float:
    WQ, WV = params.W_Q.numpy(), params.W_V.numpy()
    WO = params.W_O.numpy()
    H, D, _ = WQ.shape
    return float(kim_l2_upper(N, D=D, H=H, p=p, **kim_l2_norms(WQ, WV, WO, p=p), **kw))


# ------------------------------------------------------------------------------ local norms
@pytest.mark.parametrize(("seed", "N", "D", "H"), [(0, 2, 1, 1), (1, 5, 4, 1), (2, 6, 4, 2)])
def test_inf_norm_is_the_dense_max_row_sum(seed, N, D, H):
    params = _random_params(seed, D, H, wq_scale=2.0)
    X = torch.randn(N, D, generator=torch.Generator().manual_seed(seed + 10), dtype=F64)
    J = _dense_jacobian(X, params)
    sums = J.abs().sum(1)
    value, (i, b) = l2_jacobian_inf_norm(X, params)
    assert value == pytest.approx(float(sums.max()), rel=F64_REDUCTION)
    assert float(sums.reshape(N, -1)[i, b]) == pytest.approx(value, rel=F64_REDUCTION)
    row0, _ = l2_jacobian_inf_norm(X, params, rows=[0])
    assert row0 == pytest.approx(float(sums.reshape(N, -1)[0].max()), rel=F64_REDUCTION)


@pytest.mark.parametrize("matrix_free", [False, True])
def test_spectral_norm_is_the_dense_svd(monkeypatch, matrix_free):
    params = _random_params(3, 4, 2, wq_scale=1.5)
    X = torch.randn(6, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    ref = float(torch.linalg.matrix_norm(_dense_jacobian(X, params), ord=2))
    if matrix_free:
        monkeypatch.setattr(L, "_DENSE_MAX", 0)
    assert l2_jacobian_spectral_norm(X, params) == pytest.approx(ref, rel=F64_LANCZOS_GAP)
    assert l2_jacobian_spectral_norm(X, params) <= ref * (1 + BRACKET_MARGIN)


def test_search_attention_equals_the_library_map():
    params = _random_params(5, 8, 2, wq_scale=2.0)
    Z = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(6), dtype=F64)
    maps = L._search_maps(params)
    ref = l2_self_attention(Z, params)
    torch.testing.assert_close(
        L._fast_attention(Z, maps), ref, rtol=F64_LONG_CHAIN, atol=F64_REWRITTEN_EXP
    )
    torch.testing.assert_close(
        L._query_row(Z, maps), ref[:, 0], rtol=F64_LONG_CHAIN, atol=F64_REWRITTEN_EXP
    )


# ---------------------------------------------------------------------------- construction
@pytest.mark.parametrize("layout", ["symmetric", "common"])
@pytest.mark.parametrize(("N", "D", "H"), [(5, 4, 1), (6, 4, 2), (8, 8, 2)])
def test_construction_value_is_the_jacobian_row(layout, N, D, H):
    params = _random_params(N + D, D, H, wq_scale=1.3)
    cs = l2_construction(params, N, layout=layout)
    J = _dense_jacobian(cs.X, params)
    d_out = J.shape[0] // N
    row = J[cs.b].abs().sum()  # output coordinate (token 0, b)
    assert cs.value == pytest.approx(float(row), rel=F64_TWO_JACOBIANS)
    val = l2_construction_value(params, N, cs.c, cs.u, cs.b, layout=layout)
    assert float(val) == pytest.approx(float(row), rel=F64_TWO_JACOBIANS)
    assert d_out == D
    if layout == "symmetric" and (N - 1) % 2 == 1:
        assert cs.n_parked == 1  # even N: one token parked out of the query's reach


@pytest.mark.parametrize("N", [3, 5, 11, 101, 1001])
def test_scalar_construction_closed_form(N):
    # D = H = 1, unit weights, N odd: the best scale has t* = 3/2 + W0((N - 1) e^{-3/2}) and
    # the row sum there is 1 + 4 W0((N - 1) e^{-3/2}) (docs/theory.md §8a)
    params = _scalar()
    w = float(lambertw((N - 1) * math.exp(-1.5)))
    t_star = 1.5 + w
    u = torch.ones(1, dtype=F64)
    at_star = float(l2_construction_value(params, N, math.sqrt(t_star), u, 0))
    assert at_star == pytest.approx(1 + 4 * w, rel=F64_CLOSED_FORM)
    # t* is a maximum of the closed form
    for s in (0.97, 1.03):
        assert float(l2_construction_value(params, N, math.sqrt(s * t_star), u, 0)) < at_star
    cs = l2_construction(params, N)
    assert cs.value <= at_star * (1 + F64_CLOSED_FORM)
    assert cs.value >= at_star * (1 - GRID_MAX)  # the grid of l2_construction, refined
    # and it is the ∞-norm of the Jacobian there (token 0 is the worst row)
    rows = None if N <= 101 else [0, 1, N - 1]
    assert l2_jacobian_inf_norm(cs.X, params, rows=rows)[0] == pytest.approx(
        cs.value, rel=F64_TWO_JACOBIANS
    )


def test_scalar_construction_is_asymptotically_tight():
    # upper / construction = (4 W0((N-1)/e) + 1) / (1 + 4 W0((N-1) e^{-3/2})) decreases to 1
    N = np.array([1e1, 1e3, 1e6, 1e12, 1e24])
    upper = np.asarray(
        kim_l2_upper(N, D=1, H=1, WQ_norms=[1.0], WV_norms=[1.0], WO_norm=1.0, p="inf")
    )
    lower = 1 + 4 * np.asarray(lambertw((N - 1) * math.exp(-1.5)))
    ratio = upper / lower
    assert np.all(np.diff(ratio) < 0) and np.all(ratio > 1)
    assert ratio[-1] < 1.04
    # growth like log N - log log N: the slope against it tends to 4
    x = np.log(N) - np.log(np.log(N))
    slope = (lower[-1] - lower[-2]) / (x[-1] - x[-2])
    assert 3.8 < slope < 4.2


# -------------------------------------------------------------------------------- searches
@pytest.mark.parametrize(
    ("params", "Ns"),
    [
        (_scalar(), (2, 3, 4, 9)),
        (_random_params(4, 4, 1), (2, 5, 16)),
        (_random_params(8, 8, 2, wq_scale=3.0), (3, 8)),
    ],
)
def test_inf_lower_never_exceeds_kims_bound(params, Ns):
    for N in Ns:
        res = l2_lipschitz_lower(params, N, p="inf", n_restarts=2, steps=40, seed=1)
        assert res.value >= res.construction_value * (1 - SEARCH_START)
        assert res.value <= _upper(params, N, "inf")
        assert l2_jacobian_inf_norm(res.X, params)[0] >= res.value * (1 - F64_REDUCTION)


def test_two_norm_lower_and_the_two_forms_of_the_bound():
    params = _random_params(4, 4, 1)
    for N in (2, 6):
        res = l2_lipschitz_lower(params, N, p=2, n_restarts=1, steps=15, seed=0)
        assert res.value >= res.construction_value * (1 - SEARCH_START)
        ref = float(torch.linalg.matrix_norm(_dense_jacobian(res.X, params), ord=2))
        assert res.value == pytest.approx(ref, rel=F64_LANCZOS_GAP)
        assert res.value <= _upper(params, N, 2, wq_power=2)
    # the recalled p = 2 form (wq_power = 1) is linear in |W^Q| while the map is quadratic:
    # with W^Q = 3 (D = H = 1) the measured lower bound exceeds it (docs/theory.md §8, §14)
    big = _scalar(3.0)
    res = l2_lipschitz_lower(big, 3, p=2, n_restarts=0, steps=0)
    assert res.value > _upper(big, 3, 2, wq_power=1)
    assert res.value <= _upper(big, 3, 2, wq_power=2)


def test_search_options_and_inputs():
    params = _scalar()
    a = l2_lipschitz_lower(params, 5, p="inf", n_restarts=1, steps=5, seed=3)
    b = l2_lipschitz_lower(params, 5, p="inf", n_restarts=1, steps=5, seed=3)
    assert a.value == b.value and torch.equal(a.X, b.X)
    assert a.n_starts == 3 and a.X.shape == (5, 1) and a.X.dtype == F64
    with pytest.raises(ValueError, match="p must be 2 or 'inf'"):
        l2_lipschitz_lower(params, 5, p=1)
    with pytest.raises(ValueError, match="N >= 2"):
        l2_lipschitz_lower(params, 1)
    with pytest.raises(ValueError, match="layout"):
        l2_construction(params, 4, layout="ring")
    with pytest.raises(ValueError, match=r"shape \(N, 1\)"):
        l2_jacobian_inf_norm(torch.zeros(3, 2, dtype=F64), params)


# ----------------------------------------------------------------------------------- stage
def test_stage_tiny_preset_and_rerun(tmp_path, monkeypatch):
    from experiments import kim_tightness as kt
    from experiments.engine import load_json, load_npz

    files = kt.run(tmp_path, "tiny", progress=False)
    assert sorted(p.name for p in files) == sorted(
        f"head_{h}{e}"
        for h in ("scalar", "d4h1")
        for e in (".json", ".npz", "_points.jsonl", "_points.meta.json")
    )
    doc = load_json(tmp_path / "kim_tightness" / "head_d4h1.json")
    rows = doc["rows"]
    assert rows["n"] == [2, 3, 5]
    for key in ("lower_inf", "upper_inf", "ratio_inf", "lower_2", "upper_2", "upper_2_wq2"):
        assert len(rows[key]) == 3
    assert doc["violations"] == []
    assert all(lo <= up for lo, up in zip(rows["lower_inf"], rows["upper_inf"], strict=True))
    arr = load_npz(tmp_path / "kim_tightness" / "head_d4h1.npz")
    np.testing.assert_allclose(
        arr["ratio_inf"], arr["upper_inf"] / arr["lower_inf"], rtol=F64_FEW_ULPS
    )
    params, _ = kt.head_params("d4h1")
    assert arr["upper_inf"][1] == pytest.approx(_upper(params, 3, "inf"), rel=F64_CLOSED_FORM)
    # a rerun computes nothing
    mtimes = {p: p.stat().st_mtime_ns for p in files}

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(kt.sweep, "head_results", boom)
    again = kt.run(tmp_path, "tiny", progress=False)
    assert sorted(again) == sorted(files)
    assert all(p.stat().st_mtime_ns == m for p, m in mtimes.items())
    # a head whose files are gone is assembled again from its points; only missing N computed
    monkeypatch.undo()
    before = load_npz(tmp_path / "kim_tightness" / "head_d4h1.npz")
    for e in ("json", "npz"):
        (tmp_path / "kim_tightness" / f"head_d4h1.{e}").unlink()
    points = tmp_path / "kim_tightness" / "head_d4h1_points.jsonl"
    lines = points.read_text().splitlines(keepends=True)
    points.write_text("".join(ln for ln in lines if json.loads(ln)["point"]["N"] != 5))
    calls = []
    real_point = kt.kim_point

    def counting(cfg):
        calls.append(cfg["N"])
        return real_point(cfg)

    monkeypatch.setattr(kt.sweep, "kim_point", counting)
    kt.run(tmp_path, "tiny", progress=False)
    assert calls == [5]
    after = load_npz(tmp_path / "kim_tightness" / "head_d4h1.npz")
    assert before.keys() == after.keys()
    for k in before:  # the records round-trip the floats exactly
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    text = kt.report_section(tmp_path, tmp_path / "figures")
    assert "| N | lower ∞ | upper ∞ | ratio ∞ |" in text and "log N − log log N" in text
    s = kt.summary(tmp_path)
    assert set(s) == {"scalar", "d4h1"} and s["scalar"]["n_max"] == 5
    # the figure draws from these results, and reports missing ones
    from paper_figs import fig_kim_tightness

    out = fig_kim_tightness.draw(tmp_path, tmp_path / "figs")
    assert all(p.stat().st_size > 0 for p in out)
    with pytest.raises(FileNotFoundError, match="kim_tightness"):
        fig_kim_tightness.draw(tmp_path / "empty", tmp_path / "figs")


def test_fit_growth_recovers_known_slopes():
    from experiments.kim_tightness import fit_growth

    n = np.array([8, 16, 32, 64, 128, 256])
    w0 = np.asarray(lambertw((n - 1) / math.e))
    f = fit_growth(n, 4 * w0 + 1)
    assert f["slope_w0"] == pytest.approx(4.0, rel=F64_LSTSQ)
    assert f["intercept_w0"] == pytest.approx(1.0, rel=F64_LSTSQ_LOOSE)
    assert fit_growth(n, 3 * n**0.5)["exponent"] == pytest.approx(0.5, rel=F64_EXACT_FIT)
    assert math.isnan(fit_growth([2, 3], [1.0, 2.0])["slope_w0"])
