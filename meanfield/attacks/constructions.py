r"""Closed-form adversarial inputs: the eigenvector sequence, two Diracs, two off-axis atoms.

* :func:`adversarial_sequence`: one token plus :math:`n-1` copies (docs/theory.md §3, §4), in
  the released variant (real eigenvectors of the score matrix, the "−8 rule"), the symmetric-part
  variant, and a variant on the sphere of radius :math:`R` (what LayerNorm imposes).
* :func:`two_dirac`, :func:`two_dirac_measure`: two unbalanced Diracs at the exact optimal light
  mass, built from log-masses (docs/theory.md §5).
* :func:`off_axis_two_atoms`: the general two-atom lower bound maximised by a multi-start search
  (docs/theory.md §A3).

Notation (docs/theory.md §A1): score matrix :math:`A`, value matrix :math:`V`, unit direction
:math:`u` with Rayleigh quotient :math:`\lambda=u^\top Au`, logit gap :math:`\gamma`, light mass
:math:`\varepsilon` and :math:`w` the attention the heavy atom pays to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .._numerics import as_float_tensor, check_finite
from .._typing import Case, Params, Variant
from .._validation import reject_variants
from ..measures import DiracMeasure
from ..params import AttentionParams, MultiHeadParams
from ._common import (
    SearchOptions,
    as_float64,
    ascend_restarts,
    check_radius,
    fix_sign,
    from_ball,
    log_sigmoid,
    resolve_options,
    single_head_matrices,
    to_ball,
)

__all__ = [
    "AdversarialSequence",
    "OffAxisTwoAtoms",
    "TwoDirac",
    "adversarial_sequence",
    "off_axis_two_atoms",
    "two_dirac",
    "two_dirac_measure",
]

#: Relative tolerance deciding that an eigenvalue of A is real (imaginary part ~ 0).
_REAL_EIG_RTOL = 1e-9
#: Defaults of :func:`off_axis_two_atoms` (``meanfield.attacks._common.SearchOptions``).
OFF_AXIS_DEFAULTS = SearchOptions(n_restarts=16, steps=400, lr=0.05, seed=0)


def _head(A_or_params: Tensor | Params, head: int | None) -> tuple[Tensor, Tensor | None]:
    """Score matrix of the chosen head and the value map of the (single-head) layer, if defined."""
    reject_variants(A_or_params, "this construction")
    if isinstance(A_or_params, MultiHeadParams):
        h = 0 if head is None else int(head)
        if not 0 <= h < A_or_params.n_heads:
            raise IndexError(f"head {h} out of range for a layer with {A_or_params.n_heads} heads")
        V = A_or_params.head_output_matrix(0) if A_or_params.n_heads == 1 else None
        return A_or_params.heads[h].A, V
    if isinstance(A_or_params, AttentionParams):
        if head not in (None, 0):
            raise IndexError(f"head {head} out of range for a single head")
        return A_or_params.A, A_or_params.V
    A = as_float_tensor(A_or_params, "A")
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square matrix, got shape {tuple(A.shape)}")
    check_finite(A, "A")
    return A, None


def _value_matrix(V: Tensor | None, A: Tensor) -> Tensor | None:
    if V is None:
        return None
    V = as_float_tensor(V, "V")
    if V.ndim != 2 or V.shape[1] != A.shape[0]:
        raise ValueError(f"V must have shape (d_v, {A.shape[0]}), got {tuple(V.shape)}")
    check_finite(V, "V")
    return V


# =============================================================================================
# directions and gaps (docs/theory.md §3)
# =============================================================================================
@dataclass(frozen=True)
class _Direction:
    lam: float  # Rayleigh quotient u^T A u
    u: Tensor  # (d,) float64 unit


def symmetric_directions(A: Tensor) -> tuple[_Direction, _Direction]:
    """Directions of the largest and smallest Rayleigh quotient (symmetric rule): they exist."""
    A64 = as_float64(A)
    evals, evecs = torch.linalg.eigh(0.5 * (A64 + A64.mT))
    lo, hi = fix_sign(evecs[:, 0]), fix_sign(evecs[:, -1])
    return _Direction(float(hi @ A64 @ hi), hi), _Direction(float(lo @ A64 @ lo), lo)


def extreme_directions(
    A: Tensor, variant: str, eigvecs: str
) -> tuple[_Direction | None, _Direction | None]:
    """Directions of the largest and smallest Rayleigh quotient (released or symmetric rule)."""
    if variant == "symmetric":
        return symmetric_directions(A)
    A64 = as_float64(A)
    if variant != "released":
        raise ValueError(f"variant must be 'released' or 'symmetric', got {variant!r}")
    if eigvecs not in ("code", "score"):
        raise ValueError(f"eigvecs must be 'code' or 'score', got {eigvecs!r}")
    M = A64.mT if eigvecs == "code" else A64
    evals, evecs = torch.linalg.eig(M)
    scale = max(1.0, float(evals.abs().max()))
    real = (evals.imag.abs() <= _REAL_EIG_RTOL * scale).nonzero().flatten().tolist()
    if not real:
        return None, None
    dirs = []
    for j in real:
        v = evecs[:, j]
        k = int(v.abs().argmax())
        v = v * (v[k].conj() / v[k].abs())  # rotate the phase so that the vector is real
        u = fix_sign(v.real.to(torch.float64))
        dirs.append(_Direction(float(u @ A64 @ u), u))
    dirs.sort(key=lambda t: t.lam)
    return dirs[-1], dirs[0]


def _choose_case(hi: _Direction | None, lo: _Direction | None, case: str) -> tuple[str, _Direction]:
    """The −8 rule (docs/theory.md §3): case + iff lambda_max > -8 lambda_min (larger gap)."""
    if case not in ("auto", "+", "-"):
        raise ValueError(f"case must be 'auto', '+' or '-', got {case!r}")
    if hi is None or lo is None:
        raise ValueError(
            "A has no real eigenvalue, so the released construction does not exist; use "
            "variant='symmetric'"
        )
    if case == "auto":
        # '+' is only chosen with lambda_max > 0; '-' with lambda_min < 0 unless every eigenvalue
        # is 0, where the gap is 0 in both cases
        return ("+", hi) if hi.lam > -8.0 * lo.lam else ("-", lo)
    if case == "+":
        if not hi.lam > 0:
            raise ValueError(f"case '+' needs a positive eigenvalue, the largest is {hi.lam:.6g}")
        return "+", hi
    if not lo.lam < 0:
        raise ValueError(f"case '-' needs a negative eigenvalue, the smallest is {lo.lam:.6g}")
    return "-", lo


def score_gap(case: str, lam: float, R: float) -> float:
    return lam * R * R / 4.0 if case == "+" else -2.0 * lam * R * R


def two_positions(case: str, u: Tensor, R: float) -> tuple[Tensor, Tensor]:
    """(distinguished / light token, copies / heavy token) of docs/theory.md §3 and §5."""
    if case == "+":
        return R * u, 0.5 * R * u
    return -R * u, R * u


# ---------------------------------------------------------------------------- sphere variant
def sphere_direction(A: Tensor, *, n_random: int = 8, seed: int = 0) -> tuple[Tensor, float]:
    r"""Maximise :math:`\varphi(b)=\|A^\top b\|-b^\top Ab` over unit :math:`b` (multi-start L-BFGS)."""
    A64 = as_float64(A)
    E = torch.linalg.eigh(0.5 * (A64 + A64.mT))[1].mT
    U = torch.linalg.svd(A64)[0].mT
    g = torch.Generator(device="cpu").manual_seed(seed)
    Zr = torch.randn(n_random, A64.shape[0], generator=g, dtype=torch.float64).to(A64.device)
    Z0 = torch.cat([E, -E, U, -U, Zr])

    def phi(Z: Tensor) -> Tensor:
        B = Z / torch.linalg.vector_norm(Z, dim=-1, keepdim=True)
        return torch.linalg.vector_norm(B @ A64, dim=-1) - ((B @ A64) * B).sum(-1)

    Z = Z0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([Z], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = -phi(Z).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        vals = torch.cat([phi(Z), phi(Z0)])
        cands = torch.cat([Z, Z0])
        k = int(torch.nan_to_num(vals, nan=-math.inf).argmax())
        b = cands[k] / torch.linalg.vector_norm(cands[k])
    return fix_sign(b), float(vals[k])


# =============================================================================================
# 1. the eigenvector construction
# =============================================================================================
@dataclass(frozen=True, eq=False)
class AdversarialSequence:
    r"""One token plus :math:`n-1` copies (docs/theory.md §3).

    Attributes
    ----------
    X : Tensor, shape (n, d)
        The input: token 1 (row 0) is the distinguished token, rows 1.. are the copies.
    gamma : float
        Logit gap :math:`\gamma = x_c^\top A(x_1-x_c)` seen by every copy :math:`x_c`.
    case : str
        ``"+"``, ``"-"`` or ``"sphere"``.
    u : Tensor, shape (d,)
        Unit direction of the construction (the copies sit on :math:`\mathbb R u`; for the sphere
        variant the copies sit at :math:`Ru`).
    lam : float
        :math:`\lambda = u^\top Au`.
    p : float
        :math:`p = e^\gamma/(e^\gamma+n-1)`, the attention every copy pays to token 1.
    lower_bound : float or None
        :math:`\sqrt{n-1}\,p\,(1+(1-p)\gamma)\|Vu\|_2` (sphere: :math:`\sqrt{n-1}\,p\,\|VMP_T\|_2`,
        see :func:`adversarial_sequence`); ``None`` without a single-head value map.
    direction : Tensor, shape (d,)
        Unit perturbation of token 1 that realises ``lower_bound``.
    variant : str
    R : float
    n : int
    """

    X: Tensor
    gamma: float
    case: str
    u: Tensor
    lam: float
    p: float
    lower_bound: float | None
    direction: Tensor
    variant: str
    R: float
    n: int


def adversarial_sequence(
    A: Tensor | Params,
    R: float,
    n: int,
    *,
    variant: Variant = "released",
    case: Case = "auto",
    V: Tensor | None = None,
    head: int | None = None,
    sphere: bool = False,
    eigvecs: Literal["code", "score"] = "code",
    seed: int = 0,
) -> AdversarialSequence:
    r"""The eigenvector construction: one token plus :math:`n-1` copies (docs/theory.md §3).

    **Released / symmetric variants.** With a unit :math:`u` and :math:`\lambda=u^\top Au`:

    * case +: :math:`x_1=Ru`, :math:`x_2=\dots=x_n=\frac R2u`, gap :math:`\gamma=\lambda R^2/4`;
    * case −: :math:`x_1=-Ru`, :math:`x_2=\dots=x_n=Ru`, gap :math:`\gamma=2|\lambda|R^2`;

    case + iff :math:`\lambda_{\max}>-8\lambda_{\min}` (the "−8 rule" = the larger gap). Every copy
    gives token 1 the attention :math:`p=e^\gamma/(e^\gamma+n-1)`, and moving token 1 along
    :math:`u` gives

    .. math:: \|Df(X)\|_2\ \ge\ \sqrt{n-1}\;p\,\big(1+(1-p)\gamma\big)\,\|Vu\|_2 .

    ``variant="released"``: :math:`\lambda_{\max},\lambda_{\min}` are the real eigenvalues of
    the score matrix (``torch.linalg.eig``; imaginary part below ``1e-9`` relative) with unit real
    eigenvectors, exactly as the released code: ``eigvecs="code"`` takes eigenvectors of
    :math:`A_{\mathrm{code}}=A^\top` (the released code's matrix, left eigenvectors of
    :math:`A`), ``"score"`` those of :math:`A`; both give the same gap since
    :math:`u^\top Au=\lambda` for either. ``variant="symmetric"``: the extreme eigenpairs of
    :math:`(A+A^\top)/2`, which always exist and give a gap at least as large.

    **Sphere variant** (``sphere=True``; *derived and checked numerically*, not in any source).
    All tokens on the sphere :math:`\|x\|=R`, as LayerNorm imposes (docs/theory.md §A8). With
    copies at :math:`y=Rb` and token 1 at :math:`x_1=Ra` (unit :math:`a,b`) the gap is
    :math:`\gamma=R^2\,b^\top A(a-b)`. For fixed :math:`b` the best :math:`a` is
    :math:`A^\top b/\|A^\top b\|`, so

    .. math:: \gamma^* = R^2\max_{\|b\|=1}\big(\|A^\top b\|-b^\top Ab\big)\ \ge\ 0 ,

    maximised by multi-start L-BFGS from the eigenvectors of :math:`(A+A^\top)/2` and the left
    singular vectors of :math:`A`. It contains case − (:math:`b=u_{\min}` gives at least
    :math:`2|\lambda_{\min}|R^2`) and every two-plane ansatz :math:`x_1=R(\cos\theta\,u+\sin\theta\,w)`,
    and it vanishes only for :math:`A=cI`, :math:`c\ge0` (then no sphere input has a gap). Case +
    is lost: for positive definite :math:`A` the gap on the sphere is smaller than
    :math:`\lambda_{\max}R^2/4`. The copy rows of :math:`Df(X)[H]` for :math:`H=(h,0,\dots,0)` are
    :math:`pVMh` with :math:`M=I+(1-p)(x_1-y)(A^\top y)^\top`, hence, for perturbations tangent to
    the sphere (:math:`P_T=I-aa^\top`),

    .. math:: \|Df(X)|_{T}\|_2\ \ge\ \sqrt{n-1}\;p\;\|VMP_T\|_2 ,

    which grows like :math:`\frac12\sqrt{n-1}\|VMP_T\|` while :math:`n-1\le e^\gamma`. Needs
    :math:`d\ge2` (in :math:`d=1` the sphere is two points).

    Parameters
    ----------
    A : Tensor, shape (d, d), or AttentionParams or MultiHeadParams
        Score matrix (toolkit convention :math:`x_i^\top Ax_j`), or parameters whose head ``head``
        provides it (multi-head: the construction uses one head, as in the paper's experiments).
    R : float
        Radius: :math:`\max_i\|x_i\|=R`.
    n : int
        Number of tokens, ``n >= 1``.
    variant : {"released", "symmetric"}, default "released"
    case : {"auto", "+", "-"}, default "auto"
        ``"auto"`` applies the −8 rule; ignored when ``sphere=True``.
    V : Tensor, shape (d_v, d), optional
        Value map for ``lower_bound``; default: that of a single-head ``A`` (none for several
        heads: the formula bounds one head's map, and other heads may cancel it).
    head : int, optional
        Head of a :class:`MultiHeadParams` (default 0).
    sphere : bool, default False
        The sphere variant above.
    eigvecs : {"code", "score"}, default "code"
        Released variant only: eigenvectors of :math:`A^\top` (as released) or of :math:`A`.
    seed : int, default 0
        Seed of the random starts of the sphere search.

    Returns
    -------
    AdversarialSequence
        ``X`` in the dtype and device of ``A``.

    Raises
    ------
    ValueError
        No real eigenvalue (released variant), a forced case without the needed eigenvalue sign,
        ``n < 1``, ``R <= 0``, or ``sphere=True`` with ``d = 1``.

    Notes
    -----
    Provenance: the construction and the −8 rule are *from the authors' released code*
    (docs/experiments.md, "Protocols and defects"); the bound and the sphere variant are *derived
    and checked numerically*; tightness "for reasonable sequence lengths" is *stated in the paper
    (abstract)*. Biases of the head are ignored, as in the released code.
    """
    R = check_radius(R)
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    A_mat, V_default = _head(A, head)
    V_mat = _value_matrix(V if V is not None else V_default, A_mat)
    A64 = as_float64(A_mat)
    d = A64.shape[0]
    log_m = math.log(n - 1) if n > 1 else -math.inf

    if sphere:
        if d < 2:
            raise ValueError("the sphere variant needs d >= 2 (in d = 1 the sphere is two points)")
        b, phi = sphere_direction(A64, seed=seed)
        Atb = A64.mT @ b
        a = Atb / torch.linalg.vector_norm(Atb) if float(torch.linalg.vector_norm(Atb)) > 0 else b
        gamma = R * R * phi
        x1, y = R * a, R * b
        p = math.exp(log_sigmoid(gamma - log_m))
        eye = torch.eye(d, dtype=torch.float64, device=A64.device)
        M = eye + (1 - p) * torch.outer(x1 - y, A64.mT @ y)
        PT = eye - torch.outer(a, a)
        Vm = as_float64(V_mat) if V_mat is not None else eye
        _, sv, Vh = torch.linalg.svd(Vm @ M @ PT)
        direction = Vh[0]
        lower = math.sqrt(n - 1) * p * float(sv[0]) if V_mat is not None else None
        u, lam, case_out = b, float(b @ A64 @ b), "sphere"
    else:
        hi, lo = extreme_directions(A64, variant, eigvecs)
        case_out, dirn = _choose_case(hi, lo, case)
        u, lam = dirn.u, dirn.lam
        gamma = max(score_gap(case_out, lam, R), 0.0)
        x1, y = two_positions(case_out, u, R)
        p = math.exp(log_sigmoid(gamma - log_m))
        direction = u
        lower = None
        if V_mat is not None:
            Vu = float(torch.linalg.vector_norm(as_float64(V_mat) @ u))
            lower = math.sqrt(n - 1) * p * (1.0 + (1.0 - p) * gamma) * Vu
    X = torch.cat([x1.unsqueeze(0), y.expand(n - 1, d)])
    return AdversarialSequence(
        X=X.to(A_mat),
        gamma=float(gamma),
        case=case_out,
        u=u.to(A_mat),
        lam=lam,
        p=p,
        lower_bound=lower,
        direction=direction.to(A_mat),
        variant="sphere" if sphere else variant,
        R=R,
        n=n,
    )


# =============================================================================================
# two Diracs (docs/theory.md §5) and the off-axis bound (§A3)
# =============================================================================================
def optimal_direction_v(gamma: float) -> float:
    r"""Root in (0, 1) of :math:`4\gamma v^2-(3\gamma-2)v-1=0`, without cancellation."""
    disc = math.sqrt(9.0 * gamma * gamma + 4.0 * gamma + 4.0)
    if 3.0 * gamma >= 2.0:
        return ((3.0 * gamma - 2.0) + disc) / (8.0 * gamma)
    return 2.0 / (disc + 2.0 - 3.0 * gamma)


def _log_g(gamma: float, log_eps: float, log_1m_eps: float) -> tuple[float, float]:
    """(log of g(eps)/||Vu||, w) of docs/theory.md §5, from the log-masses."""
    t = log_eps - log_1m_eps + gamma  # logit of w
    log_w, log_v = log_sigmoid(t), log_sigmoid(-t)
    val = 0.5 * (log_1m_eps - log_eps) + log_w + math.log1p(math.exp(log_v) * gamma)
    return val, math.exp(log_w)


@dataclass(frozen=True, eq=False)
class TwoDirac:
    r"""Two Diracs :math:`(1-\varepsilon)\delta_{x_0}+\varepsilon\delta_{x_1}` (docs/theory.md §5).

    Attributes
    ----------
    measure : DiracMeasure
        Atom 0 is the heavy atom :math:`x_0`, atom 1 the light atom :math:`x_1`; its
        ``log_weights`` are exact even where ``weights`` underflow (:math:`\gamma\gtrsim 700`).
    gamma : float
        Gap :math:`\gamma = x_0^\top A(x_1-x_0)`.
    case : str
        ``"+"`` (:math:`(x_0,x_1)=(\frac R2u,Ru)`) or ``"-"`` (:math:`(Ru,-Ru)`).
    u : Tensor, shape (d,)
    lam : float
        :math:`u^\top Au`.
    log_eps, log_1m_eps : float
        :math:`\log\varepsilon` and :math:`\log(1-\varepsilon)`.
    w : float
        Attention the heavy atom pays to the light one.
    log_g : float
        :math:`\log\big(g(\varepsilon)/\|Vu\|\big)`.
    g : float or None
        :math:`g(\varepsilon)` when a value map is known (``inf`` on overflow).
    """

    measure: DiracMeasure
    gamma: float
    case: str
    u: Tensor
    lam: float
    log_eps: float
    log_1m_eps: float
    w: float
    log_g: float
    g: float | None

    @property
    def eps(self) -> float:
        r"""The light mass :math:`\varepsilon` (0.0 once it underflows; see ``log_eps``)."""
        return math.exp(self.log_eps)


def two_dirac(
    A: Tensor | Params,
    R: float,
    *,
    eps: float | None = None,
    log_eps: float | None = None,
    case: Case = "auto",
    variant: Variant = "symmetric",
    V: Tensor | None = None,
    head: int | None = None,
    eigvecs: Literal["code", "score"] = "code",
) -> TwoDirac:
    r"""Two unbalanced Diracs at the exact optimal light mass and their bound (docs/theory.md §5).

    :math:`\mu_\varepsilon=(1-\varepsilon)\delta_{x_0}+\varepsilon\delta_{x_1}` with
    :math:`(x_0,x_1)=(\frac R2u,Ru)`, :math:`\gamma=\lambda R^2/4` (case +) or :math:`(Ru,-Ru)`,
    :math:`\gamma=2|\lambda|R^2` (case −). Moving the light atom along :math:`u`,

    .. math::
        \mathrm{Lip}(F\,|\,\mathcal P(B_R))\ \ge\ g(\varepsilon)=\sqrt{\tfrac{1-\varepsilon}
        {\varepsilon}}\,w\,\big(1+(1-w)\gamma\big)\|Vu\|,\qquad
        w=\frac{\varepsilon e^\gamma}{\varepsilon e^\gamma+1-\varepsilon}.

    Without ``eps``, the light mass is the exact maximiser: :math:`v^*=1-w^*` is the root in
    :math:`(0,1)` of :math:`4\gamma v^2-(3\gamma-2)v-1=0` and
    :math:`\log\frac{\varepsilon^*}{1-\varepsilon^*}=\log\frac{w^*}{v^*}-\gamma`, so both
    log-masses are log-sigmoids, exact for any :math:`\gamma` (tested up to 1000, where
    :math:`\varepsilon^*\approx e^{-1000}/3` is far below the smallest float64).

    Parameters
    ----------
    A : Tensor, shape (d, d), or AttentionParams or MultiHeadParams
    R : float
    eps : float, optional
        Light mass in (0, 1) (default: the optimum).
    log_eps : float, optional
        :math:`\log\varepsilon<0` instead of ``eps`` (masses below float64).
    case : {"auto", "+", "-"}, default "auto"
        ``"auto"``: the larger gap (the −8 rule).
    variant : {"symmetric", "released"}, default "symmetric"
        Extremes of :math:`u^\top Au` (best gap, docs/theory.md §5) or real eigenvalues of the
        score matrix (the released code).
    V : Tensor, shape (d_v, d), optional
        Value map for ``g``; default: that of a single-head ``A``.
    head : int, optional
    eigvecs : {"code", "score"}, default "code"

    Returns
    -------
    TwoDirac

    Notes
    -----
    Provenance: the positions are *from the authors' released code*; the bound and the optimum are
    *derived and checked numerically*; the mechanism is *stated in the paper (v1 abstract)*.
    """
    R = check_radius(R)
    A_mat, V_default = _head(A, head)
    V_mat = _value_matrix(V if V is not None else V_default, A_mat)
    hi, lo = extreme_directions(A_mat, variant, eigvecs)
    case_out, dirn = _choose_case(hi, lo, case)
    gamma = max(score_gap(case_out, dirn.lam, R), 0.0)
    if eps is not None and log_eps is not None:
        raise ValueError("give eps or log_eps, not both")
    if log_eps is not None:
        le = float(log_eps)
        if not (le < 0 and math.isfinite(le)):
            raise ValueError(f"log_eps must be finite and < 0, got {le}")
        l1m = math.log(-math.expm1(le)) if le > -math.log(2.0) else math.log1p(-math.exp(le))
    elif eps is not None:
        e = float(eps)
        if not 0 < e < 1:
            raise ValueError(f"eps must lie in (0, 1), got {e}")
        le, l1m = math.log(e), math.log1p(-e)
    else:
        le, l1m = optimal_log_masses(gamma)  # log-sigmoids of the logit of eps*
    x1, x0 = two_positions(case_out, dirn.u, R)
    pts = torch.stack([x0, x1]).to(dtype=A_mat.dtype, device=A_mat.device)
    lw = torch.tensor([l1m, le], dtype=torch.float64, device=A_mat.device)
    mu = DiracMeasure.from_log_weights(pts, lw.to(A_mat.dtype))
    lg, w = _log_g(gamma, le, l1m)
    g = None
    if V_mat is not None:
        Vu = float(torch.linalg.vector_norm(as_float64(V_mat) @ dirn.u))
        g = math.exp(lg) * Vu if lg < 700 else (math.inf if Vu > 0 else 0.0)
    return TwoDirac(mu, gamma, case_out, dirn.u.to(A_mat), dirn.lam, le, l1m, w, lg, g)


def two_dirac_measure(
    A: Tensor | Params,
    R: float,
    *,
    eps: float | None = None,
    case: Case = "auto",
    variant: Variant = "symmetric",
    head: int | None = None,
    log_eps: float | None = None,
) -> DiracMeasure:
    r"""The two-Dirac measure of docs/theory.md §5 (heavy atom first); see :func:`two_dirac`.

    .. math:: \mu=(1-\varepsilon)\delta_{x_0}+\varepsilon\delta_{x_1},\qquad
              \varepsilon=\varepsilon^*\ \text{(exact optimum) unless given}.

    Parameters
    ----------
    A : Tensor, shape (d, d), or AttentionParams or MultiHeadParams
    R : float
    eps : float, optional
    case : {"auto", "+", "-"}, default "auto"
    variant : {"symmetric", "released"}, default "symmetric"
    head : int, optional
    log_eps : float, optional

    Returns
    -------
    DiracMeasure
        Two atoms; ``log_weights`` exact (built from log-space), so :math:`\varepsilon\sim10^{-300}`
        and below survive.

    Notes
    -----
    Provenance as in :func:`two_dirac`.
    """
    return two_dirac(A, R, eps=eps, log_eps=log_eps, case=case, variant=variant, head=head).measure


@dataclass(frozen=True, eq=False)
class OffAxisTwoAtoms:
    r"""The maximised off-axis two-atom bound (docs/theory.md §A3).

    Attributes
    ----------
    value : float
        :math:`e^{\gamma/2}\sqrt{w(1-w)}\,\|V(h+(1-w)(y^\top Ah)(x-y))\|` (``inf`` on overflow).
    log_value : float
    x, y, h : Tensor, shape (d,)
        Light atom, heavy atom, unit direction moving the light atom.
    w : float
        Attention of the heavy atom to the light one.
    gamma : float
        Logit gap :math:`\gamma=y^\top A(x-y)` seen by the heavy atom (on the axis, the
        :math:`\gamma` of :func:`two_dirac`).
    measure : DiracMeasure
        :math:`(1-\varepsilon)\delta_y+\varepsilon\delta_x` with
        :math:`\log\frac{\varepsilon}{1-\varepsilon}=\log\frac w{1-w}-\gamma` (exact log-masses).
    axis_value : float
        Best on-axis value (the docs/theory.md §5 optimum over both cases, symmetric variant).
    history : Tensor, shape (n_starts, n_records)
        :math:`\log` value per start, subsampled over the steps.
    """

    value: float
    log_value: float
    x: Tensor
    y: Tensor
    h: Tensor
    w: float
    gamma: float
    measure: DiracMeasure
    axis_value: float
    history: Tensor


def off_axis_two_atoms(
    params: Params,
    R: float,
    *,
    n_restarts: int | None = None,
    steps: int | None = None,
    lr: float | None = None,
    seed: int | None = None,
) -> OffAxisTwoAtoms:
    r"""Maximise the general two-atom lower bound over :math:`x,y\in B_R`, unit :math:`h`, :math:`w`.

    .. math:: \mathrm{Lip}(F\,|\,\mathcal P(B_R))\ \ge\ e^{\gamma/2}\sqrt{w(1-w)}\;
              \big\|V\big(h+(1-w)\,(y^\top Ah)\,(x-y)\big)\big\|,\qquad \gamma=y^\top A(x-y)

    (docs/theory.md §A3): light atom :math:`x`, heavy atom :math:`y`, the light atom moved along
    :math:`h`, :math:`w\in(0,1)` the heavy atom's attention to it (any :math:`w` is reached by the
    mass :math:`\varepsilon/(1-\varepsilon)=e^{-\gamma}w/(1-w)`). Multi-start Adam on the logarithm,
    with :math:`x,y=R\tanh(\|z\|)z/\|z\|`, :math:`h=z_h/\|z_h\|`, :math:`w=\sigma(t)`, started from
    both on-axis optima (docs/theory.md §5) and random points; the best iterate is kept, so the
    result is never below the on-axis optimum.

    Parameters
    ----------
    params : AttentionParams
        One head (a :class:`MultiHeadParams` with one head is accepted). Biases are ignored.
    R : float
    n_restarts : int, default 16
        Random starts (in addition to the on-axis starts).
    steps : int, default 400
    lr : float, default 0.05
    seed : int, default 0

    Returns
    -------
    OffAxisTwoAtoms

    Notes
    -----
    On the axis (:math:`x=Ru`, :math:`y=\frac R2u`, :math:`h=u`) the bound is :math:`g` of
    docs/theory.md §5; in :math:`d\ge2` with indefinite :math:`A` off-axis configurations can be
    better. Provenance: *derived and checked numerically*; not in any source.
    """
    opts, gen = resolve_options(
        OFF_AXIS_DEFAULTS, "off_axis_two_atoms", n_restarts, steps, lr, seed
    )
    R = check_radius(R)
    A, V = (as_float64(t) for t in single_head_matrices(params, "off_axis_two_atoms"))
    d, dev = A.shape[0], A.device

    # on-axis starts
    starts_x, starts_y, starts_h, starts_t = [], [], [], []
    axis_best = -math.inf
    hi, lo = symmetric_directions(A)
    for c, dirn in (("+", hi), ("-", lo)):
        if (c == "+" and dirn.lam > 0) or (c == "-" and dirn.lam < 0):
            gamma = score_gap(c, dirn.lam, R)
            x1, x0 = two_positions(c, dirn.u, R)
            v = optimal_direction_v(gamma)
            starts_x.append(x1)
            starts_y.append(x0)
            starts_h.append(dirn.u)
            starts_t.append(math.log((1 - v) / v))
            Vu = float(torch.linalg.vector_norm(V @ dirn.u))
            if Vu > 0:
                axis_best = max(
                    axis_best, _log_g(gamma, *optimal_log_masses(gamma))[0] + math.log(Vu)
                )
    n_r = opts.n_restarts
    Xr = torch.randn(n_r, 2, d, generator=gen, dtype=torch.float64).to(dev)
    Hr = torch.randn(n_r, d, generator=gen, dtype=torch.float64).to(dev)
    Tr = torch.randn(n_r, generator=gen, dtype=torch.float64).to(dev)
    Zx = torch.cat([from_ball(torch.stack(starts_x), R), Xr[:, 0]]) if starts_x else Xr[:, 0]
    Zy = torch.cat([from_ball(torch.stack(starts_y), R), Xr[:, 1]]) if starts_y else Xr[:, 1]
    Hz = torch.cat([torch.stack(starts_h), Hr]) if starts_h else Hr
    T0 = torch.tensor(starts_t, dtype=torch.float64, device=dev)
    Tz = torch.cat([T0, Tr])

    def log_bound(x: Tensor, y: Tensor, hz: Tensor, t: Tensor) -> Tensor:
        h = hz / torch.linalg.vector_norm(hz, dim=-1, keepdim=True)
        gap = ((y @ A) * (x - y)).sum(-1)
        yAh = ((y @ A) * h).sum(-1)
        vec = h + ((1 - torch.sigmoid(t)) * yAh).unsqueeze(-1) * (x - y)
        nrm = torch.linalg.vector_norm(vec @ V.mT, dim=-1)
        return (
            gap / 2
            + 0.5 * (torch.nn.functional.logsigmoid(t) + torch.nn.functional.logsigmoid(-t))
            + torch.log(nrm)
        )

    def objective(zx: Tensor, zy: Tensor, hz: Tensor, t: Tensor) -> Tensor:
        return log_bound(to_ball(zx, R), to_ball(zy, R), hz, t)

    best, best_p, hist, _ = ascend_restarts(
        objective, [Zx, Zy, Hz, Tz], [opts.lr] * 4, opts.steps, log_objective=True
    )
    # exact (unshrunk) on-axis candidates
    k = int(best.argmax())
    lv = float(best[k])
    x, y = to_ball(best_p[0][k], R), to_ball(best_p[1][k], R)
    hz, t = best_p[2][k], best_p[3][k]
    if starts_x:
        ex = log_bound(torch.stack(starts_x), torch.stack(starts_y), torch.stack(starts_h), T0)
        j = int(ex.argmax())
        if float(ex[j]) > lv:
            lv = float(ex[j])
            x, y, hz, t = starts_x[j], starts_y[j], starts_h[j], T0[j]
    h = hz / torch.linalg.vector_norm(hz)
    gap = float((y @ A) @ (x - y))
    tt = float(t) - gap  # logit of eps
    lw = torch.tensor([log_sigmoid(-tt), log_sigmoid(tt)], dtype=torch.float64, device=dev)
    like = params.heads[0].A
    reject_variants(params, "this construction")
    mu = DiracMeasure.from_log_weights(torch.stack([y, x]).to(like), lw.to(like.dtype))
    return OffAxisTwoAtoms(
        value=math.exp(lv) if lv < 709 else math.inf,
        log_value=lv,
        x=x.to(like),
        y=y.to(like),
        h=h.to(like),
        w=float(torch.sigmoid(t)),
        gamma=gap,
        measure=mu,
        axis_value=math.exp(axis_best) if axis_best < 709 else math.inf,
        history=hist,
    )


def optimal_log_masses(gamma: float) -> tuple[float, float]:
    v = optimal_direction_v(gamma)
    t = math.log((1.0 - v) / v) - gamma
    return log_sigmoid(t), log_sigmoid(-t)
