"""Instance generators of the verification harness (experiments/verify_bounds/generation.py).

Instances are reproducible from (seed, index), and the context a generator records is the one
the attacks of meanfield would build.
"""

from __future__ import annotations

import numpy as np
import pytest

from experiments import verify_bounds as vb
from experiments.verify_bounds.generation import _construction_ctx

from ..tolerances import F64_REDUCTION, F64_ZERO


def test_instances_are_reproducible():
    a = vb.make_targets(7, 11, "two_dirac")
    b = vb.make_targets(7, 11, "two_dirac")
    assert [(t.label, t.lower, t.upper) for t in a] == [(t.label, t.lower, t.upper) for t in b]
    c = vb.make_targets(8, 11, "two_dirac")
    assert [t.upper for t in a] != [t.upper for t in c]


def test_construction_gap_from_the_input_matches_the_attack(rng):
    """The harness computes gamma from X itself; meanfield.attacks computes it from eigenpairs."""
    import torch

    from meanfield.attacks import adversarial_sequence

    for _ in range(5):
        d = int(rng.integers(1, 4))
        A, V = rng.standard_normal((d, d)), rng.standard_normal((d, d))
        con = adversarial_sequence(
            torch.from_numpy(A), 1.7, 5, variant="symmetric", V=torch.from_numpy(V)
        )
        X = con.X.numpy()
        ctx = _construction_ctx(X, X[0], X[1], A, V)
        assert ctx["gamma"] == pytest.approx(con.gamma, rel=F64_REDUCTION, abs=F64_ZERO)
        assert ctx["Vu_norm"] == pytest.approx(np.linalg.norm(V @ con.u.numpy()), rel=F64_REDUCTION)
