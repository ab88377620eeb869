"""The streaming path's certified bracket against 50-digit references (docs/rounding.md §11).

The adversarial instances of tests/meanfield/test_rigour.py (large logits, near ties, masses spread over
hundreds of decades, two Diracs, large values, long sequences, float32, several heads, rotary
heads), estimated with the streaming products (``path="streaming"``): ``lower <= exact``,
``exact <= upper_prob``, ``lower <= upper_prob``, no NaN and honest convergence, with the exact
value from mpmath at 50 digits. A sample runs in the default suite; the slow suite runs the
1000+ instances of the stored path's slow test.
"""

from __future__ import annotations

import math

import pytest

from meanfield.lipschitz import local_lipschitz
from meanfield.lipschitz._operators import parse_input
from tests.meanfield.test_rigour import KINDS, _torch_inputs, check_instance, make_instance
from tests.streaming_margins import width_tolerance

METHODS = ("lanczos", "power")
SAMPLE = list(range(24))


@pytest.mark.parametrize("seed", SAMPLE)
def test_streaming_bracket_holds_against_mpmath_sample(seed):
    check_instance(make_instance(seed), methods=METHODS, path="streaming")


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_bracket_holds_on_every_kind(kind):
    check_instance(make_instance(7, kind), methods=("lanczos",), path="streaming")


@pytest.mark.parametrize("seed", SAMPLE)
def test_streaming_block_upper_holds_against_mpmath_sample(seed):
    """The deterministic end of the streaming path (docs/certificates.md §5.4)."""
    check_instance(make_instance(seed), methods=("lanczos",), path="streaming", upper="block")


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_block_upper_holds_on_every_kind(kind):
    check_instance(make_instance(11, kind), methods=("lanczos",), path="streaming", upper="block")


@pytest.mark.slow
def test_streaming_block_upper_holds_against_mpmath_1000_instances():
    failures = []
    for seed in range(1000, 2050):
        try:
            inst = make_instance(seed)
            check_instance(inst, methods=("lanczos",), path="streaming", upper="block")
        except AssertionError as exc:  # collect them all, report together
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


@pytest.mark.slow
def test_streaming_bracket_holds_against_mpmath_1000_instances():
    failures = []
    for seed in range(1000, 2050):
        try:
            check_instance(make_instance(seed), methods=METHODS, path="streaming")
        except AssertionError as exc:  # collect them all, report together
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


def test_streaming_and_stored_widths_differ_by_their_margins_only():
    """On the sample, ``upper_prob / lower`` of the two paths agree within the two margins.

    Both runs make the same Krylov steps from the same seed; the ends differ only by their
    rounding margins (tests/streaming_margins.py derives the bound).
    """
    compared = 0
    for seed in range(40):
        inst = make_instance(seed)
        if inst["kind"] in ("float32", "rotary"):
            continue  # float32: the rounding of the ends to float32; rotary: first-order stored
        x, params, _ = _torch_inputs(inst)
        kw = {"geometry": inst["geometry"], "masked": inst["masked"], "method": "lanczos"}
        stored = local_lipschitz(x, params, path="stored", **kw)
        streamed = local_lipschitz(x, params, path="streaming", **kw)
        assert streamed.path == "streaming" and stored.path == "stored"
        if bool(stored.upper_prob == stored.upper):
            continue  # the stored end is its block certificate, which the streaming path lacks
        rs, rt = float(stored.ratio_prob), float(streamed.ratio_prob)
        if math.isinf(rs):
            continue
        X, lw, pos, masked = parse_input(x, inst["masked"], params)
        tol = width_tolerance(
            X, params, float(streamed.lower), masked=masked, geometry=inst["geometry"],
            log_weights=lw, positions=pos,
        )  # fmt: skip
        assert abs(rt - rs) <= tol * rs, (inst["kind"], seed, rs, rt, tol)
        compared += 1
    assert compared >= 10
