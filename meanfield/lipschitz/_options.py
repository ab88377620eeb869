r"""The options of :func:`~meanfield.lipschitz.local_lipschitz` as objects that check themselves.

Each option object is a frozen dataclass whose ``__post_init__`` rejects what the estimator
cannot run, with the one-line error :func:`~meanfield.lipschitz.local_lipschitz` documents, so
an invalid combination cannot be constructed:

* :class:`SolverOptions`: how the top singular value is computed (method, residual tolerance,
  iteration caps, start vector, random source);
* :class:`CertificateOptions`: which certificate is built around it (upper end, probabilistic
  end, width rule), or none (``certify=False``);
* :class:`EstimateOptions`: the two together with the geometry, and what only the pair can
  check (the width rule needs the random start).

:meth:`EstimateOptions.resolve` turns them into a :class:`Plan` at one linearisation: ``"auto"``
choices made for its size, the stopping rule fixed (docstring of
:func:`~meanfield.lipschitz.local_lipschitz`, "Stopping rules").
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .._numerics import as_float_tensor, check_finite
from .._typing import Geometry, Method, ProductGeometry, UpperMethod
from ..jacobian import AttentionLinearization, StreamingLinearization

#: ``method="auto"`` assembles the Jacobian when ``n * d`` is at most this.
DENSE_AUTO_MAX = 1500
#: Residual tolerance of the residual rule when ``tol`` is not given.
DEFAULT_TOL = 1e-6
#: Width ``upper_prob / lower <= 1 + DEFAULT_PROB_RTOL`` of the default call's stopping rule.
DEFAULT_PROB_RTOL = 0.05

#: Bytes the stored attention matrices of one call may take before ``path="auto"`` streams.
DEFAULT_MEMORY_BUDGET = 2**30

Start = Tensor | Literal["kronecker"] | None
PathChoice = Literal["auto", "stored", "streaming"]


def stored_bytes(
    n: int, heads: int, batch: int, dtype: torch.dtype, *, certify: bool, weighted: bool
) -> int:
    r"""Bytes of the :math:`n\times n` matrices the stored path keeps (the rule of ``path="auto"``).

    A fixed count, never the memory free at the moment: per head and batch element one
    :math:`n\times n` attention matrix in the input's dtype, one more for :math:`\tilde P` of a
    weighted measure, their float64 copies where a certified call on float32 inputs makes them,
    and a factor 2 for the temporaries of a product.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_entry = itemsize + (8 if certify and itemsize != 8 else 0)
    return 2 * batch * heads * n * n * per_entry * (2 if weighted else 1)


def check_one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """One-line ``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        names = ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}"
        raise ValueError(f"{name} must be {names}, got {value!r}")


@dataclass(frozen=True)
class SolverOptions:
    """How the top singular value is computed (parameters of ``local_lipschitz``).

    Checks ``method``, that ``tol`` is a positive finite number or ``None``, that ``max_iter``
    (or ``None``) and ``krylov_dim`` are positive integers, and that a string ``start`` is
    ``"kronecker"``; a tensor ``start`` is checked against the input by
    :meth:`at_input`.
    """

    method: Method = "auto"
    tol: float | None = None
    max_iter: int | None = None
    krylov_dim: int = 32
    start: Start = None
    seed: int | None = 0
    path: PathChoice = "auto"
    memory_budget: int = DEFAULT_MEMORY_BUDGET

    def __post_init__(self) -> None:
        check_one_of("method", self.method, ("auto", "dense", "lanczos", "power"))
        check_one_of("path", self.path, ("auto", "stored", "streaming"))
        budget = self.memory_budget
        if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1:
            raise ValueError(f"memory_budget must be a positive number of bytes, got {budget!r}")
        if self.path == "streaming":
            if self.method == "dense":
                raise ValueError(
                    "method='dense' assembles the Jacobian: it needs path='stored' (or 'auto')"
                )
            if isinstance(self.start, str):
                raise ValueError("start='kronecker' needs path='stored' (or 'auto')")
        tol = self.tol
        if tol is not None and not (isinstance(tol, (int, float)) and 0 < tol < math.inf):
            raise ValueError(f"tol must be a positive number, got {tol!r}")
        if isinstance(self.start, str) and self.start != "kronecker":
            raise ValueError(f"start must be a tensor or 'kronecker', got {self.start!r}")
        for name, value in (("max_iter", self.max_iter), ("krylov_dim", self.krylov_dim)):
            if value is None and name == "max_iter":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def choose_path(
        self,
        n: int,
        heads: int,
        batch: int,
        dtype: torch.dtype,
        *,
        certify: bool,
        weighted: bool,
        needs_stored: bool,
        variants: tuple[str, ...] = (),
    ) -> Literal["stored", "streaming"]:
        """The path of the call: ``path`` itself, or for ``"auto"`` the fixed rule.

        ``"auto"`` keeps the stored matrices when :func:`stored_bytes` fits ``memory_budget``
        or the call asks for what only the stored path has (``needs_stored``: the dense
        method, the split geometry, the Kronecker start, a Gram upper certificate),
        and streams otherwise. A certified call on heads with attention ``variants`` (their
        names) streams whatever the budget: the rounding analysis of the variants is the
        streaming one (docs/rounding.md §11.4); ``path="stored"`` or an option only the stored
        path has is then a one-line ``ValueError``.
        """
        if certify and variants:  # the rounding analysis of variants is the streaming one
            named = ", ".join(variants)
            if self.path == "stored":
                raise ValueError(
                    f"the stored path's certified bracket does not model {named}; use "
                    "path='streaming' or 'auto' (docs/rounding.md §11.4), or certify=False"
                )
            if needs_stored:
                raise ValueError(
                    f"a certified bracket with {named} runs on the streaming products, which have "
                    "no dense method, Gram certificate, split geometry or Kronecker start; drop "
                    "that option or pass certify=False"
                )
            return "streaming"
        if self.path != "auto":
            return self.path
        size = stored_bytes(n, heads, batch, dtype, certify=certify, weighted=weighted)
        return "stored" if needs_stored or size <= self.memory_budget else "streaming"

    def at_input(self, X: Tensor) -> SolverOptions:
        """These options with a tensor ``start`` checked against the points ``X``.

        The start is cast to their dtype and device; another shape or non-finite entries are
        a one-line ``ValueError``.
        """
        if self.start is None or isinstance(self.start, str):
            return self
        start = as_float_tensor(self.start, "start", like=X)
        if start.shape != X.shape:
            raise ValueError(
                f"start must have the shape of x, {tuple(X.shape)}, got {tuple(start.shape)}"
            )
        check_finite(start, "start")
        return dataclasses.replace(self, start=start)


@dataclass(frozen=True)
class CertificateOptions:
    """Which certificate is built around the estimate (parameters of ``local_lipschitz``).

    Checks ``upper``, that ``delta`` is in (0, 1) or ``None``, that ``prob_rtol`` is a positive
    finite number, ``"auto"`` or ``None``,
    and, with ``certify=False`` (no certificate), that neither ``upper`` nor ``prob_rtol`` asks
    for one.
    """

    upper: UpperMethod = "auto"
    delta: float | None = 1e-6
    prob_rtol: float | Literal["auto"] | None = "auto"
    certify: bool = True

    def __post_init__(self) -> None:
        check_one_of("upper", self.upper, ("auto", "gram", "block", "none"))
        delta = self.delta
        if delta is not None and not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise ValueError(f"delta must be in (0, 1) or None, got {delta!r}")
        rtol = self.prob_rtol
        bad_str = isinstance(rtol, str) and rtol != "auto"
        if bad_str or (
            self.explicit_rtol and not (isinstance(rtol, (int, float)) and 0 < rtol < math.inf)
        ):
            raise ValueError(f"prob_rtol must be a positive number, 'auto' or None, got {rtol!r}")
        if not self.certify:
            if self.upper not in ("auto", "none"):
                raise ValueError(f"upper={self.upper!r} is a certificate: it needs certify=True")
            if self.explicit_rtol:
                raise ValueError("prob_rtol runs until a certificate holds: it needs certify=True")

    @property
    def explicit_rtol(self) -> bool:
        """Whether a width was asked for by number (not ``"auto"`` or ``None``)."""
        return self.prob_rtol is not None and not isinstance(self.prob_rtol, str)


@dataclass(frozen=True)
class EstimateOptions:
    """The geometry, the solver and the certificate of one call.

    Checks the geometry, and that a number ``prob_rtol`` comes with the random start.
    """

    geometry: Geometry
    solver: SolverOptions
    certificate: CertificateOptions

    def __post_init__(self) -> None:
        check_one_of("geometry", self.geometry, ("euclidean", "wasserstein", "split"))
        if self.certificate.explicit_rtol and self.solver.start is not None:
            raise ValueError("prob_rtol needs the random start; drop start or prob_rtol")
        if self.solver.path == "streaming":
            if self.geometry == "split":
                raise ValueError("geometry='split' needs path='stored' (or 'auto')")
            if self.certificate.upper == "gram":
                raise ValueError(
                    "upper='gram' needs the assembled Jacobian: path='stored' (or 'auto'); the "
                    "streaming path has upper='block' (docs/certificates.md §5.4)"
                )

    @property
    def needs_stored(self) -> bool:
        """Whether the call asks for what only the stored path computes."""
        return (
            self.solver.method == "dense"
            or self.geometry == "split"
            or isinstance(self.solver.start, str)
            or self.certificate.upper == "gram"
        )

    def resolve(self, lin: AttentionLinearization | StreamingLinearization) -> Plan:
        """The plan at the linearisation ``lin``: ``"auto"`` resolved, the stopping rule chosen.

        ``NotImplementedError`` for ``geometry="split"`` with rotary heads. On the streaming
        path ``method="auto"`` is Lanczos and ``upper="auto"`` is ``"none"`` (the default bracket
        is ``lower`` and ``upper_prob``; ``upper="block"`` adds the streamed structured bound,
        docs/certificates.md §5.4).
        """
        streaming = isinstance(lin, StreamingLinearization)
        if self.geometry == "split" and lin.rope_heads:
            raise NotImplementedError(
                "geometry='split' is not available for heads with a rotary embedding or "
                "another attention variant (QK-norm, soft-cap, window, ALiBi, head biases)"
            )
        solver, cert = self.solver, self.certificate
        method = solver.method
        if method == "auto":
            method = "dense" if lin.n * lin.d <= DENSE_AUTO_MAX and not streaming else "lanczos"
        upper = cert.upper
        if upper == "auto":
            upper = "gram" if method == "dense" else "none" if streaming else "block"
        delta = cert.delta
        if not cert.certify:
            upper, delta = "none", None
        # the stopping rule (docstring, "Stopping rules"): the certified width where it applies
        width_applies = (
            method == "lanczos" and cert.certify and delta is not None and solver.start is None
        )
        rtol: float | None = None
        if width_applies and (
            cert.explicit_rtol or (solver.tol is None and cert.prob_rtol == "auto")
        ):
            prob_rtol = cert.prob_rtol
            rtol = float(prob_rtol) if isinstance(prob_rtol, (int, float)) else DEFAULT_PROB_RTOL
        return Plan(
            geometry=self.geometry,
            method=method,
            upper=upper,
            certify=cert.certify,
            delta=delta,
            rtol=rtol,
            solver=solver,
            path="streaming" if streaming else "stored",
        )


@dataclass(frozen=True)
class Plan:
    """The options resolved at one input: what :func:`solve` runs and ``certify`` builds.

    ``method`` and ``upper`` are resolved (no ``"auto"``); ``delta`` is ``None`` where no
    probabilistic end is formed (``certify=False`` included); ``rtol`` is the width rule's
    ``prob_rtol`` where the call stops on the width, else ``None``. Checks that ``upper="gram"``
    comes with the dense method.
    """

    geometry: Geometry
    method: Literal["dense", "lanczos", "power"]
    upper: Literal["gram", "block", "none"]
    certify: bool
    delta: float | None
    rtol: float | None
    solver: SolverOptions
    path: Literal["stored", "streaming"] = "stored"

    def __post_init__(self) -> None:
        if self.upper == "gram" and self.method != "dense":
            raise ValueError("upper='gram' needs the assembled Jacobian: use method='dense'")

    @property
    def op_geometry(self) -> ProductGeometry:
        """The geometry of the Jacobian products (``"split"`` runs on the Wasserstein one)."""
        return "euclidean" if self.geometry == "euclidean" else "wasserstein"

    @property
    def tol(self) -> float:
        """The residual tolerance (:data:`DEFAULT_TOL` when ``tol`` was not given)."""
        return DEFAULT_TOL if self.solver.tol is None else float(self.solver.tol)

    @property
    def tol_given(self) -> bool:
        """Whether ``tol`` was given (the residual rule is then required too)."""
        return self.solver.tol is not None

    @property
    def width(self) -> float | None:
        """The requested width ``1 + prob_rtol`` of ``upper_prob / lower``, or ``None``."""
        return None if self.rtol is None else 1.0 + self.rtol
