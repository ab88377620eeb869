"""How far the widths of the stored and streaming brackets may be apart (docs/rounding.md §11).

Both paths run the same Krylov steps from the same seed, on products equal to a few ulps, so
their ``upper_prob / lower`` differ by their rounding margins only: at most the sum of the two
margins at each end, relative to ``lower``, plus the rounding of the ratio itself. Shared by the
tests that compare the two paths.
"""

from __future__ import annotations

import torch

from meanfield import _rounding as rnd
from meanfield.jacobian import linearize, linearize_streaming
from meanfield.jacobian.streaming import streaming_magnitude


def width_tolerance(X, params, low: float, *, masked=False, geometry="euclidean", **kw) -> float:
    """Relative bound on ``|ratio_streaming - ratio_stored| / ratio_stored`` at the float64 input.

    ``kw`` (``log_weights``, ``positions``, ``token_index``) go to both linearisations.
    """
    lin = linearize(X, params, masked=masked, **kw)
    slin = linearize_streaming(X, params, masked=masked, **kw)
    model_sd = rnd.error_model(lin)
    mag_sd = 0.0
    if lin.analytic_heads:
        mlin_sd = rnd.magnitude_linearization(lin, model_sd)
        mag_sd = float(rnd.magnitude_norm_upper(mlin_sd, geometry))
    mlin = streaming_magnitude(slin)
    eta_st = float(rnd.streaming_error_model(mlin).eta)
    mag_st = float(rnd.streaming_magnitude_norm(mlin, geometry))
    rope = bool(lin.rope_heads)  # the stored path's first-order relative term (§6)
    margins = eta_st * mag_st + float(model_sd.eta) * (mag_sd + 8 * rope * low)
    return 2 * margins / low + 64 * torch.finfo(torch.float64).eps
