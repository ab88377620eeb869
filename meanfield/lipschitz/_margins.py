r"""The rounding margins of a certified estimate, known before the solver runs.

:class:`Margins` holds the error model of the computed operator (docs/rounding.md §2–§4) and
forms its magnitude norm once, when an end first needs it; :func:`width_rule` predicts from them
the certified ends the estimator forms after the run, which is how the default stopping rule
("width") reads the certificate while the solver runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .. import _rounding as _rnd
from .._typing import ProductGeometry
from ..jacobian import AttentionLinearization, StreamingLinearization
from ..jacobian.streaming import streaming_magnitude
from ._operators import Operators

#: Unit roundoff of float32, the precision a float32 solve's operator is computed in.
_U32 = 2.0**-24


class Margins:
    r"""The rounding model of one certified estimate (docs/rounding.md §2–§4).

    ``model`` is the error model of the float64 operator, ``mlin`` its magnitude linearisation
    (``None`` without analytic heads; ``smlin`` on the streaming path). ``solve_model`` is the
    model of the operator the iterative solver runs on: ``model`` itself, or for a float32 solve
    the same analysis at float32's unit roundoff (docs/rounding.md §11.3), which the
    probabilistic end of a float32 run adds (:meth:`upper_solve`). The magnitude norm :math:`\||J|_{\rm mag}\|` costs two
    magnitude products: :meth:`mag_norm` forms it once, for the ends that need it (the upper
    certificates, the width rule); the lower end uses :math:`\||J|_{\rm mag}|v|\|` from one
    product when it can (:meth:`lower`).
    """

    def __init__(self, ops: Operators, geometry: ProductGeometry) -> None:
        self.geometry = geometry
        lin64s = ops.lin64s
        self._mag_norm: Tensor | None = None
        self.mlin: AttentionLinearization | None = None  # the stored path's magnitude operator
        self.smlin = None
        if isinstance(lin64s, StreamingLinearization):
            # the streaming products: one magnitude operator, rotary rows included, and the
            # entrywise model of docs/rounding.md §11
            mlin = streaming_magnitude(lin64s)
            self.model = _rnd.streaming_error_model(mlin)
            self.solve_model = self.model
            models = [(_rnd.U64, self.model)]
            if ops.float32_solve:
                self.solve_model = _rnd.streaming_error_model(mlin, _U32)
                models.append((_U32, self.solve_model))
            # the norms use the composite of §11.5: computed rows' magnitudes, plus each kind
            # of row's own error on its chain magnitudes (hundreds of times smaller than mlin
            # where |Q||x| >> |Qx|)
            self.smlin = _rnd.streaming_magnitude_split(lin64s, mlin, models)
            return
        # the stored path's model covers plain and rotary heads only: a certified call with
        # attention variants runs on the streaming path (SolverOptions.choose_path)
        if lin64s.rope_heads and lin64s.rope_rows is None:
            raise ValueError(
                "the stored path's certified bracket models rotary heads of one width only "
                "(these differ); use path='streaming' or certify=False"
            )
        assert not isinstance(ops.lin64, StreamingLinearization)
        # rotary heads included: their rows through the bound of a rotation (docs/rounding.md §3.1)
        self.model = _rnd.error_model(ops.lin64)
        self.mlin = _rnd.magnitude_linearization(lin64s, self.model)
        self.solve_model = self.model
        if ops.float32_solve:
            model32 = _rnd.error_model(ops.lin64, _U32)
            self.solve_model = _rnd.on_magnitude_of(model32, self.model)

    def mag_norm(self) -> Tensor:
        r"""Upper bound on :math:`\||J|_{\rm mag}\|_2` (units of :math:`2^e`), formed once."""
        if self._mag_norm is None:
            if self.smlin is not None:
                self._mag_norm = _rnd.streaming_magnitude_norm(self.smlin, self.geometry)
            else:
                assert self.mlin is not None  # one of the two is always built
                self._mag_norm = _rnd.magnitude_norm_upper(self.mlin, self.geometry)
        return self._mag_norm

    def upper(self, bound: Tensor) -> Tensor:
        """A bound on the computed operator made a bound on the exact one (docs/rounding.md §4.2)."""
        return _rnd.upper_margin(self.mag_norm(), self.model, bound)

    def upper_solve(self, bound: Tensor) -> Tensor:
        """:meth:`upper` for a bound on the solver's operator (float32's model for a float32 run)."""
        return _rnd.upper_margin(self.mag_norm(), self.solve_model, bound)

    def lower(self, s_prod: Tensor, v: Tensor, n_out: int) -> Tensor:
        r"""Certified lower end from ``s_prod`` :math:`=\|\widehat{Jv}\|` (docs/rounding.md §4.1)."""
        if self.smlin is not None:
            mag_v = _rnd.streaming_magnitude_vector_norm(self.smlin, v, self.geometry)
        else:
            assert self.mlin is not None
            mag_v = _rnd.magnitude_vector_norm(self.mlin, v, self.geometry)
        # the norm where it is already formed, else inf: the lower end then uses the product
        # with |v| alone (one product instead of the norm's two)
        mag = self._mag_norm
        if mag is None:
            mag = torch.full_like(self.model.eta, math.inf)
        return _rnd.lower_from_product(s_prod, v, mag, self.model, n_out, mag_v)


def width_rule(
    width: float,
    margin: float,
    margins: Margins,
    n_out: int,
    n_in: int,
    shift: int,
    *,
    float32_solve: bool,
) -> tuple[
    Callable[[Tensor, Tensor], Tensor],
    Callable[[Tensor], Tensor],
    Tensor,
    Callable[[Tensor, Tensor], Tensor],
]:
    r"""The width rule's tests on the solver's Ritz value ``sigma`` and bound (solver units).

    They predict the certified ends exactly as the estimator forms them after the run
    (:func:`~meanfield._rounding.upper_margin`, :func:`~meanfield._rounding.lower_from_norm`),
    from the magnitude norm and error model of ``margins``, known before it, with the Ritz value
    for :math:`\|Jv\|` (lowered by the Krylov margin for a float32 solve, whose vector is
    measured again in float64). ``shift`` is ``e_solve - e`` (docs/rounding.md §5). The upper
    end adds the error model of the solver's operator, ``margins.solve_model`` (float32's for a
    float32 solve, docs/rounding.md §11.3). Returns
    ``accept(sigma, bound)``, ``reachable(sigma)`` (whether a perfect Krylov bound, the Ritz
    value times ``1 + margin``, would be accepted), whether the relative margins alone leave
    room for the width (a tensor of the batch shape), and ``ratio(sigma, bound)``, the
    predicted ``upper_prob / lower`` that ``accept`` compares with the width (for progress
    lines).
    """
    mag_norm, model, up_model = margins.mag_norm(), margins.model, margins.solve_model
    shrink = 1.0 - margin if float32_solve else 1.0

    def ends(sigma: Tensor, bound: Tensor, mag: Tensor) -> tuple[Tensor, Tensor]:
        s = _rnd.unscale(sigma.to(torch.float64), shift) * shrink
        up = _rnd.upper_margin(mag, up_model, _rnd.unscale(bound.to(torch.float64), shift))
        lo = _rnd.lower_from_norm(s, torch.ones_like(s), n_in, mag, model, n_out)
        return up, lo

    def accept(sigma: Tensor, bound: Tensor) -> Tensor:
        up, lo = ends(sigma, bound, mag_norm)
        return up <= width * lo

    def ratio(sigma: Tensor, bound: Tensor) -> Tensor:
        up, lo = ends(sigma, bound, mag_norm)
        return up / lo

    def reachable(sigma: Tensor) -> Tensor:
        return accept(sigma, sigma.to(torch.float64) * (1 + margin))

    one = torch.ones_like(mag_norm)
    up, lo = ends(one, one * (1 + margin), torch.zeros_like(mag_norm))
    return accept, reachable, up <= width * lo, ratio
