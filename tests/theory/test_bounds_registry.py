"""The registry of bounds (theory.bounds.registry) and its three readers.

Every record is callable and evaluates its function with its fixed options; sides, statuses and
sections are valid and point at existing sections of docs/theory.md; every public function of
theory.bounds is registered; the docs table is the registry's; the command-line table matches the
one of ``meanfield bound``; the composed records agree with independent closed forms and oracles.
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import numpy as np
import pytest

from theory import bounds as B
from theory.bounds import registry

from ..oracles_bounds import jacobian, spec
from ..tolerances import F64_CLOSED_FORM, F64_FEW_ULPS, F64_LARGE_RADIUS_REL

DOCS = Path(__file__).resolve().parents[2] / "docs" / "theory.md"

_A = np.array([[0.3, -0.8], [0.5, 0.2]])
_V = np.array([[1.1, 0.2], [-0.4, 0.9]])
_X = np.array([[0.9, 0.1], [-0.3, 0.7], [0.2, -0.5]])
_WQ = np.array([[[0.4], [0.3]], [[-0.2], [0.5]]])  # (H, D, D/H) = (2, 2, 1)
_WV = np.array([[[0.6], [-0.1]], [[0.3], [0.2]]])
_WO = np.array([[0.7, 0.1], [-0.2, 0.5]])

#: One admissible value per input name used by the registry.
SAMPLE = {
    "A_norm": 0.7,
    "V_norm": 1.3,
    "R": 1.5,
    "n": 5.0,
    "gamma": 2.0,
    "Vu_norm": 0.9,
    "head_bounds": np.array([1.0, 2.5]),
    "X": _X,
    "heads": [(_A, _V, None)],
    "V_norms": np.array([1.2]),
    "R_h": np.array([0.6]),
    "r": 1.4,
    "eps": 0.05,
    "log_eps": -3.0,
    "A": _A,
    "V": _V,
    "x": np.array([1.0, 0.2]),
    "y": np.array([-0.5, 0.4]),
    "h": np.array([0.3, 1.0]),
    "w": 0.3,
    "counts": np.array([2, 1, 0]),
    "gap": 4.0,
    "N": 4.0,
    "q": 0.25,
    "WQ": _WQ,
    "WV": _WV,
    "WO": _WO,
    "lam_max": 0.8,
    "lam_min": -0.6,
    "L": 7.0,
    "lam": -0.5,
    "a": 1.0,
    "b": 2.0,
    "c": 1.0,
    "k": 3.0,
    "s": 2.5,
    # bounded logits (docs/derivations/bounded_logits.md)
    "kappa": 2.0,
    "Q_norm": 0.8,
    "K_norm": 1.1,
    "logit_bound": 1.5,
    "grad_query": 0.9,
    "grad_key": 1.2,
    "window": 2.0,
}


#: Report names of the verification harness kept as they were (reports stay comparable).
HISTORIC_NAMES = {
    "certified_local",
    "released_data_dependent+max_Ax",
    "large_radius[limit+deviation]",
    "large_radius[limit-deviation]",
}


def _kwargs(rec: registry.Bound) -> dict:
    """Keyword options a record needs beyond its positional inputs (Kim's norms)."""
    if rec.function == "kim_l2_upper":
        p = rec.fixed.get("p", 2)
        return {"D": 2, "H": 2, **B.kim_l2_norms(_WQ, _WV, _WO, p=p)}
    if rec.fixed.get("rule") == "l2":
        return {"WO_norm": 1.0}
    return {}


def _call(rec: registry.Bound):
    return rec(*(SAMPLE[a] for a in rec.args), **_kwargs(rec))


def test_sides_statuses_and_names_are_valid():
    names = [r.name for r in registry.BOUNDS]
    assert len(set(names)) == len(names)
    for r in registry.BOUNDS:
        assert r.side in registry.SIDES and r.status in registry.STATUSES, r.name
        assert r.help and r.provenance, r.name
        # a plain function, a bracketed variant, or one of the harness's historic report names
        assert (
            r.name == r.function or r.name.startswith(r.function + "[") or r.name in HISTORIC_NAMES
        ), r.name
        if r.status == "reported":
            assert r.side == "limit", r.name
    with pytest.raises(ValueError, match="side must be one of"):
        registry.Bound("x", "trivial_lower", "sideways", "theorem", "standard", "s", (), "h")
    with pytest.raises(ValueError, match="status must be one of"):
        registry.Bound("x", "trivial_lower", "upper", "proved", "standard", "s", (), "h")


def test_provenance_agrees_with_status():
    """A theorem cites a derivation; a candidate says why it is not one; a heuristic its origin."""
    for r in registry.BOUNDS:
        text = r.provenance.lower()
        if r.status == "theorem":
            assert "derived" in text or "standard" in text or "as sqrt_n_upper" in text, r.name
        elif r.status == "candidate":
            assert any(w in text for w in ("recollection", "no proof", "probe", "unknown")), r.name
        elif r.status == "heuristic":
            assert "released code" in text, r.name


def test_every_public_function_is_registered():
    public = {n for n in B.__all__ if inspect.isfunction(getattr(B, n))}
    registered = {r.function for r in registry.BOUNDS}
    assert public - registered == set()
    assert registered <= public


def test_every_record_is_callable_with_its_fixed_options():
    for r in registry.BOUNDS:
        out = _call(r)
        if r.compose is None:
            expected = r.func(*(SAMPLE[a] for a in r.args), **r.fixed, **_kwargs(r))
            if isinstance(out, tuple):  # dataclass results compare field by field
                assert out == expected, r.name
            elif isinstance(out, dict):
                assert out.keys() == expected.keys(), r.name
            elif hasattr(out, "__dataclass_fields__"):
                assert repr(out) == repr(expected), r.name
            else:
                np.testing.assert_array_equal(out, expected, err_msg=r.name)
        if r.side in ("upper", "lower", "limit"):
            val = np.asarray(out, dtype=float)
            assert np.all(np.isfinite(val)), (r.name, out)
            if r.side != "lower":  # a negative lower bound is valid (and empty)
                assert np.all(val >= 0), (r.name, out)


def test_inputs_and_options_match_the_signatures():
    for r in registry.BOUNDS:
        if r.compose is not None:
            params = inspect.signature(r.compose).parameters
        else:
            params = inspect.signature(r.func).parameters
        positional = [
            p.name
            for p in params.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        assert len(r.args) <= len(positional), r.name
        keyword = set(params)
        assert set(r.options) <= keyword, (r.name, set(r.options) - keyword)
        assert set(r.fixed) <= keyword, (r.name, set(r.fixed) - keyword)


def test_variants_fix_the_options_they_name():
    args = (0.7, 1.3, 1.5, 5.0)
    for form in ("sqrt3", "sharp", "triangle"):
        rec = registry.get(f"sqrt_n_upper[{form}]")
        assert rec(*args) == B.sqrt_n_upper(*args, form=form)
    for c, name in ((2.0, "c'=2"), (1.0, "c'=1"), (0.5, "c'=1/2")):
        assert registry.get(f"mean_field_upper[{name}]")(*args[:3]) == B.mean_field_upper(
            *args[:3], c=c
        )
    assert {r.name for r in registry.by_function("kim_l2_upper")} == {
        "kim_l2_upper[p=2]",
        "kim_l2_upper[p=2,WQ^2]",
        "kim_l2_upper[p=inf]",
    }
    with pytest.raises(KeyError, match="unknown bound 'nope'"):
        registry.get("nope")


@pytest.mark.parametrize(("a", "v", "R"), [(0.05, 1.0, 0.3), (0.7, 2.0, 1.5), (2.0, 0.5, 3.0)])
def test_masked_hardy_record_matches_its_closed_form(a, v, R):
    theta = a * R**2
    expected = v * (theta + 2.0 * (1.0 + 2.0 * theta) * math.exp(theta))
    got = registry.get("mean_field_upper[c'=1,masked,Hardy]")(a, v, R)
    assert got == pytest.approx(expected, rel=F64_CLOSED_FORM)


@pytest.mark.parametrize("masked", [False, True])
def test_large_radius_band_contains_the_exact_constant(rng, masked):
    """limit - deviation <= ||Df(X)|| <= limit + deviation, ||Df|| from the oracle Jacobian."""
    up = registry.get("large_radius[limit+deviation]")
    lo = registry.get("large_radius[limit-deviation]")
    for R in (1.0, 10.0, 30.0):
        for _ in range(5):
            X0 = rng.standard_normal((4, 2))
            X = R * X0 / np.max(np.linalg.norm(X0, axis=1))
            A = rng.standard_normal((2, 2))
            V = rng.standard_normal((2, 2))
            exact = spec(jacobian(X, A, V, masked=masked))
            hi, low = up(X, A, V, masked=masked), lo(X, A, V, masked=masked)
            assert low * (1 - F64_LARGE_RADIUS_REL) <= exact <= hi * (1 + F64_LARGE_RADIUS_REL)
            counts = B.large_radius_counts(X, A, masked=masked)
            lim = float(B.large_radius_limit(counts, np.linalg.norm(V, 2)))
            assert (hi + low) / 2 == pytest.approx(lim, rel=F64_CLOSED_FORM)


def test_sections_exist_in_the_docs():
    headings = set(re.findall(r"^## (\d+)\. ", DOCS.read_text(encoding="utf-8"), flags=re.M))
    for r in registry.BOUNDS:
        m = re.fullmatch(r"docs/theory\.md §(\d+)", r.section)
        assert m, r.section
        assert m.group(1) in headings, (r.name, r.section)


def test_docs_table_is_the_registry():
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(
        r"<!-- registry-table:start -->\n(.*?)\n<!-- registry-table:end -->", text, flags=re.S
    )
    assert block, "docs/theory.md §15 lost its registry table markers"
    assert block.group(1) == registry.markdown_table(), (
        "docs/theory.md §15 is out of date: paste theory.bounds.registry.markdown_table()"
    )


def test_meanfield_bound_reads_the_registry():
    """``meanfield bound`` lists exactly the registry's CLI records, each a callable of theory.bounds."""
    from meanfield_cli.commands import bound as bound_cmd

    cli = registry.cli_bounds()
    assert set(cli) == set(bound_cmd.BOUNDS)
    for name, rec in bound_cmd.BOUNDS.items():
        assert rec == cli[name], name
        assert rec.help.endswith(f"({rec.section})")
        fn = getattr(B, rec.function)
        assert len(rec.args) <= len(inspect.signature(fn).parameters)


def test_verified_records_have_bound_sides():
    for r in registry.verified():
        assert r.side in ("upper", "lower", "limit"), r.name


@pytest.mark.parametrize(
    "command",
    [
        "sqrt-n-upper --A-norm 2 --V-norm 0.5 --R 1,3 --n 2:10:4",
        "sqrt-n-upper --A-norm 1 --V-norm 1 --R 2 --n 5 --form sharp",
        "mean-field-upper --A-norm 1 --V-norm 1 --R 0.5,2 --c 2",
        "two-dirac-lower --gamma 0.5,4",
        "radius-for-target --L 20 --lam -0.5 --form exact",
        "split-gain --k 1,2,30 --s 3",
        "kim-softmax --N 2:6:2",
    ],
)
def test_meanfield_bound_equals_the_function_on_the_grid(command, cli_json):
    """The command's values are the theory function evaluated on the outer product of the grids."""
    argv = command.split()
    doc = cli_json("bound", *argv)
    rec = registry.cli_bounds()[argv[0]]
    grids = np.meshgrid(
        *(np.asarray(v, dtype=float) for v in doc["inputs"].values()), indexing="ij"
    )
    expected = np.asarray(getattr(B, rec.function)(*grids, **doc["options"]), dtype=float)
    np.testing.assert_allclose(
        np.asarray(doc["value"], dtype=float), expected, rtol=F64_FEW_ULPS, atol=0
    )
