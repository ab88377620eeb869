"""The certified bracket of heads with attention variants against 50-digit references.

docs/rounding.md §11.4: the streaming path's entrywise model covers QK-norm, head-space biases,
logit scales, soft-caps, windows, ALiBi and partial rotary, and certified calls on such heads
stream. The adversarial instances of tests/rigour_variants.py (pre-norm rows near 0 and tiny
``eps``, saturated caps at large radius, windows from 1 to n, ALiBi at positions up to 5000,
biases under rotary, partial rotary, the Gemma-2 and Qwen3 combinations; float64 and float32;
masses over many decades) are checked with ``lower <= exact <= upper_prob`` (exact from mpmath
at 50 digits), the width rule met where it converged, and honest convergence. A sample runs in
the default suite (240 instances, about 30 s); 1000 more behind ``slow``.
"""

from __future__ import annotations

import pytest

from tests.rigour_variants import VARIANT_KINDS, check_variant_instance, make_variant_instance

METHODS = ("lanczos", "power")
SAMPLE = list(range(240))


@pytest.mark.parametrize("seed", SAMPLE)
def test_variant_bracket_holds_against_mpmath_sample(seed):
    check_variant_instance(make_variant_instance(seed), methods=METHODS)


@pytest.mark.parametrize("seed", range(60))
def test_variant_block_upper_holds_against_mpmath_sample(seed):
    """The deterministic end on variant heads (docs/certificates.md §5.4)."""
    check_variant_instance(make_variant_instance(seed), methods=("lanczos",), upper="block")


@pytest.mark.parametrize("kind", VARIANT_KINDS)
def test_variant_bracket_holds_on_every_kind(kind):
    check_variant_instance(make_variant_instance(101, kind), methods=("lanczos",))


@pytest.mark.slow
def test_variant_bracket_holds_against_mpmath_1000_instances():
    failures = []
    for seed in range(1000, 2000):
        inst = make_variant_instance(seed)
        try:
            check_variant_instance(inst, methods=METHODS)
        except AssertionError as exc:  # collect them all, report together
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


@pytest.mark.slow
def test_variant_block_upper_holds_against_mpmath_1000_instances():
    failures = []
    for seed in range(1000, 2000):
        try:
            check_variant_instance(make_variant_instance(seed), methods=("lanczos",), upper="block")
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
