r"""The upper bounds drawn against the measured constants of the ``bounded_logits`` stage.

Plain form: the paper's √n-regime bound in our triangle form, per head,
:math:`\|V_h\|_2(\sqrt n(1+\theta_h)+\theta_h)` with :math:`\theta_h = \|A_h\|_2R^2`
(:func:`theory.bounds.sqrt_n_upper`, ``form="triangle"``, docs/theory.md §1; it holds verbatim
for causal attention), summed over the heads with the norms of their ``W_O`` blocks
(:func:`theory.bounds.multihead_upper`). It grows like :math:`R^2`.

The other forms: the bounded-logit bounds of ``theory/bounds/bounded_logits.py``
(docs/theory.md §18, derived and checked numerically there), plugged in by
:func:`variant_bound`, the one place where they enter the stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["form_bound", "plain_bound", "variant_bound"]


def plain_bound(heads: Sequence[Mapping[str, float]], R: float, n: int) -> float:
    """The multi-head √n-regime bound (triangle form) of the plain layer at radius ``R``."""
    from theory.bounds import multihead_upper, sqrt_n_upper

    per_head = [float(sqrt_n_upper(h["A"], h["V"], R, n, form="triangle")) for h in heads]
    return float(multihead_upper(per_head, W_norms=[h["W"] for h in heads]))


def variant_bound(
    form: str, heads: Sequence[Mapping[str, float]], R: float, cfg: Mapping[str, Any]
) -> tuple[float, str] | None:
    """The derived bound of a bounded-logit form at ``R``, with its label; ``None``: none drawn.

    The one place where ``theory/bounds/bounded_logits.py`` enters the stage. Per head, summed
    with the norms of the ``W_O`` blocks (:func:`theory.bounds.multihead_upper`), causal:

    - ``"qk_norm"``: :func:`~theory.bounds.bounded_logits.qk_norm_sqrt_n_upper` with the
      unscaled factors' norms, RMSNorm weights 1 (``weight_max = 1``), ``eps = rms_eps``, the
      head width and the logit scale 1/√k; it grows linearly in R, with a slope in 1/√eps;
    - ``"softcap"``: :func:`~theory.bounds.bounded_logits.softcap_sqrt_n_upper` at κ; it grows
      like R²;
    - ``"window"``: :func:`~theory.bounds.bounded_logits.window_sqrt_n_upper` (the triangle
      √n-regime bound with n replaced by min(n, W)); it grows like R².
    """
    from theory.bounds import (
        multihead_upper,
        qk_norm_sqrt_n_upper,
        softcap_sqrt_n_upper,
        window_sqrt_n_upper,
    )

    n = int(cfg["n"])
    k = int(cfg["layer"]["head_dim"])
    per_head: list[float]
    if form == "qk_norm":
        eps = float(cfg["rms_eps"])
        if eps <= 0:
            return None  # the bound needs eps > 0 (its slope is 1/sqrt(eps))
        per_head = [
            float(
                qk_norm_sqrt_n_upper(
                    h["Q"], h["K"], h["V"], R, n, eps, k, scale=1.0 / math.sqrt(k), masked=True
                )
            )
            for h in heads
        ]
        label = "QK-norm bound (bounded logits, slope in 1/√ε)"
    elif form == "softcap":
        kappa = float(cfg["softcap"])
        per_head = [
            float(softcap_sqrt_n_upper(h["A"], h["V"], R, n, kappa, masked=True)) for h in heads
        ]
        label = "soft-cap bound (bounded logits)"
    elif form == "window":
        W = int(cfg["window"])
        per_head = [float(window_sqrt_n_upper(h["A"], h["V"], R, n, W, masked=True)) for h in heads]
        label = "√n-regime bound with n replaced by min(n, W)"
    else:
        return None
    return float(multihead_upper(per_head, W_norms=[h["W"] for h in heads])), label


def form_bound(
    form: str, heads: Sequence[Mapping[str, float]], R: float, cfg: Mapping[str, Any]
) -> dict[str, Any]:
    """The bound drawn for ``form`` at ``R``: ``{"value", "label", "source"}`` (``None``: none)."""
    if form == "plain":
        return {
            "value": plain_bound(heads, R, int(cfg["n"])),
            "label": "√n-regime bound (triangle form), summed over heads",
            "source": "theory.bounds.sqrt_n_upper + multihead_upper",
        }
    got = variant_bound(form, heads, R, cfg)
    if got is None or not math.isfinite(got[0]):
        return {"value": None, "label": "", "source": None}
    return {"value": float(got[0]), "label": got[1], "source": "theory.bounds.bounded_logits"}
