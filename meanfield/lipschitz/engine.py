r"""The certified local Lipschitz estimator of attention: :func:`local_lipschitz`.

At a sequence or a weighted atomic measure, in the Euclidean, Wasserstein or mass-splitting
geometry, it returns a :class:`LipschitzEstimate` whose bracket ``lower <= exact <= upper``
includes the rounding margin. The geometries, the bracket and the margin are described in the
package docstring (:mod:`meanfield.lipschitz`).

The module is a little over 800 lines on purpose: :func:`local_lipschitz` and the private steps
it runs in order (input parsing, the float32/float64 solver choice, the self term, the upper
certificate) read best as one page; the products, solvers and certificates it calls have their
own modules.
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from .. import _rounding as _rnd
from .._certificates import golub_kahan_certified, krylov_rounding_margin, probabilistic_upper
from .._numerics import as_float_tensor, check_finite, iter_chunks
from .._spectral import (
    SpectralResult,
    collatz_wielandt_bound,
    spectral_norm_upper,
    top_singular_value,
)
from .._typing import Geometry, Method, Params, UpperMethod
from .._validation import check_flag, check_measure, check_points, params_dtype_device
from ..jacobian import (
    AttentionLinearization,
    _dense_from_lin,
    _self_blocks,
    block_norm_bounds,
    head_structured_upper,
    jvp,
    linearize,
    self_jvp,
    self_norm_trace_bound,
    self_vjp,
    structured_block_norms,
    vjp,
)
from ..measures import DiracMeasure
from ..params import AttentionParams, MultiHeadParams
from .starts import kronecker_start

#: ``method="auto"`` assembles the Jacobian when ``n * d`` is at most this.
DENSE_AUTO_MAX = 1500
#: Residual tolerance of the residual rule when ``tol`` is not given.
DEFAULT_TOL = 1e-6
#: Width ``upper_prob / lower <= 1 + DEFAULT_PROB_RTOL`` of the default call's stopping rule.
DEFAULT_PROB_RTOL = 0.05
#: Relative margin covering the closed-form rank-one norms (square-root cancellation, ~1e-8).
_BLOCK_RTOL = 1e-6
#: Per-atom self-Jacobians are formed explicitly below this many flops (n * d_out * d * min).
_EXPLICIT_SELF_FLOPS = 2e9
#: Entries of explicit self-Jacobian blocks held at once (atoms are processed in chunks).
_EXPLICIT_SELF_ENTRIES = 2**22
#: Gram steps run on a dense Jacobian before certification of the SVD value.
_DENSE_GRAM_STEPS = 8

_U64 = torch.finfo(torch.float64).eps / 2


@dataclass(frozen=True, eq=False)
class LipschitzEstimate:
    r"""A local Lipschitz constant with its certified bracket.

    Tensor fields have the batch shape of the input (``()`` for one input).

    Attributes
    ----------
    value : Tensor
        Best estimate (dense: the top singular value; iterative: the final Ritz value).
    lower, upper : Tensor
        Certified bracket ``lower <= exact <= upper`` for the inputs as stored, rounding included
        (docs/rounding.md §4; rotary heads and ``geometry="split"`` use the first-order relative
        margin of docs/rounding.md §6); ``upper = +inf`` when no certificate is available
        (``upper="none"``, rotary heads in the weighted Wasserstein geometry, or
        :func:`local_lipschitz_fn` without ``method="dense"``) or when the constant exceeds
        float64's range (docs/rounding.md §5). Never NaN, and ``lower <= upper``. With
        ``certify=False`` the trivial bracket ``lower = 0``, ``upper = +inf``.
    converged : Tensor of bool
        Whether the stopping rule (``stop_rule``) was met. ``"residual"``: the returned vector
        meets :math:`\|J^\top Jv-\sigma^2v\|\le\mathrm{tol}\,\sigma^2` (explicit products;
        docs/rounding.md §7). ``"width"``: the returned bracket meets
        ``upper_prob <= width * lower`` (and the residual rule too when ``tol`` was given), or,
        where that width is unreachable (``width_reachable`` false), the residual rule holds. A
        certified float32 solve is re-checked on the float64 operator. How far the computed
        operator may be from the exact one is what the bracket accounts for. Always true for
        ``"dense"`` unless the assembled Jacobian was not finite.
    n_iter, n_matvec : Tensor of int64
        Solver iterations and products with :math:`J` or :math:`J^\top` (0 for ``"dense"``).
    residual : Tensor
        :math:`\|J^\top Jv - \sigma^2v\|` for the returned vector.
    method : str
        ``"dense"``, ``"lanczos"`` or ``"power"`` (the resolved method).
    geometry : str
    upper_method : str
        ``"gram"``, ``"block"`` or ``"none"``.
    vector : Tensor or None, shape (..., n, d)
        Unit top right singular vector estimate of the operator of ``geometry`` (for ``"split"``,
        of the Wasserstein operator).
    history : Tensor or None, shape (n_steps, ...)
        Estimates after each iteration (``None`` for ``"dense"``).
    self_value : Tensor or None
        ``geometry="split"`` only: :math:`\max_i\|S_i\|_2`, the splitting term.
    upper_prob : Tensor or None
        Probabilistic upper bound: ``exact <= upper_prob`` with probability at least
        ``confidence`` over the random start vector of the Lanczos run (Kuczyński–Woźniakowski
        bound, docs/certificates.md). Never above ``upper``. ``None`` when ``delta=None`` or
        ``certify=False``; for ``"dense"``, ``"power"`` and a chosen ``start`` it equals
        ``upper``.
    confidence : float or None
        :math:`1-\delta` of ``upper_prob``.
    stop_rule : str
        How the iteration stopped: ``"width"`` (the certified bracket ``[lower, upper_prob]``
        reached the requested width), ``"residual"`` (the residual rule of ``tol``) or
        ``"dense"`` (no iteration). See :func:`local_lipschitz`, "Stopping rules".
    width : float or None
        The requested width ``1 + prob_rtol`` of ``upper_prob / lower``; ``None`` when the call
        asked for none (the residual rule by choice).
    width_reachable : Tensor of bool or None
        Where a width was requested: whether it can be reached at all at this input and
        precision (false where the rounding margins alone are wider, e.g. float32 at large n;
        such elements stopped on the residual rule instead, and where none can reach it
        ``stop_rule`` is ``"residual"``).
    """

    value: Tensor
    lower: Tensor
    upper: Tensor
    converged: Tensor
    n_iter: Tensor
    n_matvec: Tensor
    residual: Tensor
    method: str
    geometry: str
    upper_method: str
    vector: Tensor | None = None
    history: Tensor | None = None
    self_value: Tensor | None = None
    upper_prob: Tensor | None = None
    confidence: float | None = None
    stop_rule: str = "residual"
    width: float | None = None
    width_reachable: Tensor | None = None

    @property
    def ratio(self) -> Tensor:
        """Bracket tightness ``upper / lower``."""
        return self.upper / self.lower

    @property
    def ratio_prob(self) -> Tensor | None:
        """Probabilistic bracket tightness ``upper_prob / lower`` (``None`` without one)."""
        return None if self.upper_prob is None else self.upper_prob / self.lower

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the estimate to one ``.safetensors`` file; :meth:`load` reads it back.

        Every tensor field is stored as a tensor of the file, on the CPU, with its dtype and
        shape (0-d and bool tensors included), bit for bit; the other fields (strings, floats,
        and which optional fields are ``None``) go as JSON into the file's metadata header. The
        file is a standard safetensors file: any safetensors reader opens it, and reading it
        never unpickles anything. Needs the ``safetensors`` package (``pip install safetensors``,
        or the ``hf`` extra).

        Parameters
        ----------
        path : str or os.PathLike
            Destination (conventionally ending in ``.safetensors``); overwritten if present.

        Returns
        -------
        pathlib.Path
        """
        import dataclasses
        import json

        from .. import __version__

        save_file = LipschitzEstimate._safetensors("save")[1]
        tensors: dict[str, Tensor] = {}
        other: dict[str, object] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                # a private contiguous CPU copy: safetensors refuses tensors that share storage
                tensors[f.name] = v.detach().to("cpu", copy=True).contiguous()
            else:
                other[f.name] = v
        meta = {
            "format": "meanfield.LipschitzEstimate",
            "format_version": "1",
            "meanfield_version": __version__,
            "fields": json.dumps(other),
        }
        path = Path(path)
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, device: str | torch.device = "cpu"
    ) -> LipschitzEstimate:
        """Read an estimate written by :meth:`save`.

        Every field comes back as saved: tensors with their dtype and shape, bit for bit (on
        ``device``, the CPU by default), ``None`` fields as ``None``.

        Parameters
        ----------
        path : str or os.PathLike
        device : str or torch.device, default "cpu"
            Where the tensors are placed.

        Returns
        -------
        LipschitzEstimate

        Raises
        ------
        ValueError
            One line, when ``path`` is not a file written by :meth:`save`.
        """
        import dataclasses
        import json

        safe_open = LipschitzEstimate._safetensors("load")[0]
        device = torch.device(device)
        what = f"{path} is not a LipschitzEstimate written by LipschitzEstimate.save"
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except OSError:
            raise
        except Exception as err:  # safetensors' own error: not a file of that format
            raise ValueError(f"{what} ({str(err).splitlines()[0]})") from err
        with handle as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != "meanfield.LipschitzEstimate":
                raise ValueError(f"{what} (no meanfield header)")
            if meta.get("format_version") != "1":
                raise ValueError(f"{what} (format version {meta.get('format_version')!r})")
            tensors = {k: fh.get_tensor(k).to(device) for k in fh.keys()}
        try:
            other = json.loads(meta.get("fields", ""))
        except json.JSONDecodeError as err:
            raise ValueError(f"{what} (malformed field header)") from err
        if not isinstance(other, dict):
            raise ValueError(f"{what} (malformed field header)")
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        values = {**other, **tensors}
        for name, value in values.items():
            kind = fields.get(name)  # the annotation, e.g. "Tensor | None" or "str"
            if kind is None or (name in tensors and name in other):
                ok = False
            elif value is None:
                ok = "None" in kind
            elif kind.startswith("Tensor"):
                ok = isinstance(value, Tensor)
            else:
                ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
            if not ok:
                raise ValueError(f"{what} (unexpected field {name!r})")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in values and f.default is dataclasses.MISSING
        )
        if missing:
            raise ValueError(f"{what} (missing fields {missing})")
        return cls(**values)

    @staticmethod
    def _safetensors(what: str):
        """``(safe_open, save_file)`` of safetensors, or a one-line ImportError."""
        try:
            from safetensors import safe_open
            from safetensors.torch import save_file
        except ImportError as err:
            raise ImportError(
                f"LipschitzEstimate.{what} needs safetensors: pip install safetensors "
                "(or pip install meanfield[hf])"
            ) from err
        return safe_open, save_file


# ------------------------------------------------------------------------------- helpers
def _round_down(x64: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast ``x64`` to ``dtype`` rounding towards ``-inf``."""
    y = x64.to(dtype)
    if dtype == torch.float64:
        return y
    return torch.where(y.to(torch.float64) > x64, torch.nextafter(y, y.new_tensor(-math.inf)), y)


def _round_up(x64: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast ``x64`` to ``dtype`` rounding towards ``+inf``."""
    y = x64.to(dtype)
    if dtype == torch.float64:
        return y
    return torch.where(y.to(torch.float64) < x64, torch.nextafter(y, y.new_tensor(math.inf)), y)


def _eval_margin(n: int, d: int) -> float:
    """Relative evaluation margin of J in float64 (first-order model, heuristic constant)."""
    return 64 * (n + d) * _U64


_F64_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _params_to_float64(params: Params) -> Params:
    """Float64 copy (cached per ``params``, so certified weight norms are computed once).

    ``.to`` recomputes ``A = Q^T K`` of factored heads from the float64 factors.
    """
    if params.dtype == torch.float64:
        return params
    cached = _F64_CACHE.get(params)
    if cached is None:
        cached = _F64_CACHE[params] = params.to(dtype=torch.float64)
    return cached


def _to_float64(lin: AttentionLinearization, params64: Params | None) -> AttentionLinearization:
    if lin.X.dtype == torch.float64:
        return lin
    p64 = _params_to_float64(lin.params) if params64 is None else params64

    def f(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(torch.float64)

    return linearize(
        lin.X.to(torch.float64),
        p64,
        log_weights=f(lin.log_weights),
        masked=lin.masked,
        positions=f(lin.positions),
        token_index=lin.token_index,
        chunk_size=lin.chunk_size,
    )


def _start(
    shape: tuple[int, ...], like: Tensor, seed: int | None, generator: torch.Generator | None
) -> Tensor:
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    if generator is not None and generator.device.type != "cpu":
        x0 = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float64)
    else:
        x0 = torch.randn(shape, generator=generator, dtype=torch.float64)
    return x0.to(dtype=like.dtype, device=like.device)


def _flat_ops(lin: AttentionLinearization, geometry: str):
    shape_in = lin.batch_shape + (lin.n, lin.d)
    shape_out = lin.batch_shape + (lin.n, lin.d_out)

    def matvec(v: Tensor) -> Tensor:
        return jvp(lin, v.reshape(shape_in), geometry=geometry).reshape(lin.batch_shape + (-1,))

    def rmatvec(u: Tensor) -> Tensor:
        return vjp(lin, u.reshape(shape_out), geometry=geometry).reshape(lin.batch_shape + (-1,))

    return matvec, rmatvec


def _self_ops(lin: AttentionLinearization):
    def matvec(v: Tensor) -> Tensor:
        return self_jvp(lin, v)

    def rmatvec(u: Tensor) -> Tensor:
        return self_vjp(lin, u)

    return matvec, rmatvec


def _parse_input(
    x: Tensor | DiracMeasure, masked: bool | None, params: Params
) -> tuple[Tensor, Tensor | None, Tensor | None, bool]:
    """Points, log-weights, positions and the mask flag, by the input rule (docs/conventions.md §8)."""
    dtype, device = params_dtype_device(
        params, (AttentionParams, MultiHeadParams), "local_lipschitz"
    )
    if masked is not None:
        masked = check_flag(masked, "masked")
    if isinstance(x, DiracMeasure):
        check_measure(x, dtype, device, params.d, "local_lipschitz")
        is_masked = x.is_causal if masked is None else masked
        if is_masked and not x.is_causal:
            raise ValueError(
                "masked estimates on a measure need a position-tagged (causal) measure"
            )
        lw = x.log_weights
        uniform = bool((x.weights == x.weights[..., :1]).all())
        return x.points, None if uniform else lw, x.positions if is_masked else None, is_masked
    X = check_points(x, "x", params.d, dtype, device)
    return X, None, None, bool(masked) if masked is not None else False


def _block_upper(
    lin64: AttentionLinearization, geometry: str, self_norms: Tensor | None, e: int = 0
) -> Tensor:
    """Block-norm bound on ``2**-e ||J||`` (the norm matrix is scaled before Collatz–Wielandt)."""
    if lin64.rope_heads:
        # rotary heads: the per-head structured bound (Euclidean operator only)
        if geometry == "euclidean" or lin64.P_w is None and lin64.log_weights is None:
            blocks = collatz_wielandt_bound(structured_block_norms(lin64)) * (1 + _BLOCK_RTOL)
            bound = torch.minimum(head_structured_upper(lin64), blocks)
            # in the units of 2**e like the other branch; rounded up (exact power-of-two scaling
            # unless it underflows, where 1 + 4u covers the last bit)
            return _rnd.unscale(bound, -e) * (1 + 4 * _rnd.U64) if e != 0 else bound
        return torch.full(lin64.batch_shape, math.inf, dtype=torch.float64, device=lin64.X.device)
    if e != 0:  # the layer scaled by 2**-e (docs/rounding.md §5)
        lin64 = _relinearize(lin64, _rnd.scaled_params(lin64.params, e))
        self_norms = None if self_norms is None else _rnd.unscale(self_norms, -e)
    N = block_norm_bounds(lin64, geometry=geometry, self_norms=self_norms)
    N = torch.where(torch.isnan(N), math.inf, N)
    eN = _rnd.scale_of(N)  # no squares of huge entries in Collatz–Wielandt
    up = _rnd.unscale(collatz_wielandt_bound(_rnd.unscale(N, -eN)), eN)
    return up * (1 + _BLOCK_RTOL)


def _relinearize(lin: AttentionLinearization, params: Params) -> AttentionLinearization:
    return linearize(
        lin.X,
        params,
        log_weights=lin.log_weights,
        masked=lin.masked,
        positions=lin.positions,
        token_index=lin.token_index,
        chunk_size=lin.chunk_size,
    )


def _float32_scaled(
    lin: AttentionLinearization, scale_from: AttentionLinearization
) -> tuple[AttentionLinearization, int] | None:
    """Float32 ``lin`` scaled by a power of two that brings the operator near norm one.

    The scale is read from ``scale_from`` (``lin`` itself or its float64 copy). ``None`` when
    that scale or the attention matrices leave float32's range (float32 norms underflow below
    ~1e-19 and overflow above ~1e19): the solver must then run in float64.
    """
    if not bool(torch.isfinite(lin.P).all()):
        return None
    if lin.P_w is not None and not bool(torch.isfinite(lin.P_w).all()):
        return None
    e32 = _rnd.scale_exponent(scale_from, threshold=4)
    if abs(e32) > 100:
        return None
    return _rnd.scaled(lin, e32), e32


def _solver_lin(
    lin: AttentionLinearization,
    lin64: AttentionLinearization,
    lin64s: AttentionLinearization,
    e: int,
) -> tuple[AttentionLinearization, int]:
    """The linearisation the iterative solver runs on and its scale (docs/rounding.md §5).

    Float64 inputs: ``lin64s`` (scale ``e``). Float32 inputs: their own, scaled as
    :func:`_float32_scaled` says with the scale read from ``lin64``, or ``lin64s`` when that
    leaves float32's range.
    """
    if lin is lin64s or lin.X.dtype == torch.float64:
        return lin64s, e
    out = _float32_scaled(lin, lin64)
    return (lin64s, e) if out is None else out


def _fast_lin(lin: AttentionLinearization) -> tuple[AttentionLinearization, int] | None:
    """The solver's linearisation without a float64 copy (``certify=False``), or ``None``.

    Float64 inputs: their own, with the scale of docs/rounding.md §5. Float32 inputs:
    :func:`_float32_scaled` with the scale read from the float32 linearisation; ``None`` (the
    caller then goes through float64) when that leaves float32's range.
    """
    if lin.X.dtype == torch.float64:
        e = _rnd.scale_exponent(lin)
        return _rnd.scaled(lin, e), e
    return _float32_scaled(lin, lin)


@dataclass(frozen=True)
class _SelfTerm:
    value: Tensor  # (...,) max_i estimate, float64
    lower: Tensor  # (...,)
    upper: Tensor  # (...,)
    upper_atoms: Tensor | None  # (..., n) certified per-atom bounds, when explicit
    converged: Tensor
    n_matvec: Tensor


def _self_term(
    lin: AttentionLinearization,
    lin64: AttentionLinearization,
    *,
    explicit: bool,
    method: str,
    tol: float,
    max_iter: int | None,
    krylov_dim: int,
    seed: int | None,
    generator: torch.Generator | None,
    chunk_size: int | None,
    em: float | None = None,
) -> _SelfTerm:
    """max_i ||S_i||_2 with a bracket: explicit blocks + SVD, or batched per-atom Lanczos.

    ``em`` is a relative margin (first-order model, docs/rounding.md §6).
    """
    em = _eval_margin(lin.n, lin.d) if em is None else em
    batch = lin64.batch_shape
    dev = lin64.X.device
    if explicit:
        sv, low, up = [], [], []
        per_atom = max(1, math.prod(batch)) * lin64.d_out * lin64.d
        block = chunk_size if chunk_size is not None else max(1, _EXPLICIT_SELF_ENTRIES // per_atom)
        for sl in iter_chunks(lin64.n, block):
            S = _self_blocks(lin64, sl)  # (..., c, d_out, d)
            _, s, Vh = torch.linalg.svd(S, full_matrices=False)
            v = Vh[..., 0, :]
            low.append(torch.linalg.vector_norm((S @ v.unsqueeze(-1)).squeeze(-1), dim=-1))
            sv.append(s[..., 0])
            up.append(spectral_norm_upper(S, candidate=s[..., 0], max_iter=0))
        val = torch.cat(sv, -1)
        up_atoms = torch.cat(up, -1) * (1 + em)
        return _SelfTerm(
            value=val.amax(-1),
            lower=torch.cat(low, -1).amax(-1) * (1 - em),
            upper=up_atoms.amax(-1),
            upper_atoms=up_atoms,
            converged=torch.ones(batch, dtype=torch.bool, device=dev),
            n_matvec=torch.zeros(batch, dtype=torch.int64, device=dev),
        )
    mv, rmv = _self_ops(lin)
    x0 = _start(lin.batch_shape + (lin.n, lin.d), lin.X, seed, generator)
    res = top_singular_value(
        mv, rmv, x0, method=method, tol=tol, max_iter=max_iter, krylov_dim=krylov_dim
    )
    if lin64 is lin:
        low = res.sigma
    else:
        low = torch.linalg.vector_norm(self_jvp(lin64, res.vector.to(torch.float64)), dim=-1)
    up_atoms = self_norm_trace_bound(lin64) * (1 + em)
    return _SelfTerm(
        value=res.sigma.to(torch.float64).amax(-1),
        lower=(low * (1 - em)).amax(-1),
        upper=up_atoms.amax(-1),
        upper_atoms=None,
        converged=res.converged.all(-1),
        n_matvec=res.n_matvec.amax(-1),
    )


# --------------------------------------------------------------------------- main estimator
def _width_rule(
    width: float,
    margin: float,
    mag_norm: Tensor,
    model: _rnd.ErrorModel,
    rope: bool,
    n_out: int,
    n_in: int,
    shift: int,
    *,
    float32_solve: bool,
):
    r"""The width rule's tests on the solver's Ritz value ``sigma`` and bound (solver units).

    They predict the certified ends exactly as the estimator forms them after the run
    (:func:`~meanfield._rounding.upper_margin`, :func:`~meanfield._rounding.lower_from_norm`),
    from the magnitude norm and error model known before it, with the Ritz value for
    :math:`\|Jv\|` (lowered by the Krylov margin for a float32 solve, whose vector is measured
    again in float64). ``shift`` is ``e_solve - e`` (docs/rounding.md §5). Returns
    ``accept(sigma, bound)``, ``reachable(sigma)`` (whether a perfect Krylov bound, the Ritz
    value times ``1 + margin``, would be accepted) and whether the relative margins alone leave
    room for the width (a tensor of the batch shape).
    """
    shrink = 1.0 - margin if float32_solve else 1.0

    def ends(sigma: Tensor, bound: Tensor, mag: Tensor) -> tuple[Tensor, Tensor]:
        s = _rnd.unscale(sigma.to(torch.float64), shift) * shrink
        up = _rnd.upper_margin(mag, model, _rnd.unscale(bound.to(torch.float64), shift), rope)
        lo = _rnd.lower_from_norm(s, torch.ones_like(s), n_in, mag, model, rope, n_out)
        return up, lo

    def accept(sigma: Tensor, bound: Tensor) -> Tensor:
        up, lo = ends(sigma, bound, mag_norm)
        return up <= width * lo

    def reachable(sigma: Tensor) -> Tensor:
        return accept(sigma, sigma.to(torch.float64) * (1 + margin))

    one = torch.ones_like(mag_norm)
    up, lo = ends(one, one * (1 + margin), torch.zeros_like(mag_norm))
    return accept, reachable, up <= width * lo


def _float64_residual_ok(
    lin64s: AttentionLinearization,
    Jv: Tensor,
    v64: Tensor,
    s: Tensor,
    geometry: str,
    tol: float | Tensor,
    N: int,
) -> Tensor:
    r"""Whether a float32 solve's vector meets the tolerance on the float64 operator.

    The float32 solver judges convergence on its own operator, whose attention matrices can be
    far from the exact ones where logits are large (rotary heads at distant positions, inputs of
    norm :math:`10^3`): there it has reported convergence to a vector that is no singular vector
    of :math:`J`. One more float64 product gives
    :math:`\|J^\top Jv - s^2v\|\le(\mathrm{tol} + 8\sqrt N u_{32})\,s^2\|v\|` with
    :math:`s = \|Jv\|/\|v\|`, a few times the float32 residual's own rounding level added
    (docs/rounding.md §7).
    """
    g = vjp(lin64s, Jv, geometry=geometry).flatten(-2)
    nv = torch.linalg.vector_norm(v64, dim=-1)
    s2 = (s / nv).square()
    r = torch.linalg.vector_norm(g - s2[..., None] * v64, dim=-1) / nv
    u32 = torch.finfo(torch.float32).eps / 2
    return r <= (tol + 8 * math.sqrt(N) * u32) * s2


def local_lipschitz(
    x: Tensor | DiracMeasure,
    params: Params,
    *,
    geometry: Geometry = "euclidean",
    masked: bool | None = None,
    method: Method = "auto",
    tol: float | None = None,
    max_iter: int | None = None,
    krylov_dim: int = 32,
    seed: int | None = 0,
    generator: torch.Generator | None = None,
    upper: UpperMethod = "auto",
    chunk_size: int | None = None,
    token_index: Tensor | None = None,
    delta: float | None = 1e-6,
    prob_rtol: float | Literal["auto"] | None = "auto",
    start: Tensor | Literal["kronecker"] | None = None,
    certify: bool = True,
) -> LipschitzEstimate:
    r"""Local Lipschitz constant of attention at a sequence or a measure, with a certified bracket.

    Parameters
    ----------
    x : Tensor, shape (..., n, d), or DiracMeasure
        A sequence (uniform weights) or a batch of them, or a weighted measure. A causal measure
        implies ``masked=True`` with its positions (docs/theory.md §B2).
    params : AttentionParams or MultiHeadParams
    geometry : {"euclidean", "wasserstein", "split"}, default "euclidean"
        The constant (module docstring; docs/theory.md §16). For sequences and uniform
        weights ``"wasserstein"`` equals ``"euclidean"``.
    masked : bool, optional
        Causal attention. Default: ``x.is_causal`` for a measure, ``False`` for a tensor.
    method : {"auto", "dense", "lanczos", "power"}, default "auto"
        ``"dense"`` assembles :math:`J` and takes an SVD (float64); ``"lanczos"`` is matrix-free
        Golub–Kahan–Lanczos; ``"power"`` is the baseline power iteration. Both stop on the
        residual rule below. ``"auto"``: dense when ``n * d <= 1500``.
    tol : float, optional
        Relative residual tolerance :math:`\|J^\top Jv-\sigma^2v\|\le\mathrm{tol}\,\sigma^2`
        of the residual rule (docs/rounding.md §7). Given explicitly, the call stops on it (and
        on the width too when ``prob_rtol`` is a number). Default: the width rule where it
        applies, else the residual rule with ``tol = 1e-6``. For float32 inputs use
        ``tol >= 1e-4``.
    max_iter : int, optional
        Iteration cap of the solver (defaults: 300 Lanczos steps, 1000 power steps).
    krylov_dim : int, default 32
        Lanczos basis size before a restart.
    seed : int or None, default 0
        Seed of the random start (ignored when ``generator`` is given; ``None``: global RNG).
    generator : torch.Generator, optional
    upper : {"auto", "gram", "block", "none"}, default "auto"
        Upper-bound certificate. ``"auto"``: ``"gram"`` for the dense method, ``"block"``
        otherwise. ``"gram"`` needs ``method="dense"``.
    chunk_size : int, optional
        Query-block size of the matrix-free products.
    token_index : Tensor, optional
        Integer token positions of rotary heads.
    delta : float or None, default 1e-6
        Failure probability of the probabilistic certificate ``upper_prob`` (confidence
        :math:`1-\delta`), docs/certificates.md. For ``method="lanczos"`` it costs nothing: it
        reuses the run's Krylov space, whose first cycle starts from the seeded Gaussian vector
        (uniform on the sphere). The guarantee is over that draw: do not pick the seed after
        looking at results. ``None``: no probabilistic certificate.
    prob_rtol : float, "auto" or None, default "auto"
        The width rule: run one unrestarted Lanczos cycle until the certified bracket satisfies
        ``upper_prob <= (1 + prob_rtol) * lower``, then stop. ``upper_prob`` is the smaller of a
        gap-aware bound from the Lanczos polynomial and the Kuczyński–Woźniakowski bound, at
        failure probability ``delta / 2`` each, the latter spread over the steps where the run may
        stop (docs/certificates.md §1–2). ``"auto"``: ``0.05`` where the width rule applies
        (see "Stopping rules"), else the residual rule. A number needs the random start and
        ``certify=True``; ``None``: the residual rule.
    start : Tensor, shape (..., n, d), or "kronecker", optional
        Start vector of the matrix-free methods in place of the seeded random one: a warm start,
        e.g. the ``vector`` of an estimate at a neighbouring input (the previous length of a
        sweep over prefixes, zero-padded, or the previous window shifted by the stride). On a
        GPT-2 layer this cuts the products of a sweep 3-4 fold. ``"kronecker"``: the top
        singular vector of a Kronecker approximation of the value path plus a seeded Gaussian
        vector of the same norm (:func:`~meanfield.lipschitz.kronecker_start`,
        docs/certificates.md §6); it cuts the products of an estimate 2-4 fold on randomly
        initialised GPT-2 layers and by 0-40 % on trained MiniLM and SmolLM2 layers. ``lower``
        and ``upper`` keep their guarantees whatever the start (only the run's path changes). The probabilistic certificate assumes a uniformly random start, so
        with ``start`` no Kuczyński–Woźniakowski bound is formed: ``upper_prob`` is then
        ``upper``. Not combinable with ``prob_rtol``.
    certify : bool, default True
        ``False``: the estimate alone (``value``, ``vector``, ``residual``, ``converged``), with
        the trivial bracket ``lower = 0``, ``upper = inf`` and no ``upper_prob``. It skips the
        rounding analysis, the magnitude products and, for float32 inputs, the float64
        re-linearisation that certify ``lower`` (docs/rounding.md §9): a float32 estimate of a
        GPT-2 layer then costs about 40 % less. ``upper`` must be ``"auto"`` or ``"none"``,
        and ``prob_rtol`` is not available. The iteration, its stopping rule and ``converged``
        are those of the certified call.

    Returns
    -------
    LipschitzEstimate
        Tensor fields of the batch shape of ``x``, in its dtype.

    Notes
    -----
    **Stopping rules.** The default call (``method="lanczos"``, or ``"auto"`` resolving to it,
    with ``certify=True``, ``delta`` set, the random start and no ``tol``) stops on the *width
    rule*: as soon as the certified bracket ``[lower, upper_prob]`` is within a factor
    ``1 + prob_rtol`` (1.05 by default), with the rounding margins of both ends known before the
    run. Where that width is unreachable (the margins alone are wider, e.g. float32 at large n),
    ``width_reachable`` is false and the call stops on the residual rule instead; it never runs
    to ``max_iter`` chasing the width. Calls that form no ``upper_prob`` (``start=``,
    ``certify=False``, ``method="power"``, ``delta=None``) and calls with an explicit ``tol``
    stop on the residual rule. ``stop_rule`` records which rule was used.

    Products are batched over the leading dimensions, so a (B, n, d) input costs one batched
    product per iteration. Heads with a rotary embedding use autograd products; the block bound
    is then replaced by :func:`~meanfield.jacobian.head_structured_upper` (Euclidean operator;
    ``upper = inf`` for the weighted Wasserstein one) and ``geometry="split"`` is not supported
    for them.
    """
    if geometry not in ("euclidean", "wasserstein", "split"):
        raise ValueError(
            f"geometry must be 'euclidean', 'wasserstein' or 'split', got {geometry!r}"
        )
    if method not in ("auto", "dense", "lanczos", "power"):
        raise ValueError(f"method must be 'auto', 'dense', 'lanczos' or 'power', got {method!r}")
    if upper not in ("auto", "gram", "block", "none"):
        raise ValueError(f"upper must be 'auto', 'gram', 'block' or 'none', got {upper!r}")
    X, lw, positions, is_masked = _parse_input(x, masked, params)
    if tol is not None and not (isinstance(tol, (int, float)) and 0 < tol < math.inf):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    explicit_rtol = prob_rtol is not None and not isinstance(prob_rtol, str)
    if isinstance(prob_rtol, str) and prob_rtol != "auto":
        raise ValueError(f"prob_rtol must be a positive number, 'auto' or None, got {prob_rtol!r}")
    if explicit_rtol and not (isinstance(prob_rtol, (int, float)) and 0 < prob_rtol < math.inf):
        raise ValueError(f"prob_rtol must be a positive number, 'auto' or None, got {prob_rtol!r}")
    if isinstance(start, str):
        if start != "kronecker":
            raise ValueError(f"start must be a tensor or 'kronecker', got {start!r}")
        if explicit_rtol:
            raise ValueError("prob_rtol needs the random start; drop start or prob_rtol")
    elif start is not None:
        start = as_float_tensor(start, "start", like=X)
        if start.shape != X.shape:
            raise ValueError(
                f"start must have the shape of x, {tuple(X.shape)}, got {tuple(start.shape)}"
            )
        check_finite(start, "start")
        if explicit_rtol:
            raise ValueError("prob_rtol needs the random start; drop start or prob_rtol")
    if not certify:
        if upper not in ("auto", "none"):
            raise ValueError(f"upper={upper!r} is a certificate: it needs certify=True")
        if explicit_rtol:
            raise ValueError("prob_rtol runs until a certificate holds: it needs certify=True")
    lin = linearize(
        X,
        params,
        log_weights=lw,
        masked=is_masked,
        positions=positions,
        token_index=token_index,
        chunk_size=chunk_size,
    )
    op_geometry = "euclidean" if geometry == "euclidean" else "wasserstein"
    if geometry == "split" and lin.rope_heads:
        raise NotImplementedError(
            "geometry='split' is not available for heads with a rotary embedding"
        )
    n, d = lin.n, lin.d
    resolved = method if method != "auto" else ("dense" if n * d <= DENSE_AUTO_MAX else "lanczos")
    up_method = upper if upper != "auto" else ("gram" if resolved == "dense" else "block")
    if not certify:
        up_method, delta = "none", None
    if up_method == "gram" and resolved != "dense":
        raise ValueError("upper='gram' needs the assembled Jacobian: use method='dense'")
    dtype, dev, batch = X.dtype, X.device, lin.batch_shape
    # the stopping rule (docstring, "Stopping rules"): the certified width where it applies
    tol_given = tol is not None
    tol = DEFAULT_TOL if tol is None else float(tol)
    width_applies = resolved == "lanczos" and certify and delta is not None and start is None
    rtol: float | None = None
    if width_applies and (explicit_rtol or not tol_given):
        rtol = float(prob_rtol) if isinstance(prob_rtol, (int, float)) else DEFAULT_PROB_RTOL
    em = _eval_margin(n, d)
    rope = bool(lin.rope_heads)
    fast = None if certify or resolved == "dense" or geometry == "split" else _fast_lin(lin)
    if fast is not None:  # the estimate alone, in the working precision of the inputs
        lin64 = lin64s = lin
        lin_solve, e_solve = fast
        e = 0
    else:
        lin64 = _to_float64(lin, None)
        # scale safety (docs/rounding.md §5): every norm below is computed on the operator
        # 2**-e J, with e a power-of-two scale, and brought back at the end
        e = _rnd.scale_exponent(lin64)
        lin64s = _rnd.scaled(lin64, e)
        lin_solve, e_solve = _solver_lin(lin, lin64, lin64s, e)
    if certify:  # rounding model (docs/rounding.md §2-§4)
        model = _rnd.error_model(lin64)
        mlin = _rnd.magnitude_linearization(lin64s, model) if lin64s.analytic_heads else None
        # ||J_mag|| (two magnitude products), formed only for the ends that need it: the upper
        # certificates; the lower end uses ||J_mag |v| || from one product when it can
        mag_cache: list[Tensor] = []

        def mag_norm() -> Tensor:
            if not mag_cache:
                mag_cache.append(_rnd.magnitude_norm(mlin, op_geometry, model.eta))
            return mag_cache[0]

        def mag_norm_for_lower(mag_v: Tensor | None) -> Tensor:
            if mag_v is None or mag_cache:
                return mag_norm()
            return torch.full_like(model.eta, math.inf)

    self_term = None
    if geometry == "split":
        explicit = resolved == "dense" or (
            n * lin.d_out * d * min(lin.d_out, d) * max(1, math.prod(batch)) <= _EXPLICIT_SELF_FLOPS
        )
        self_term = _self_term(
            lin,
            lin64,
            explicit=explicit,
            method="lanczos" if resolved == "dense" else resolved,
            tol=tol,
            max_iter=max_iter,
            krylov_dim=krylov_dim,
            seed=seed,
            generator=generator,
            chunk_size=chunk_size,
            em=em + 4 * float(model.eps_P.amax()) if certify else em,
        )

    history = None
    prob = None
    n_out = n * lin.d_out
    stop_rule = "dense" if resolved == "dense" else "residual"
    width_reachable: Tensor | None = None
    width = None if rtol is None else 1.0 + rtol
    if resolved == "dense":
        J = _dense_from_lin(lin64s, op_geometry)
        finite = torch.isfinite(J).flatten(-2).all(-1)
        J = torch.where(finite[..., None, None], J, torch.zeros_like(J))
        _, S, Vh = torch.linalg.svd(J, full_matrices=False)
        v = Vh[..., 0, :]
        Jv = (J @ v.unsqueeze(-1)).squeeze(-1)
        sigma = torch.linalg.vector_norm(Jv, dim=-1)
        residual = torch.linalg.vector_norm(
            (J.mT @ Jv.unsqueeze(-1)).squeeze(-1) - sigma.square().unsqueeze(-1) * v, dim=-1
        )
        value64 = S[..., 0]
        lower64 = torch.zeros_like(value64)
        if certify:
            # the lower end comes from the product path, whose rounding the model covers
            s_prod = torch.linalg.vector_norm(
                jvp(lin64s, v.reshape(batch + (n, d)), geometry=op_geometry).flatten(-2), dim=-1
            )
            mag_v = _rnd.magnitude_vector_norm(mlin, v, op_geometry)
            lower64 = _rnd.lower_from_product(
                s_prod, v, mag_norm_for_lower(mag_v), model, rope, n_out, mag_v
            )
        vector = v.reshape(batch + (n, d)).to(dtype)
        converged = finite
        n_iter = torch.zeros(batch, dtype=torch.int64, device=dev)
        n_matvec = torch.zeros(batch, dtype=torch.int64, device=dev)
        if up_method == "gram":
            upper64 = spectral_norm_upper(J, candidate=value64, max_iter=_DENSE_GRAM_STEPS)
            upper64 = _rnd.upper_margin(mag_norm(), model, upper64, rope)
            upper64 = torch.where(finite, upper64, math.inf)
        lower64 = torch.where(finite, lower64, 0.0)
    else:
        mv, rmv = _flat_ops(lin_solve, op_geometry)
        if start is None:
            x0 = _start(batch + (n * d,), lin_solve.X, seed, generator)
        elif isinstance(start, str):  # the Kronecker start (docs/certificates.md §6)
            if generator is None and seed is not None:
                generator = torch.Generator().manual_seed(int(seed))
            x0 = kronecker_start(lin_solve, geometry=op_geometry, generator=generator)
            x0 = x0.reshape(batch + (n * d,))
        else:  # a chosen start: the probabilistic certificate needs a random one (none below)
            x0 = start.reshape(batch + (n * d,)).to(lin_solve.X)
        cap = 300 if max_iter is None else int(max_iter)
        margin = krylov_rounding_margin(n, d, cap, lin_solve.X.dtype) + em
        if rtol is not None:
            accept, reachable, possible = _width_rule(
                1.0 + rtol,
                margin,
                mag_norm(),
                model,
                rope,
                n_out,
                n * d,
                e_solve - e,
                float32_solve=lin_solve.X.dtype != torch.float64,
            )
            if not bool(possible.any()):  # the relative margins alone are wider than the width
                rtol, width_reachable = None, possible
        if rtol is not None:
            res, prob, k1 = golub_kahan_certified(
                mv,
                rmv,
                x0,
                delta=delta,
                rtol=rtol,
                margin=margin,
                tol=tol,
                max_iter=cap,
                krylov_dim=krylov_dim,
                accept=accept,
                reachable=reachable,
                require_residual=tol_given,
            )
            stop_rule = "width"
            width_reachable = reachable(res.sigma)
        else:
            res: SpectralResult = top_singular_value(
                mv, rmv, x0, method=resolved, tol=tol, max_iter=max_iter, krylov_dim=krylov_dim
            )
            if resolved == "lanczos" and delta is not None and start is None:
                ritz = torch.maximum(res.history[-1], res.sigma)
                k1 = res.n_iter.clamp_max(max(int(krylov_dim), 2))
                margin = krylov_rounding_margin(n, d, int(k1.max()), lin_solve.X.dtype) + em
                prob = probabilistic_upper(ritz, k1, n * d, delta, margin)
        if prob is not None:
            # solver units (2**e_solve) to those of 2**e, plus the products' evaluation error
            # (docs/rounding.md §4.2), as for the deterministic end
            prob = _rnd.unscale(prob.to(torch.float64), e_solve - e)
            prob = _rnd.upper_margin(mag_norm(), model, prob, rope)
        v64 = res.vector.to(torch.float64)
        checked = None  # float32 solves: whether the float64 residual confirms convergence
        if lin_solve is lin64s or not certify:
            s_prod = res.sigma.to(torch.float64)
        else:
            Jv = jvp(lin64s, v64.reshape(batch + (n, d)), geometry=op_geometry)
            s_prod = torch.linalg.vector_norm(Jv.flatten(-2), dim=-1)
            tol_check: float | Tensor = tol
            if stop_rule == "width" and not tol_given:  # no residual target: the check is that
                # the float64 operator's residual on this vector matches the float32 solver's own
                # (per element; a zero operator, whose relative residual is undefined, passes)
                rel = res.residual.to(torch.float64) / res.sigma.to(torch.float64).square()
                rel = torch.where(torch.isnan(rel), math.inf, rel)
                tol_check = torch.clamp(rel + 2 * margin, min=tol)
            checked = _float64_residual_ok(lin64s, Jv, v64, s_prod, op_geometry, tol_check, n * d)
        finite = torch.isfinite(s_prod) & torch.isfinite(v64).all(-1)
        lower64 = torch.zeros_like(s_prod)
        if certify:
            v_safe = torch.where(finite[..., None], v64, 1.0)
            mag_v = _rnd.magnitude_vector_norm(mlin, v_safe, op_geometry)
            lower64 = _rnd.lower_from_product(
                torch.where(finite, s_prod, 0.0),
                v_safe,
                mag_norm_for_lower(mag_v),
                model,
                rope,
                n_out,
                mag_v,
            )
        # solver results are in units of 2**e_solve; bring them to those of 2**e
        value64 = _rnd.unscale(torch.where(finite, res.sigma.to(torch.float64), 0.0), e_solve - e)
        if checked is not None:  # a float32 solve: the float64 value ||Jv|| / ||v|| of its vector
            value64 = torch.where(finite, s_prod / torch.linalg.vector_norm(v64, dim=-1), 0.0)
        residual = torch.where(finite, res.residual.to(torch.float64), math.inf)
        residual = _rnd.unscale(residual, e_solve - e, 2)
        vector = res.vector.reshape(batch + (n, d))
        converged, n_iter, n_matvec = res.converged & finite, res.n_iter, res.n_matvec
        if checked is not None:  # a float32 operator far from the exact one: not converged,
            converged = converged & checked  # and no probabilistic bound from its Krylov space
            if prob is not None:
                prob = torch.where(checked, prob, math.inf)
        history = _rnd.unscale(res.history.to(torch.float64), e_solve).to(dtype)
    if up_method == "block":
        self_norms = None if self_term is None else self_term.upper_atoms
        upper64 = _block_upper(lin64, op_geometry, self_norms, e)
        upper64 = _rnd.upper_margin(mag_norm(), model, upper64, rope)
    elif up_method == "none":
        upper64 = torch.full(batch, math.inf, dtype=torch.float64, device=dev)
    # back to the units of J (docs/rounding.md §5): overflow gives upper = inf, and a lower end
    # beyond float64's range is clamped to its largest finite number (still a lower bound)
    value64 = _rnd.unscale(value64, e)
    lower64 = _rnd.unscale(lower64, e).clamp_max(_rnd.F64_MAX)
    upper64 = _rnd.unscale(upper64, e)
    residual = _rnd.unscale(residual.to(torch.float64), e, 2)
    upper64 = torch.where(torch.isnan(upper64), math.inf, upper64)
    if prob is not None:
        prob = _rnd.unscale(prob, e)
        prob = torch.where(torch.isnan(prob), math.inf, prob)

    upper_prob64 = None
    if delta is not None:
        upper_prob64 = upper64 if prob is None else torch.minimum(upper64, prob)
    self_value = None
    if self_term is not None:
        if upper_prob64 is not None:
            upper_prob64 = torch.maximum(upper_prob64, self_term.upper)
        value64 = torch.maximum(value64, self_term.value)
        lower64 = torch.maximum(lower64, self_term.lower)
        upper64 = torch.maximum(upper64, self_term.upper)
        converged = converged & self_term.converged
        n_matvec = n_matvec + self_term.n_matvec
        self_value = self_term.value.to(dtype)
    if not certify:  # the trivial bracket: the self term's ends carry no rounding analysis
        lower64, upper64 = torch.zeros_like(lower64), torch.full_like(upper64, math.inf)
    lower_out = _round_down(lower64, dtype)
    upper_prob_out = None if upper_prob64 is None else _round_up(upper_prob64, dtype)
    if stop_rule == "width" and upper_prob_out is not None and width_reachable is not None:
        # converged: the returned bracket meets the width (and the residual rule when tol was
        # given); where the width is out of reach, the residual rule alone
        met = upper_prob_out.to(torch.float64) <= width * lower_out.to(torch.float64)
        if tol_given:
            met = met & converged
        converged = torch.where(width_reachable, met, converged)
    return LipschitzEstimate(
        value=value64.to(dtype),
        lower=lower_out,
        upper=_round_up(upper64, dtype),
        converged=converged,
        n_iter=n_iter,
        n_matvec=n_matvec,
        residual=residual.to(dtype),
        method=resolved,
        geometry=geometry,
        upper_method=up_method,
        vector=vector,
        history=history,
        self_value=self_value,
        upper_prob=upper_prob_out,
        confidence=None if delta is None else 1.0 - float(delta),
        stop_rule=stop_rule,
        width=width,
        width_reachable=width_reachable,
    )
