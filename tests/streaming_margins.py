"""How far the widths of the stored and streaming brackets may be apart (docs/rounding.md §11).

Both paths run the same Krylov steps from the same seed, on products equal to a few ulps, so
their ``upper_prob / lower`` differ by their rounding margins only: at most the sum of the two
margins at each end, relative to ``lower``, plus the rounding of the ratio itself. Shared by the
tests that compare the two paths, with the entrywise agreement of their products
(:func:`assert_products_agree`).
"""

from __future__ import annotations

import torch

from meanfield import _rounding as rnd
from meanfield.jacobian import jvp, linearize, linearize_streaming, streaming_jvp, vjp
from meanfield.jacobian.streaming import streaming_magnitude, streaming_vjp


def width_tolerance(X, params, low: float, *, masked=False, geometry="euclidean", **kw) -> float:
    """Relative bound on ``|ratio_streaming - ratio_stored| / ratio_stored`` at the float64 input.

    ``kw`` (``log_weights``, ``positions``, ``token_index``) go to both linearisations.
    """
    lin = linearize(X, params, masked=masked, **kw)
    slin = linearize_streaming(X, params, masked=masked, **kw)
    model_sd = rnd.error_model(lin)
    mag_sd = float(rnd.magnitude_norm_upper(rnd.magnitude_linearization(lin, model_sd), geometry))
    mlin = streaming_magnitude(slin)
    eta_st = float(rnd.streaming_error_model(mlin).eta)
    mag_st = float(rnd.streaming_magnitude_norm(mlin, geometry))
    margins = eta_st * mag_st + float(model_sd.eta) * mag_sd
    return 2 * margins / low + 64 * torch.finfo(torch.float64).eps


def assert_products_agree(lin, slin, H, G, tag=()) -> None:
    """The stored and streaming products within the sum of their two derived bounds, entrywise.

    ``|J h - J_s h| <= eta_stored |J|_mag |h| + eta_streaming M |h|`` (docs/rounding.md §3, §3.1,
    §11.2) for ``J h`` with the tangent ``H`` and ``J^T g`` with the cotangent ``G``, rotary heads
    included; ``lin`` and ``slin`` are the two linearisations of one input.
    """
    model_sd = rnd.error_model(lin)
    mag_sd = rnd.magnitude_linearization(lin, model_sd)
    mlin = streaming_magnitude(slin)
    eta_st = rnd.streaming_error_model(mlin).eta
    for prod, sprod, T in ((jvp, streaming_jvp, H), (vjp, streaming_vjp, G)):
        diff = (prod(lin, T) - sprod(slin, T)).abs()
        bound = model_sd.eta * prod(mag_sd, T.abs()) + eta_st * sprod(mlin, T.abs())
        assert bool((diff <= bound).all()), (*tag, prod.__name__)


def assert_entrywise_bound(slin, mlin, eta: float, J, seed: int, geometry: str, tag) -> None:
    """``|fl(J h) - J h| <= eta * (M |h|)`` entrywise for a seeded Gaussian ``h``, ``J`` at 50 digits.

    ``slin`` is the streaming linearisation whose product is checked, ``mlin`` the magnitude
    operator (§11.2, §11.4 or the split of §11.5) and ``J`` the mpmath Jacobian of the instance.
    """
    import mpmath as mp

    from meanfield.jacobian.streaming import streaming_jvp

    gen = torch.Generator().manual_seed(seed)
    H = torch.randn(slin.n, slin.d, generator=gen, dtype=torch.float64)
    got = streaming_jvp(slin, H, geometry=geometry).flatten()
    bound = streaming_jvp(mlin, H.abs(), geometry=geometry).flatten()
    h = mp.matrix([mp.mpf(float(t)) for t in H.flatten()])
    with mp.workdps(50):
        exact = J * h
        for i in range(len(got)):
            err = abs(mp.mpf(float(got[i])) - exact[i])
            assert err <= mp.mpf(eta) * mp.mpf(float(bound[i])), (*tag, i)
