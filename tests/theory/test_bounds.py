"""Cross-cutting checks of theory.bounds: one-line validation errors, keyword checks, broadcasting.

The bounds themselves are tested one regime per file (tests/theory/test_bounds_<regime>.py) against
the independent oracles of tests/oracles_bounds.py; the registry in tests/theory/test_bounds_registry.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from theory import bounds as B

BAD_CALLS = [
    (B.sqrt_n_upper, (-1.0, 1.0, 1.0, 2)),
    (B.sqrt_n_upper, (1.0, 1.0, 1.0, 0.5)),
    (B.sqrt_n_upper, (1.0, np.nan, 1.0, 2)),
    (B.sqrt_n_lower, (-0.1, 5)),
    (B.sqrt_n_lower, (1.0, 0)),
    (B.sequence_lower, (1.0, 2.5)),
    (B.masked_sqrt_n_lower, (1.0, 2.5)),
    (B.mean_field_upper, (1.0, -1.0, 1.0)),
    (B.two_dirac_g, (0.0, 1.0)),
    (B.two_dirac_g, (1.0, 1.0)),
    (B.two_dirac_log_g, (0.0, 1.0)),
    (B.two_dirac_lower, (-1.0,)),
    (B.two_dirac_optimal_mass, (np.inf,)),
    (B.kim_softmax_lemma, (0.5,)),
    (B.kim_softmax_lemma_mean_field, (0.0,)),
    (B.radius_for_target, (1.0, 0.0)),
    (B.radius_for_target, (-1.0, 1.0)),
    (B.split_gain, (0.5, 1.0)),
    (B.split_gain_general, (2, 3.0, 2.0, 1.0)),
    (B.large_radius_limit, ([1.5], 1.0)),
    (B.released_data_dependent, (1.0, 1.0, 1.0, 0)),
]


@pytest.mark.parametrize(("fn", "args"), BAD_CALLS, ids=lambda x: getattr(x, "__name__", ""))
def test_one_line_value_errors(fn, args):
    with pytest.raises(ValueError) as info:
        fn(*args)
    assert "\n" not in str(info.value)


def test_keyword_validation():
    with pytest.raises(ValueError, match="conflicts"):
        B.sqrt_n_upper(1, 1, 1, 2, sharp=True, form="triangle")
    with pytest.raises(ValueError, match="form"):
        B.mean_field_upper(1, 1, 1, form="nope")
    with pytest.raises(ValueError, match="rule"):
        B.construction_gap(1, 0, 1, rule="nope")


def test_broadcasting_and_scalars():
    a = np.array([[0.5], [1.0], [2.0]])
    R = np.array([0.5, 1.0, 1.5, 2.0])
    assert B.sqrt_n_upper(a, 1.0, R, 10).shape == (3, 4)
    assert B.mean_field_upper(a, 1.0, R).shape == (3, 4)
    assert B.two_dirac_lower(a * R).shape == (3, 4)
    assert B.sqrt_n_lower(a, R[None, :] * 10 + 1).shape == (3, 4)
    assert B.masked_sqrt_n_lower(a, np.array([1, 5, 9, 20])).shape == (3, 4)
    assert B.split_gain(np.array([1, 2, 3])[:, None], R).shape == (3, 4)
    assert B.radius_for_target(a * 10, R).shape == (3, 4)
    assert isinstance(B.sqrt_n_upper(1.0, 1.0, 1.0, 2), np.floating)
    assert isinstance(B.two_dirac_lower(1.0), np.floating)
