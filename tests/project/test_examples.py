"""The scripts of examples/ run as a user runs them, and the facts they print hold.

Each script runs in a fresh interpreter (``sys.executable``) from an empty temporary directory,
with a timeout, ``MPLBACKEND=Agg`` and one torch thread; the test parses the numbers it prints
and checks a property each (a certified bracket is ordered, an identity holds to rounding, a
derived bound equals its closed form). Every script of examples/ must have a check here and a
line in examples/README.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..tolerances import F64_ZERO, GRID_MAX, PRINTED_4_DIGITS_SUM, PRINTED_12_DECIMALS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"


def _run(script: str, cwd: Path, *args: str) -> str:
    path = EXAMPLES / script
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{script} printed nothing"
    return proc.stdout


def _num(pattern: str, text: str) -> list[float]:
    m = re.search(pattern.replace("NUM", NUM), text)
    assert m is not None, f"{pattern!r} not in:\n{text}"
    return [float(v) for v in m.groups()]


def test_own_model_layer(tmp_path):
    pytest.importorskip("transformers")
    out = _run("own_model_layer.py", tmp_path)
    assert "causal = True" in out
    (value,) = _num(r"estimate\s+\|\|Df\(X\)\|\|_2 = NUM", out)
    lower, upper = _num(r"certified\s+lower = NUM, upper = NUM", out)
    (prob,) = _num(r"upper_prob\s+NUM", out)
    assert 0 < lower <= value <= prob <= upper < float("inf")


def test_measure_attention(tmp_path):
    out = _run("measure_attention.py", tmp_path, str(tmp_path))
    (w2,) = _num(r"W2\(mu, F\(mu\)\) = NUM", out)
    assert w2 > 0
    gaps = [float(g) for g in re.findall(r"max \|F\(m\(X\)\) - f\(X\)\| = " + NUM, out)]
    assert len(gaps) == 2 and max(gaps) < F64_ZERO  # F(m(X)) = m(f(X)), unmasked and masked
    (value,) = _num(r"Lip\(F at mu, W2\) = NUM", out)
    lower, upper = _num(r"certified bracket \[NUM, NUM\]", out)
    assert 0 < lower <= value <= upper < float("inf")
    png = tmp_path / "measure_attention.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_symbolic_bound(tmp_path):
    out = _run("symbolic_bound.py", tmp_path)
    assert "LambertW" in out and "step 4:" in out
    rows = re.findall(rf"N = \s*(\d+): derived {NUM}\s+grid max {NUM}\s+theory.bounds {NUM}", out)
    assert len(rows) == 4, out
    for n, derived, brute, stated in ((int(r[0]), *map(float, r[1:])) for r in rows):
        # sympy's result = the closed form
        assert derived == pytest.approx(stated, rel=PRINTED_12_DECIMALS), n
        # the maximum over a grid is below the true maximum, and close to it
        assert derived * (1 - GRID_MAX) <= brute <= derived * (1 + PRINTED_12_DECIMALS), n


def test_worst_case_measure(tmp_path):
    out = _run("worst_case_measure.py", tmp_path)
    (g,) = _num(r"closed-form lower bound g\(eps\*\) = NUM", out)
    (at_two_dirac,) = _num(r"local constant at the two Diracs: NUM", out)
    value, lower, upper = _num(r"worst case found: NUM, certified bracket \[NUM, NUM\]", out)
    (proved,) = _num(r"proved upper bound over all measures in B_R: NUM", out)
    masses = [float(m) for m in re.findall(r"with mass " + NUM, out)]
    assert len(masses) == 2 and sum(masses) == pytest.approx(1, abs=PRINTED_4_DIGITS_SUM)
    assert 0 < g <= at_two_dirac * (1 + 1e-9)  # g is a directional rate at that measure
    assert lower <= value <= upper
    assert at_two_dirac <= value * (1 + 1e-9)  # the search starts from the construction
    assert upper <= proved


def test_every_example_is_tested_and_listed():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    tested = {
        name[len("test_") :] + ".py"
        for name, obj in globals().items()
        if name.startswith("test_") and callable(obj)
    }
    assert scripts and set(scripts) <= tested, sorted(set(scripts) - tested)
    listing = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    assert all(f"`{s}`" in listing for s in scripts)
