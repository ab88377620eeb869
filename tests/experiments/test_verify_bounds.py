"""Tests of the verification harness (the package experiments/verify_bounds/).

The harness checks theory.bounds against the certified engine; these tests check its checks
(experiments/verify_bounds/checks.py): that it runs clean on a fast subset, that it does catch a
wrong bound (theorem violations fail, candidate failures are recorded as refutations), that the
certified data-dependent bound (docs/theory.md §2a) is a bound by an engine-free finite difference
check, and that the bounds checked are the verified records of theory.bounds.registry. Instance
generation and the stage/command contract are tested in test_verify_bounds_generation.py and
test_verify_bounds_stage.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import verify_bounds as vb
from theory.bounds import certified_local_upper

from ..tolerances import BRACKET_MARGIN, CERTIFIED_INFLATION, FD_REL
from ..wrong_bounds import WRONG_LOWER, WRONG_UPPER, upper_half_trivial

#: The two-Dirac and mean-field lower bounds, listed in this order in both name lists below.
_LOWER_FAMILY = [
    "two_dirac_lower",
    "two_dirac_g",
    "two_dirac_half",
    "two_dirac_asymptote",
    "mean_field_lower",
    "off_axis_two_atom",
]


@pytest.fixture(scope="module")
def fast_report() -> dict:
    """Two periods of the schedule: every kind at least twice (a few seconds)."""
    return vb.verify(2 * len(vb.SCHEDULE), seed=1, progress=False)


def test_fast_subset_runs_clean(fast_report):
    rep = fast_report
    assert rep["passed"], rep["violations"][:2]
    assert rep["n_theorem_violations"] == 0 and rep["violations"] == []
    assert set(rep["instances_by_kind"]) == set(vb.KINDS)
    core = [
        "sqrt_n_upper[sqrt3]",
        "sqrt_n_upper[triangle]",
        "certified_local",
        "mean_field_upper[c'=2]",
        "trivial_lower",
        "sequence_lower",
        *_LOWER_FAMILY,
        "large_radius[limit+deviation]",
        "kim_softmax_lemma",
    ]
    for name in core:
        b = rep["bounds"][name]
        assert b["n_checked"] > 0, name
        assert b["min_margin"] >= 1.0 - vb.BOUND_RTOL, name
    # tightness is bound / value: >= 1 for upper bounds, <= 1 for lower bounds (certified
    # brackets are within 1e-10 relative of the value here)
    for name, b in rep["bounds"].items():
        if b["n_checked"] == 0 or b["status"] != "theorem":
            continue
        if b["side"] == "upper":
            assert b["tightness"]["min"] >= 1.0 - CERTIFIED_INFLATION, name
        elif b["side"] == "lower":
            assert b["tightness"]["max"] <= 1.0 + CERTIFIED_INFLATION, name


def test_harness_catches_a_wrong_theorem():
    rep = vb.verify(
        2 * len(vb.SCHEDULE),
        seed=1,
        kinds=["equal_tokens", "construction"],
        progress=False,
        extra_bounds=[WRONG_UPPER, WRONG_LOWER],
    )
    assert not rep["passed"]
    names = {v["name"] for v in rep["violations"]}
    assert names == {"wrong_upper", "wrong_lower"}
    assert rep["bounds"]["wrong_upper"]["n_violations"] == rep["bounds"]["wrong_upper"]["n_checked"]
    v = next(v for v in rep["violations"] if v["name"] == "wrong_upper")
    inst = v["instance"]
    for key in ("seed", "index", "kind", "d", "n", "R", "masked", "heads", "X"):
        assert key in inst
    assert v["bound"] < v["lower"]
    # the instance is reproducible from (seed, index, kind): same bracket
    t = vb.make_targets(inst["seed"], inst["index"], inst["kind"])[v["target_index"]]
    assert (t.lower, t.value, t.upper) == (v["lower"], v["value"], v["upper"])
    np.testing.assert_array_equal(t.ctx["X"], inst["X"])
    # the genuine bounds on the same instances still hold
    assert rep["bounds"]["trivial_lower"]["n_violations"] == 0
    assert rep["bounds"]["sqrt_n_lower"]["n_violations"] == 0


def test_a_failing_candidate_is_a_finding_not_a_failure():
    wrong = vb.BoundSpec("wrong_candidate", "upper", "candidate", "test", upper_half_trivial)
    rep = vb.verify(10, seed=2, kinds=["equal_tokens"], progress=False, extra_bounds=[wrong])
    assert rep["passed"]
    c = rep["candidates"]["wrong_candidate"]
    assert c["verdict"] == "refuted" and c["n_refuted"] == c["n_checked"] == 10
    assert c["min_margin"] < 1 and c["examples"]


def test_exponent_probe_is_refuted_by_two_diracs():
    """c' = 1/2 must fail where sup g ~ gamma e^{gamma/2} with gamma = 2||A||R^2 (A = -aI)."""
    rep = vb.verify(30, seed=3, kinds=["two_dirac"], progress=False)
    assert rep["passed"]
    assert rep["candidates"]["mean_field_upper[c'=1/2]"]["verdict"] == "refuted"
    # c' = 1 is a theorem since docs/theory.md §17: checked as one, never violated
    c1 = rep["bounds"]["mean_field_upper[c'=1]"]
    assert c1["status"] == "theorem" and c1["n_checked"] > 0 and c1["n_violations"] == 0
    assert "mean_field_upper[c'=1]" not in rep["candidates"]


def _naive_attention(X: np.ndarray, heads, masked: bool) -> np.ndarray:
    """Independent numpy attention: sum_h W_h V_h sum_j P_ij x_j (column convention)."""
    n = X.shape[0]
    out = 0.0
    for A, V, W in heads:
        S = X @ A @ X.T
        if masked:
            S = np.where(np.tril(np.ones((n, n), bool)), S, -np.inf)
        P = np.exp(S - S.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        WV = V if W is None else W @ V
        out = out + P @ X @ WV.T
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_certified_local_bound_dominates_finite_differences(rng, masked):
    for _ in range(6):
        d, n = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        H = int(rng.integers(1, 3))
        WO = rng.standard_normal((d, H * d)) if H > 1 else None
        heads = [
            (
                rng.standard_normal((d, d)),
                rng.standard_normal((d, d)),
                None if WO is None else WO[:, h * d : (h + 1) * d],
            )
            for h in range(H)
        ]
        X = 1.5 * rng.standard_normal((n, d))
        x0, h = X.ravel(), 1e-6
        J = np.stack(
            [
                (
                    _naive_attention((x0 + h * e).reshape(n, d), heads, masked)
                    - _naive_attention((x0 - h * e).reshape(n, d), heads, masked)
                ).ravel()
                / (2 * h)
                for e in np.eye(n * d)
            ],
            axis=1,
        )
        exact = np.linalg.norm(J, 2)
        assert certified_local_upper(X, heads, masked=masked) >= exact * (1 - FD_REL)


def test_certified_local_bound_closed_form_at_equal_tokens(rng):
    """Equal tokens: P has norm 1 (uniform rows), C_i = 0, so the bound is ||V|| exactly.

    The returned value adds the rounding margin of docs/rounding.md §8 (a few 1e-13 here).
    """
    A, V = rng.standard_normal((3, 3)), rng.standard_normal((2, 3))
    X = np.repeat(rng.standard_normal((1, 3)), 5, 0)
    got = certified_local_upper(X, [(A, V, None)])
    assert np.linalg.norm(V, 2) <= got <= np.linalg.norm(V, 2) * (1 + BRACKET_MARGIN)


@pytest.mark.slow
def test_thousands_of_instances_run_clean():
    rep = vb.verify(3000, seed=0, progress=False)
    assert rep["passed"], [(v["name"], v["index"], v["kind"]) for v in rep["violations"][:5]]
    assert rep["n_instances"] == 3000
    assert sum(b["n_checked"] for b in rep["bounds"].values()) > 20000
    assert rep["candidates"]["mean_field_upper[c'=1/2]"]["verdict"] == "refuted"
    # the docs/theory.md §2 counterexample family is generated: the released quantity fails
    assert rep["known_invalid"]["released_data_dependent"]["n_fail"] > 0
    assert math.isfinite(rep["bounds"]["certified_local"]["tightness"]["median"])


def test_checked_bounds_are_the_verified_records_of_the_registry():
    """The harness reads names, sides and statuses from theory.bounds.registry, in its order."""
    from theory.bounds import registry

    records = registry.verified()
    assert [(s.name, s.side, s.status) for s in vb.BOUNDS] == [
        (r.name, r.side, r.status) for r in records
    ]
    assert set(vb.EVALUATORS) == {r.name for r in records}
    assert all(s.source.startswith("docs/theory.md §") for s in vb.BOUNDS)
    # the report names of the harness before the registry existed: reports stay comparable
    assert [s.name for s in vb.BOUNDS] == [
        "sqrt_n_upper[sqrt3]",
        "sqrt_n_upper[sharp]",
        "sqrt_n_upper[triangle]",
        "multihead_upper[l2,triangle]",
        "certified_local",
        "released_data_dependent",
        "released_data_dependent+max_Ax",
        "mean_field_upper[c'=2]",
        "mean_field_upper[c'=1]",
        "mean_field_upper[c'=1/2]",
        "mean_field_upper[c'=2,masked]",
        "mean_field_upper[c'=1,masked]",
        "mean_field_upper[c'=1,masked,Hardy]",
        "trivial_lower",
        "sqrt_n_lower",
        "masked_sqrt_n_lower",
        "sequence_lower",
        *_LOWER_FAMILY,
        "large_radius[limit+deviation]",
        "large_radius[limit-deviation]",
        "large_radius_limit",
        "kim_l2_upper[p=2]",
        "kim_l2_upper[p=2,WQ^2]",
        "kim_l2_upper[p=inf]",
        "kim_softmax_lemma",
    ]


def test_stage_interface_is_importable_from_the_package():
    """What the registry and the ``verify-bounds`` command use, from the package."""
    import inspect

    for name in ("PRESETS", "run", "summary", "report_section", "verify"):
        assert hasattr(vb, name), name
    assert list(inspect.signature(vb.run).parameters) == [
        "results_dir",
        "preset",
        "device",
        "progress",
        "settings",
    ]
    assert list(inspect.signature(vb.report_section).parameters) == ["results_dir", "figures_dir"]
    assert set(vb.PRESETS) == {"tiny", "quick", "paper"}
