"""Deliberately wrong bounds, to check that the verification harness catches them."""

from __future__ import annotations

from experiments import verify_bounds as vb


def upper_half_trivial(t: vb.Target) -> float | None:
    """Deliberately wrong 'upper bound' ||V_eff||/2 at equal tokens (the exact value is ||V_eff||
    unmasked, and at least that masked)."""
    if t.ctx.get("construction") != "equal_tokens":
        return None
    return 0.5 * t.ctx["V_eff_norm"]


def lower_twice_construction(t: vb.Target) -> float | None:
    """Deliberately wrong 'lower bound': twice the eigenvector-construction value."""
    if t.ctx.get("construction") != "one_token" or t.ctx["masked"]:
        return None
    from theory import bounds

    return 2.0 * float(bounds.sqrt_n_lower(t.ctx["gamma"], t.ctx["n"], t.ctx["Vu_norm"]))


WRONG_UPPER = vb.BoundSpec("wrong_upper", "upper", "theorem", "test", upper_half_trivial)
WRONG_LOWER = vb.BoundSpec("wrong_lower", "lower", "theorem", "test", lower_twice_construction)
