r"""Adversarial inputs: closed-form constructions, worst-case searches and mass splitting.

Notation (THEORY.md §1.5): one head has score matrix :math:`A` (score :math:`x_i^\top Ax_j`, query
:math:`i`, key :math:`j`) and value matrix :math:`V`; :math:`u` is a unit direction with Rayleigh
quotient :math:`\lambda=u^\top Au`; :math:`\gamma` (``s`` in the splitting functions) is the logit
gap of a construction; :math:`p` the attention a copy pays to the distinguished token;
:math:`\varepsilon` the light mass and :math:`w` the attention the heavy atom pays to it;
:math:`\mu=\sum_ia_i\delta_{x_i}` a weighted measure in the ball :math:`B_R`.

Contents

* :func:`adversarial_sequence`: one token plus :math:`n-1` copies (THEORY.md §6.3, §9), in the
  released variant (real eigenvectors of the score matrix, the "−8 rule"), the symmetric-part
  variant, and a variant on the sphere of radius :math:`R` (what LayerNorm imposes; derived here).
* :func:`two_dirac`, :func:`two_dirac_measure`: the two unbalanced Diracs of §7.2 at the exact
  optimal mass, built from log-masses; :func:`off_axis_two_atoms`: the §7.3 bound maximised.
* :func:`worst_case_measure`, :func:`worst_case_sequence`: multi-start gradient ascent of the exact
  local constant (§5.1–§5.4, §7.4), started from the constructions.
* :func:`split_gain`, :func:`optimal_split_k`, :func:`split_constant`,
  :func:`mass_splitting_attack`: mass splitting (§12) and perturbations that change the number of
  tokens (§3.2), measured with exact :math:`W_2` (and :math:`W_\infty`) on both sides.

Provenance (THEORY.md §0): the eigenvector construction and the two-Dirac positions are *from the
authors' released code*; every bound and closed form here is *derived and checked numerically*
(tests/test_attacks.py); the phenomena (tight √n rate, unbalanced worst measures, mass splitting)
are *stated in the paper (abstract)* of Castin, Ablin & Peyré, "How Smooth Is Attention?", ICML
2024, arXiv 2312.14820 (v2; v1 for the two-Dirac and mass-splitting material). No theorem number is
cited: none is known for these results.

Tensors in, tensors out: returned points follow the dtype and device of the inputs; every
computation runs in float64 (the reference precision); scalar summaries are Python floats.
Nothing prints. The searches are small dense problems; on machines where intra-op threading of tiny
tensors is slow, ``torch.set_num_threads(1)`` speeds them up considerably.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torch.func import jacrev

from ._numerics import as_float_tensor, check_finite
from .attention import attention_points
from .distances import wasserstein, wasserstein_inf
from .measures import DiracMeasure
from .params import AttentionParams, MultiHeadParams

__all__ = [
    "AdversarialSequence",
    "MassSplittingAttack",
    "OffAxisTwoAtoms",
    "Perturbation",
    "TwoDirac",
    "WorstCaseMeasure",
    "WorstCaseSequence",
    "adversarial_sequence",
    "mass_splitting_attack",
    "off_axis_two_atoms",
    "optimal_split_k",
    "split_constant",
    "split_gain",
    "two_dirac",
    "two_dirac_measure",
    "worst_case_measure",
    "worst_case_sequence",
]

Params = AttentionParams | MultiHeadParams
Variant = Literal["released", "symmetric"]
Case = Literal["auto", "+", "-"]
Geometry = Literal["wasserstein", "split"]

#: Smallest log-mass used by the searches: e^-700 ~ 1e-304 stays a normal float64, so
#: sqrt(a_i / a_j) <= e^350 never overflows. Far below any moderate floor such as 1e-14 (§7.4).
LOG_MASS_FLOOR = -700.0
#: Relative tolerance deciding that an eigenvalue of A is real (imaginary part ~ 0).
_REAL_EIG_RTOL = 1e-9
#: Atoms on the sphere of radius R are pulled inside by this relative amount before inverting the
#: ball parametrisation x = R tanh(|z|) z/|z| (atanh(1) is infinite).
_BALL_SHRINK = 1e-7


# =============================================================================================
# small helpers
# =============================================================================================
def _f64(t: Tensor) -> Tensor:
    return t.detach().to(torch.float64)


def _params64(params: Params) -> Params:
    return params.to(dtype=torch.float64)


def _check_R(R: float) -> float:
    R = float(R)
    if not (math.isfinite(R) and R > 0):
        raise ValueError(f"R must be a positive finite number, got {R}")
    return R


def _log_sigmoid(x: float) -> float:
    """``log(1 / (1 + e^-x))`` without overflow (x may be +-inf)."""
    if x == math.inf:
        return 0.0
    if x >= 0:
        return -math.log1p(math.exp(-x))
    return x - math.log1p(math.exp(x))


def _sign_fix(v: Tensor) -> Tensor:
    """Unit vector with its largest-magnitude entry positive (a deterministic sign)."""
    v = v / torch.linalg.vector_norm(v)
    return v if v[v.abs().argmax()] >= 0 else -v


def _measure_from_log_weights(
    points: Tensor, log_weights: Tensor, positions: Tensor | None = None
) -> DiracMeasure:
    """See :meth:`DiracMeasure.from_log_weights` (exact log-masses below the float range)."""
    return DiracMeasure.from_log_weights(points, log_weights, positions)


def _head(A_or_params: Tensor | Params, head: int | None) -> tuple[Tensor, Tensor | None]:
    """Score matrix of the chosen head and the value map of the (single-head) layer, if defined."""
    if isinstance(A_or_params, MultiHeadParams):
        h = 0 if head is None else int(head)
        if not 0 <= h < A_or_params.n_heads:
            raise IndexError(f"head {h} out of range for a layer with {A_or_params.n_heads} heads")
        A = A_or_params.heads[h].A
        V = A_or_params.head_output_matrix(0) if A_or_params.n_heads == 1 else None
        return A, V
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
# §6.3  directions and gaps
# =============================================================================================
@dataclass(frozen=True)
class _Direction:
    lam: float  # Rayleigh quotient u^T A u
    u: Tensor  # (d,) float64 unit


def _extreme_directions(
    A: Tensor, variant: str, eigvecs: str
) -> tuple[_Direction | None, _Direction | None]:
    """Directions of the largest and smallest Rayleigh quotient (released or symmetric rule)."""
    A64 = _f64(A)
    if variant == "symmetric":
        evals, evecs = torch.linalg.eigh(0.5 * (A64 + A64.mT))
        lo, hi = _sign_fix(evecs[:, 0]), _sign_fix(evecs[:, -1])
        return (
            _Direction(float(hi @ A64 @ hi), hi),
            _Direction(float(lo @ A64 @ lo), lo),
        )
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
        u = _sign_fix(v.real.to(torch.float64))
        dirs.append(_Direction(float(u @ A64 @ u), u))
    dirs.sort(key=lambda t: t.lam)
    return dirs[-1], dirs[0]


def _choose_case(hi: _Direction | None, lo: _Direction | None, case: str) -> tuple[str, _Direction]:
    """The −8 rule (THEORY.md §6.3): case + iff lambda_max > -8 lambda_min, i.e. the larger gap."""
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


def _gap(case: str, lam: float, R: float) -> float:
    return lam * R * R / 4.0 if case == "+" else -2.0 * lam * R * R


def _two_positions(case: str, u: Tensor, R: float) -> tuple[Tensor, Tensor]:
    """(distinguished / light token, copies / heavy token) of THEORY.md §6.3 and §7.2."""
    if case == "+":
        return R * u, 0.5 * R * u
    return -R * u, R * u


# ---------------------------------------------------------------------------- sphere variant
def _sphere_direction(A: Tensor, *, n_random: int = 8, seed: int = 0) -> tuple[Tensor, float]:
    r"""Maximise :math:`\varphi(b)=\|A^\top b\|-b^\top Ab` over unit :math:`b` (multi-start L-BFGS)."""
    A64 = _f64(A)
    d = A64.shape[0]
    S = 0.5 * (A64 + A64.mT)
    starts = [torch.linalg.eigh(S)[1].mT, torch.linalg.svd(A64)[0].mT]
    g = torch.Generator(device="cpu").manual_seed(seed)
    starts.append(torch.randn(n_random, d, generator=g, dtype=torch.float64).to(A64.device))
    Z0 = torch.cat([torch.cat([s, -s]) for s in starts[:2]] + [starts[2]])

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
    return _sign_fix(b), float(vals[k])


# =============================================================================================
# 1. the eigenvector construction
# =============================================================================================
@dataclass(frozen=True, eq=False)
class AdversarialSequence:
    r"""One token plus :math:`n-1` copies (THEORY.md §6.3).

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
    r"""The eigenvector construction: one token plus :math:`n-1` copies (THEORY.md §6.3).

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
    All tokens on the sphere :math:`\|x\|=R`, as LayerNorm imposes (THEORY.md §2.5). With copies at
    :math:`y=Rb` and token 1 at :math:`x_1=Ra` (unit :math:`a,b`) the gap is
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
    (EXPERIMENTS.md §1.4); the bound and the sphere variant are *derived and checked numerically*;
    tightness "for reasonable sequence lengths" is *stated in the paper (abstract)*. Biases of the
    head are ignored, as in the released code.
    """
    R = _check_R(R)
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    A_mat, V_default = _head(A, head)
    V_mat = _value_matrix(V if V is not None else V_default, A_mat)
    A64 = _f64(A_mat)
    d = A64.shape[0]
    log_m = math.log(n - 1) if n > 1 else -math.inf

    if sphere:
        if d < 2:
            raise ValueError("the sphere variant needs d >= 2 (in d = 1 the sphere is two points)")
        b, phi = _sphere_direction(A64, seed=seed)
        Atb = A64.mT @ b
        a = Atb / torch.linalg.vector_norm(Atb) if float(torch.linalg.vector_norm(Atb)) > 0 else b
        gamma = R * R * phi
        x1, y = R * a, R * b
        p = math.exp(_log_sigmoid(gamma - log_m))
        M = torch.eye(d, dtype=torch.float64, device=A64.device) + (1 - p) * torch.outer(
            x1 - y, A64.mT @ y
        )
        PT = torch.eye(d, dtype=torch.float64, device=A64.device) - torch.outer(a, a)
        Vm = (
            _f64(V_mat)
            if V_mat is not None
            else torch.eye(d, dtype=torch.float64, device=A64.device)
        )
        _, sv, Vh = torch.linalg.svd(Vm @ M @ PT)
        direction = Vh[0]
        lower = math.sqrt(n - 1) * p * float(sv[0]) if V_mat is not None else None
        u, lam, case_out = b, float(b @ A64 @ b), "sphere"
    else:
        hi, lo = _extreme_directions(A64, variant, eigvecs)
        case_out, dirn = _choose_case(hi, lo, case)
        u, lam = dirn.u, dirn.lam
        gamma = max(_gap(case_out, lam, R), 0.0)
        x1, y = _two_positions(case_out, u, R)
        p = math.exp(_log_sigmoid(gamma - log_m))
        direction = u
        lower = None
        if V_mat is not None:
            Vu = float(torch.linalg.vector_norm(_f64(V_mat) @ u))
            lower = math.sqrt(n - 1) * p * (1.0 + (1.0 - p) * gamma) * Vu
    X = torch.cat([x1.unsqueeze(0), y.unsqueeze(0).expand(n - 1, d)]) if n > 1 else x1.unsqueeze(0)
    like = A_mat
    return AdversarialSequence(
        X=X.to(dtype=like.dtype, device=like.device),
        gamma=float(gamma),
        case=case_out,
        u=u.to(dtype=like.dtype, device=like.device),
        lam=lam,
        p=p,
        lower_bound=lower,
        direction=direction.to(dtype=like.dtype, device=like.device),
        variant="sphere" if sphere else variant,
        R=R,
        n=n,
    )


# =============================================================================================
# 2. two Diracs (§7.2) and the off-axis bound (§7.3)
# =============================================================================================
def _optimal_v(gamma: float) -> float:
    r"""Root in (0, 1) of :math:`4\gamma v^2-(3\gamma-2)v-1=0`, without cancellation."""
    disc = math.sqrt(9.0 * gamma * gamma + 4.0 * gamma + 4.0)
    if 3.0 * gamma >= 2.0:
        return ((3.0 * gamma - 2.0) + disc) / (8.0 * gamma)
    return 2.0 / (disc + 2.0 - 3.0 * gamma)


def _log_g(gamma: float, log_eps: float, log_1m_eps: float) -> tuple[float, float]:
    """(log of g(eps)/||Vu||, w) of THEORY.md §7.2, from the log-masses."""
    t = log_eps - log_1m_eps + gamma  # logit of w
    log_w, log_v = _log_sigmoid(t), _log_sigmoid(-t)
    val = 0.5 * (log_1m_eps - log_eps) + log_w + math.log1p(math.exp(log_v) * gamma)
    return val, math.exp(log_w)


@dataclass(frozen=True, eq=False)
class TwoDirac:
    r"""Two unbalanced Diracs :math:`(1-\varepsilon)\delta_{x_0}+\varepsilon\delta_{x_1}` (§7.2).

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
    r"""Two unbalanced Diracs at the exact optimal light mass, with their bound (THEORY.md §7.2).

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
        Extremes of :math:`u^\top Au` (best gap, THEORY.md §7.2) or real eigenvalues of the score
        matrix (the released code).
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
    R = _check_R(R)
    A_mat, V_default = _head(A, head)
    V_mat = _value_matrix(V if V is not None else V_default, A_mat)
    hi, lo = _extreme_directions(A_mat, variant, eigvecs)
    case_out, dirn = _choose_case(hi, lo, case)
    gamma = max(_gap(case_out, dirn.lam, R), 0.0)
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
        v = _optimal_v(gamma)
        t = math.log((1.0 - v) / v) - gamma  # logit of eps*
        le, l1m = _log_sigmoid(t), _log_sigmoid(-t)
    x1, x0 = _two_positions(case_out, dirn.u, R)
    pts = torch.stack([x0, x1]).to(dtype=A_mat.dtype, device=A_mat.device)
    lw = torch.tensor([l1m, le], dtype=torch.float64, device=A_mat.device)
    mu = _measure_from_log_weights(pts, lw.to(A_mat.dtype))
    lg, w = _log_g(gamma, le, l1m)
    g = None
    if V_mat is not None:
        Vu = float(torch.linalg.vector_norm(_f64(V_mat) @ dirn.u))
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
    r"""The two-Dirac measure of THEORY.md §7.2 (heavy atom first); see :func:`two_dirac`.

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
    r"""The maximised off-axis two-atom bound (THEORY.md §7.3).

    Attributes
    ----------
    value : float
        :math:`e^{s/2}\sqrt{w(1-w)}\,\|V(h+(1-w)(y^\top Ah)(x-y))\|` (``inf`` on overflow).
    log_value : float
    x, y, h : Tensor, shape (d,)
        Light atom, heavy atom, unit direction moving the light atom.
    w : float
        Attention of the heavy atom to the light one.
    s : float
        :math:`y^\top A(x-y)`.
    measure : DiracMeasure
        :math:`(1-\varepsilon)\delta_y+\varepsilon\delta_x` with
        :math:`\log\frac{\varepsilon}{1-\varepsilon}=\log\frac w{1-w}-s` (exact log-masses).
    axis_value : float
        Best on-axis value (the §7.2 optimum over both cases, symmetric variant).
    history : Tensor, shape (n_starts, n_records)
        :math:`\log` value per start, subsampled over the steps.
    """

    value: float
    log_value: float
    x: Tensor
    y: Tensor
    h: Tensor
    w: float
    s: float
    measure: DiracMeasure
    axis_value: float
    history: Tensor


def _ball(Z: Tensor, R: float) -> Tensor:
    r"""Points :math:`R\tanh(\|z\|)z/\|z\|` of the open ball (smooth at 0)."""
    r = torch.sqrt(Z.square().sum(-1, keepdim=True) + 1e-200)
    return R * (torch.tanh(r) / r) * Z


def _ball_inverse(X: Tensor, R: float) -> Tensor:
    r = torch.linalg.vector_norm(X, dim=-1, keepdim=True)
    rr = (r / R).clamp(max=1.0 - _BALL_SHRINK)
    scale = torch.where(r > 0, torch.atanh(rr) / torch.where(r > 0, r, torch.ones_like(r)), 0.0)
    return X * scale


def _sphere(Z: Tensor, R: float) -> Tensor:
    return R * Z / torch.sqrt(Z.square().sum(-1, keepdim=True) + 1e-200)


def _single_head(params: Params, what: str) -> tuple[Tensor, Tensor]:
    if isinstance(params, AttentionParams):
        return params.A, params.V
    if isinstance(params, MultiHeadParams) and params.n_heads == 1:
        return params.heads[0].A, params.head_output_matrix(0)
    raise ValueError(f"{what} is a single-head bound: pass AttentionParams (or one head)")


def off_axis_two_atoms(
    params: Params,
    R: float,
    *,
    n_restarts: int = 16,
    steps: int = 400,
    lr: float = 0.05,
    seed: int = 0,
    generator: torch.Generator | None = None,
) -> OffAxisTwoAtoms:
    r"""Maximise the general two-atom lower bound over :math:`x,y\in B_R`, unit :math:`h`, :math:`w`.

    .. math:: \mathrm{Lip}(F\,|\,\mathcal P(B_R))\ \ge\ e^{s/2}\sqrt{w(1-w)}\;
              \big\|V\big(h+(1-w)\,(y^\top Ah)\,(x-y)\big)\big\|,\qquad s=y^\top A(x-y)

    (THEORY.md §7.3): light atom :math:`x`, heavy atom :math:`y`, the light atom moved along
    :math:`h`, :math:`w\in(0,1)` the heavy atom's attention to it (any :math:`w` is reached by the
    mass :math:`\varepsilon/(1-\varepsilon)=e^{-s}w/(1-w)`). Multi-start Adam on the logarithm,
    with :math:`x,y=R\tanh(\|z\|)z/\|z\|`, :math:`h=z_h/\|z_h\|`, :math:`w=\sigma(t)`, started from
    both on-axis optima (§7.2) and random points; the best iterate is kept, so the result is never
    below the on-axis optimum.

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
    generator : torch.Generator, optional
        Overrides ``seed``.

    Returns
    -------
    OffAxisTwoAtoms

    Notes
    -----
    On the axis (:math:`x=Ru`, :math:`y=\frac R2u`, :math:`h=u`) the bound is :math:`g` of §7.2; in
    :math:`d\ge2` with indefinite :math:`A` off-axis configurations can be better. Provenance:
    *derived and checked numerically*; not in any source.
    """
    R = _check_R(R)
    A, V = (t.detach().to(torch.float64) for t in _single_head(params, "off_axis_two_atoms"))
    d = A.shape[0]
    dev = A.device
    gen = generator if generator is not None else torch.Generator(device="cpu").manual_seed(seed)

    # on-axis starts
    starts_x, starts_y, starts_h, starts_t = [], [], [], []
    axis_best = -math.inf
    hi, lo = _extreme_directions(A, "symmetric", "code")
    for c, dirn in (("+", hi), ("-", lo)):
        if (c == "+" and dirn.lam > 0) or (c == "-" and dirn.lam < 0):
            gamma = _gap(c, dirn.lam, R)
            x1, x0 = _two_positions(c, dirn.u, R)
            v = _optimal_v(gamma)
            starts_x.append(x1)
            starts_y.append(x0)
            starts_h.append(dirn.u)
            starts_t.append(math.log((1 - v) / v))
            Vu = float(torch.linalg.vector_norm(V @ dirn.u))
            if Vu > 0:
                axis_best = max(axis_best, _log_g(gamma, *_opt_logs(gamma))[0] + math.log(Vu))
    n_r = int(n_restarts)
    Xr = torch.randn(n_r, 2, d, generator=gen, dtype=torch.float64).to(dev)
    Hr = torch.randn(n_r, d, generator=gen, dtype=torch.float64).to(dev)
    Tr = torch.randn(n_r, generator=gen, dtype=torch.float64).to(dev)
    Zx = torch.cat([_ball_inverse(torch.stack(starts_x), R), Xr[:, 0]]) if starts_x else Xr[:, 0]
    Zy = torch.cat([_ball_inverse(torch.stack(starts_y), R), Xr[:, 1]]) if starts_y else Xr[:, 1]
    Hz = torch.cat([torch.stack(starts_h), Hr]) if starts_h else Hr
    Tz = torch.cat([torch.tensor(starts_t, dtype=torch.float64, device=dev), Tr])

    def log_bound(x: Tensor, y: Tensor, hz: Tensor, t: Tensor) -> Tensor:
        h = hz / torch.linalg.vector_norm(hz, dim=-1, keepdim=True)
        s = ((y @ A) * (x - y)).sum(-1)
        yAh = ((y @ A) * h).sum(-1)
        vec = h + ((1 - torch.sigmoid(t)) * yAh).unsqueeze(-1) * (x - y)
        nrm = torch.linalg.vector_norm(vec @ V.mT, dim=-1)
        return (
            s / 2
            + 0.5 * (torch.nn.functional.logsigmoid(t) + torch.nn.functional.logsigmoid(-t))
            + torch.log(nrm)
        )

    def objective(zx: Tensor, zy: Tensor, hz: Tensor, t: Tensor) -> Tensor:
        return log_bound(_ball(zx, R), _ball(zy, R), hz, t)

    best, best_p, hist, _ = _ascend(
        objective, [Zx, Zy, Hz, Tz], [lr, lr, lr, lr], steps, log_objective=True
    )
    # exact (unshrunk) on-axis candidates
    k = int(best.argmax())
    lv = float(best[k])
    x, y = _ball(best_p[0][k], R), _ball(best_p[1][k], R)
    hz, t = best_p[2][k], best_p[3][k]
    if starts_x:
        ex = log_bound(
            torch.stack(starts_x),
            torch.stack(starts_y),
            torch.stack(starts_h),
            torch.tensor(starts_t, dtype=torch.float64, device=dev),
        )
        j = int(ex.argmax())
        if float(ex[j]) > lv:
            lv = float(ex[j])
            x, y, hz = starts_x[j], starts_y[j], starts_h[j]
            t = torch.tensor(starts_t[j], dtype=torch.float64, device=dev)
    h = hz / torch.linalg.vector_norm(hz)
    s = float((y @ A) @ (x - y))
    tt = float(t) - s  # logit of eps
    lw = torch.tensor([_log_sigmoid(-tt), _log_sigmoid(tt)], dtype=torch.float64, device=dev)
    like = params.heads[0].A
    mu = _measure_from_log_weights(torch.stack([y, x]).to(like), lw.to(like.dtype))
    return OffAxisTwoAtoms(
        value=math.exp(lv) if lv < 709 else math.inf,
        log_value=lv,
        x=x.to(like),
        y=y.to(like),
        h=h.to(like),
        w=float(torch.sigmoid(t)),
        s=s,
        measure=mu,
        axis_value=math.exp(axis_best) if axis_best < 709 else math.inf,
        history=hist,
    )


def _opt_logs(gamma: float) -> tuple[float, float]:
    v = _optimal_v(gamma)
    t = math.log((1.0 - v) / v) - gamma
    return _log_sigmoid(t), _log_sigmoid(-t)


# =============================================================================================
# generic multi-start ascent
# =============================================================================================
def _ascend(
    objective: Callable[..., Tensor],
    init: list[Tensor],
    lrs: list[float],
    steps: int,
    *,
    log_objective: bool = False,
    record_every: int | None = None,
    progress: bool = False,
    desc: str = "search",
) -> tuple[Tensor, list[Tensor], Tensor, Tensor]:
    """Adam ascent of a batch-separable objective; keeps the best iterate of every start.

    ``objective(*params)`` returns one value per start (first dimension). Maximises the value
    (``log_objective=True``) or its logarithm. Returns (best values (S,), best parameters, history
    (S, T) of the values at the recorded steps, recorded step indices (T,)). Values are on the
    objective's scale (log when ``log_objective``).
    """
    params = [p.detach().clone().requires_grad_(True) for p in init]
    opt = torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])
    S = params[0].shape[0]
    best = torch.full((S,), -math.inf, dtype=torch.float64, device=params[0].device)
    best_p = [p.detach().clone() for p in params]
    every = record_every or max(1, steps // 60)
    hist, rec = [], []
    it = range(steps + 1)
    if progress:
        try:
            from tqdm.auto import tqdm

            it = tqdm(it, desc=desc, leave=False)
        except ImportError:  # pragma: no cover
            pass
    for step in it:
        vals = objective(*params)
        score = vals if log_objective else torch.log(vals)
        v = torch.nan_to_num(score.detach(), nan=-math.inf)
        better = v > best
        if bool(better.any()):
            best = torch.where(better, v, best)
            for bp, p in zip(best_p, params):
                bp[better] = p.detach()[better]
        if step % every == 0 or step == steps:
            hist.append(v.clone())
            rec.append(step)
        if step == steps:
            break
        opt.zero_grad()
        loss = -torch.where(torch.isfinite(score), score, torch.zeros_like(score)).sum()
        loss.backward()
        for p in params:
            if p.grad is not None:
                torch.nan_to_num_(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
        opt.step()
    history = torch.stack(hist, dim=1)
    return best, best_p, history, torch.tensor(rec)


# =============================================================================================
# exact local constants from jacrev (small dense problems)
# =============================================================================================
def _batched_jacobian(fn: Callable[[Tensor], Tensor], X: Tensor) -> Tensor:
    """J[b] = d fn(X)[b] / d X[b], shape (B, n*d_out, n*d), for a batch-separable ``fn``."""
    B, n, d = X.shape
    J = jacrev(lambda Y: fn(Y).sum(0))(X)  # (n, d_out, B, n, d)
    return J.permute(2, 0, 1, 3, 4).reshape(B, -1, n * d)


def _measure_constant(
    X: Tensor,
    la: Tensor,
    params: Params,
    *,
    geometry: str,
    masked: bool,
    positions: Tensor | None,
) -> Tensor:
    r"""Exact :math:`L_W` (or :math:`L_{\mathrm{split}}`) for a batch of measures, differentiable.

    ``X`` (B, n, d), ``la`` (B, n) log-masses. :math:`L_W=\|D_a^{1/2}JD_a^{-1/2}\|_2` with the
    fixed-mass Jacobian :math:`J` from ``jacrev`` of :func:`attention_points`.
    """
    B, n, d = X.shape

    def fn(Y: Tensor) -> Tensor:
        return attention_points(Y, params, log_weights=la, masked=masked, positions=positions)

    J = _batched_jacobian(fn, X)
    d_out = J.shape[1] // n
    so = (0.5 * la).repeat_interleave(d_out, -1)
    si = (0.5 * la).repeat_interleave(d, -1)
    val = torch.linalg.matrix_norm(torch.exp(so[:, :, None] - si[:, None, :]) * J, ord=2)
    if geometry == "split":

        def gq(Q: Tensor) -> Tensor:
            return attention_points(
                X,
                params,
                log_weights=la,
                masked=masked,
                positions=positions,
                queries=Q,
                query_positions=positions,
            ).sum(0)

        S = jacrev(gq)(X)  # (n, d_out, B, n, d)
        idx = torch.arange(n, device=X.device)
        S = S[idx, :, :, idx, :].permute(2, 0, 1, 3)  # (B, n, d_out, d)
        val = torch.maximum(val, torch.linalg.matrix_norm(S, ord=2).amax(-1))
    return val


def _sequence_constant(X: Tensor, params: Params, *, masked: bool) -> Tensor:
    r"""Exact :math:`\|Df(X)\|_2` for a batch of sequences (B, n, d), differentiable."""

    def fn(Y: Tensor) -> Tensor:
        return attention_points(Y, params, masked=masked)

    return torch.linalg.matrix_norm(_batched_jacobian(fn, X), ord=2)


def _certify(
    x: Tensor | DiracMeasure, params: Params, geometry: str, masked: bool, value: float
) -> tuple[float, float, str]:
    """Certified bracket from meanfield.lipschitz when importable, else the dense SVD value."""
    try:
        from .lipschitz import local_lipschitz
    except ImportError:
        return value, value, "dense SVD"
    try:
        est = local_lipschitz(x, params, geometry=geometry, masked=masked, method="dense")
    except (NotImplementedError, AttributeError, TypeError) as err:  # engine unavailable here
        warnings.warn(f"local_lipschitz failed ({err}); bracket from the dense SVD", stacklevel=3)
        return value, value, "dense SVD"
    return float(est.lower), float(est.upper), f"local_lipschitz ({est.method}, {est.upper_method})"


# =============================================================================================
# 3. worst-case measures and sequences
# =============================================================================================
@dataclass(frozen=True, eq=False)
class WorstCaseMeasure:
    r"""Result of :func:`worst_case_measure`.

    Attributes
    ----------
    measure : DiracMeasure
        The best measure found (``n_atoms`` atoms; position-tagged when masked).
    value : float
        Its local constant (dense SVD in float64): :math:`L_W` or :math:`L_{\mathrm{split}}`.
    lower, upper : float
        Certified bracket (``bracket`` says how it was obtained).
    bracket : str
        ``"local_lipschitz (...)"`` or ``"dense SVD"`` (then ``lower = upper = value``).
    geometry : str
    construction_value : float
        Exact local constant of the best construction start (never above ``value``).
    two_dirac_bound : float or None
        Closed-form :math:`\sup_\varepsilon g` (§7.2, best gap) for one head, unmasked, in the ball.
    restart_values : Tensor, shape (n_starts,)
        Best value reached from every start.
    labels : tuple of str
        Kind of every start (``"two-dirac +"``, ``"two-dirac -"``, ``"init"``, ``"random"``).
    history : Tensor, shape (n_starts, n_records)
        Value per start at the recorded steps.
    history_steps : Tensor, shape (n_records,)
    """

    measure: DiracMeasure
    value: float
    lower: float
    upper: float
    bracket: str
    geometry: str
    construction_value: float
    two_dirac_bound: float | None
    restart_values: Tensor
    labels: tuple[str, ...]
    history: Tensor
    history_steps: Tensor


def _pad(pts: Tensor, lw: Tensor, n_atoms: int) -> tuple[Tensor, Tensor]:
    """Order atoms by increasing mass and pad to ``n_atoms`` by splitting the lightest one.

    Splitting keeps the measure (coincident copies share the mass, geometric ratio 1e-3), and
    the local constant of the split measure is at least that of the original (moving the copies
    together reproduces every perturbation of the original). The heavy atom comes last, so that in
    a causal measure it sees the light ones.
    """
    order = torch.argsort(lw)
    pts, lw = pts[order], lw[order]
    extra = n_atoms - pts.shape[0]
    if extra > 0:
        shares = torch.tensor(
            [-3.0 * math.log(10.0) * j for j in range(extra + 1)],
            dtype=torch.float64,
            device=lw.device,
        )
        shares = shares - torch.logsumexp(shares, 0)
        pts = torch.cat([pts[:1].expand(extra + 1, -1), pts[1:]])
        lw = torch.cat([lw[0] + shares, lw[1:]])
    return pts, lw


def _construction_starts(
    params: Params, R: float, n_atoms: int, sphere: bool
) -> tuple[list[Tensor], list[Tensor], list[str], float]:
    r"""Construction starts of every head and the best two-Dirac gap.

    * two Diracs (§7.2) in both cases at the exact optimal mass (sphere: the sphere positions);
    * for :math:`\lambda=u^\top Au>0`, the "balanced" light atom of the small-radius mechanism
      (§7.4): heavy atom at :math:`-Ru`, light atom at :math:`cRu` (:math:`c=0.7`) with mass
      :math:`e^{-\lambda R^2c(1+c)}`, so that the light atom's attention is split evenly;
    * for :math:`\lambda>0` and three atoms or more, the chain (heavy, tiny, tinier) of §7.4:
      :math:`-Ru`, :math:`cRu`, :math:`Ru` (:math:`c=0.5`) with log-masses :math:`0`,
      :math:`-\lambda R^2c(1+c)`, :math:`-2\lambda R^2c`, which balance the middle atom's
      attention across all three (the shape found by random multi-start searches).
    """
    pts, lws, labels = [], [], []
    best_gap = 0.0
    dev = params.device
    for h, head in enumerate(params.heads):
        A = _f64(head.A)
        suffix = f" (head {h})" if len(params.heads) > 1 else ""
        cands: list[tuple[str, float, list[Tensor], list[float]]] = []
        if sphere:
            if A.shape[0] < 2:
                continue
            b, phi = _sphere_direction(A)
            Atb = A.mT @ b
            if float(torch.linalg.vector_norm(Atb)) == 0:
                continue
            gamma = R * R * phi
            le, l1m = _opt_logs(gamma)
            x_light = R * Atb / torch.linalg.vector_norm(Atb)
            cands.append(("two-dirac sphere", gamma, [R * b, x_light], [l1m, le]))
        else:
            hi, lo = _extreme_directions(A, "symmetric", "code")
            for c, dirn in (("+", hi), ("-", lo)):
                if (c == "+" and dirn.lam > 0) or (c == "-" and dirn.lam < 0):
                    gamma = _gap(c, dirn.lam, R)
                    x_light, x_heavy = _two_positions(c, dirn.u, R)
                    le, l1m = _opt_logs(gamma)
                    cands.append((f"two-dirac {c}", gamma, [x_heavy, x_light], [l1m, le]))
            if hi.lam > 0:
                u, lr2 = hi.u, hi.lam * R * R
                cb = 0.7
                cands.append(("balanced +", 0.0, [-R * u, cb * R * u], [0.0, -lr2 * cb * (1 + cb)]))
                if n_atoms >= 3:
                    cc = 0.5
                    cands.append(
                        (
                            "chain +",
                            0.0,
                            [-R * u, cc * R * u, R * u],
                            [0.0, -lr2 * cc * (1 + cc), -2.0 * lr2 * cc],
                        )
                    )
        for name, gamma, xs, ls in cands:
            if len(xs) > n_atoms:
                continue
            best_gap = max(best_gap, gamma)
            lw = torch.tensor(ls, dtype=torch.float64, device=dev)
            p, lw = _pad(torch.stack(xs), lw - torch.logsumexp(lw, 0), n_atoms)
            pts.append(p)
            lws.append(lw)
            labels.append(name + suffix)
    return pts, lws, labels, best_gap


def _random_starts(
    n_starts: int,
    n_atoms: int,
    d: int,
    R: float,
    sphere: bool,
    spread: float,
    gen: torch.Generator,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    D = torch.randn(n_starts, n_atoms, d, generator=gen, dtype=torch.float64)
    D = D / torch.linalg.vector_norm(D, dim=-1, keepdim=True)
    if not sphere:
        D = D * torch.rand(n_starts, n_atoms, 1, generator=gen, dtype=torch.float64) ** (1.0 / d)
    L = -spread * torch.rand(n_starts, n_atoms, generator=gen, dtype=torch.float64)
    return (R * D).to(device), L.to(device)


def _as_init_list(init: DiracMeasure | Sequence[DiracMeasure] | Tensor | None) -> list:
    if init is None:
        return []
    if isinstance(init, (DiracMeasure, Tensor)):
        return [init]
    return list(init)


def worst_case_measure(
    params: Params,
    R: float,
    n_atoms: int,
    *,
    n_restarts: int = 16,
    steps: int = 300,
    lr: float = 0.05,
    lr_mass: float | None = None,
    sphere: bool = False,
    masked: bool = False,
    geometry: Geometry = "wasserstein",
    seed: int = 0,
    generator: torch.Generator | None = None,
    init: DiracMeasure | Sequence[DiracMeasure] | None = None,
    progress: bool = False,
    certify: bool = True,
) -> WorstCaseMeasure:
    r"""Multi-start gradient ascent of the local constant over weighted atomic measures in :math:`B_R`.

    Maximises over :math:`\mu=\sum_{i=1}^{K}a_i\delta_{x_i}`, :math:`x_i\in B_R` (THEORY.md §5.2,
    §5.3, §7.4):

    .. math:: L_W(\mu)=\big\|D_a^{1/2}\,J\,D_a^{-1/2}\big\|_2,\qquad D_a=\mathrm{diag}(a)\otimes I,

    with :math:`J` the fixed-mass Jacobian of
    :math:`(x_1,\dots,x_K)\mapsto(\Gamma_\mu(x_1),\dots,\Gamma_\mu(x_K))` (``torch.func.jacrev`` of
    :func:`~meanfield.attention.attention_points` with the log-masses held as an input) and the
    top singular value from ``torch.linalg.matrix_norm(ord=2)``, all in float64.
    ``geometry="split"`` maximises :math:`L_{\mathrm{split}}=\max(L_W,\max_i\|\sum_hW_hV_hC^h_iA_h^\top\|_2)`
    instead (the self-Jacobians are ``jacrev`` in the query points).

    Parametrisation: :math:`x=R\tanh(\|z\|)z/\|z\|` (``sphere=True``: :math:`x=Rz/\|z\|`), masses
    :math:`a=\mathrm{softmax}(\ell)` with free log-masses, floored only at :math:`e^{-700}`
    (``LOG_MASS_FLOOR``, the float64 normal range) so that :math:`\sqrt{a_i/a_j}` stays finite. Adam
    maximises :math:`\log L`; the best iterate of every start is kept.

    Starts: the constructions of every head (two Diracs in both cases at the exact optimal mass,
    §7.2; for a positive Rayleigh quotient also the balanced light atom and the three-atom chain of
    §7.4; the lightest atom split into copies up to ``n_atoms``, the same measure), the measures in
    ``init``, and ``n_restarts`` random measures (uniform in the ball, log-masses uniform over
    :math:`[-1.5\gamma^*,0]`). The exact (unparametrised) constructions are candidates too, so the
    reported value is never below the construction.

    Parameters
    ----------
    params : AttentionParams or MultiHeadParams
    R : float
        Radius of the ball (or sphere).
    n_atoms : int
        Number of atoms :math:`K \ge 1`.
    n_restarts : int, default 16
        Random starts (in addition to the construction and ``init`` starts).
    steps : int, default 300
        Adam steps per start (all starts run as one batch).
    lr : float, default 0.05
        Step size on the position variables :math:`z`.
    lr_mass : float, optional
        Step size on the log-masses; default ``lr * max(1, gamma* / 4)`` so that masses can travel
        the :math:`\sim\gamma^*` decades of the optimum.
    sphere : bool, default False
        Atoms on the sphere of radius ``R``.
    masked : bool, default False
        Masked mean-field attention at positions :math:`t_j=j/K` (THEORY.md §3.3, §5.4): the
        conditional-distance constant.
    geometry : {"wasserstein", "split"}, default "wasserstein"
    seed : int, default 0
    generator : torch.Generator, optional
        Overrides ``seed``.
    init : DiracMeasure or sequence of DiracMeasure, optional
        Extra starts with ``n_atoms`` atoms.
    progress : bool, default False
        Progress bar on stderr (tqdm).
    certify : bool, default True
        Bracket the best value with :func:`meanfield.lipschitz.local_lipschitz` (dense, Gram
        certificate) when that module is importable.

    Returns
    -------
    WorstCaseMeasure
        The measure in the dtype and device of ``params``.

    Notes
    -----
    Provenance: the shape of the maximisers (a few Diracs with masses over many decades) is *stated
    in the paper (v1 abstract)*; the objective is the local constant of THEORY.md §5.2, *derived
    and checked numerically*.
    """
    R = _check_R(R)
    n_atoms = int(n_atoms)
    if n_atoms < 1:
        raise ValueError(f"n_atoms must be a positive integer, got {n_atoms}")
    if geometry not in ("wasserstein", "split"):
        raise ValueError(f"geometry must be 'wasserstein' or 'split', got {geometry!r}")
    if steps < 0 or n_restarts < 0:
        raise ValueError("steps and n_restarts must be non-negative")
    p64 = _params64(params)
    d = p64.d
    dev = p64.device
    gen = generator if generator is not None else torch.Generator(device="cpu").manual_seed(seed)
    positions = (
        torch.arange(1, n_atoms + 1, dtype=torch.float64, device=dev) / n_atoms if masked else None
    )

    pts, lws, labels, gap = ([], [], [], 0.0)
    if n_atoms >= 2:
        pts, lws, labels, gap = _construction_starts(p64, R, n_atoms, sphere)
    n_cons = len(pts)
    for m in _as_init_list(init):
        if not isinstance(m, DiracMeasure) or m.points.shape != (n_atoms, d):
            raise ValueError(f"init measures must be DiracMeasure with {n_atoms} atoms in d = {d}")
        P = _f64(m.points).to(dev)
        if sphere:
            P = R * P / torch.linalg.vector_norm(P, dim=-1, keepdim=True).clamp_min(1e-300)
        elif bool((torch.linalg.vector_norm(P, dim=-1) > R * (1 + 1e-12)).any()):
            raise ValueError("init measures must lie in the ball of radius R")
        pts.append(P)
        lws.append(_f64(m.log_weights).to(dev))
        labels.append("init")
    spread = max(3.0, min(-LOG_MASS_FLOOR, 1.5 * gap))
    Xr, Lr = _random_starts(n_restarts, n_atoms, d, R, sphere, spread, gen, dev)
    labels += ["random"] * n_restarts
    X0 = torch.cat([torch.stack(pts), Xr]) if pts else Xr
    L0 = torch.cat([torch.stack(lws), Lr]) if lws else Lr
    if X0.shape[0] == 0:
        raise ValueError("no start: use n_restarts >= 1 or an init measure")
    Z0 = X0 / R if sphere else _ball_inverse(X0, R)

    def to_points(Z: Tensor) -> Tensor:
        return _sphere(Z, R) if sphere else _ball(Z, R)

    def log_masses(Lg: Tensor) -> Tensor:
        return torch.log_softmax(Lg, -1).clamp_min(LOG_MASS_FLOOR)

    def objective(Z: Tensor, Lg: Tensor) -> Tensor:
        return _measure_constant(
            to_points(Z), log_masses(Lg), p64, geometry=geometry, masked=masked, positions=positions
        )

    lr_m = lr * max(1.0, gap / 4.0) if lr_mass is None else float(lr_mass)
    best, best_p, hist, rec = _ascend(
        objective, [Z0, L0], [lr, lr_m], int(steps), progress=progress, desc="worst_case_measure"
    )
    best_vals = best.exp()
    Xb, Lb = to_points(best_p[0]), log_masses(best_p[1])
    # exact construction candidates (not pulled inside the ball)
    cons_value = -math.inf
    if n_cons:
        with torch.no_grad():
            Xc = torch.stack(pts[:n_cons])
            Lc = log_masses(torch.stack(lws[:n_cons]))
            vc = _measure_constant(
                Xc, Lc, p64, geometry=geometry, masked=masked, positions=positions
            )
        j = int(torch.nan_to_num(vc, nan=-math.inf).argmax())
        cons_value = float(vc[j])
        best_vals[:n_cons] = torch.maximum(best_vals[:n_cons], vc)
        Xb, Lb = Xb.clone(), Lb.clone()
        improve = vc >= best.exp()[:n_cons]
        Xb[:n_cons][improve] = Xc[improve]
        Lb[:n_cons][improve] = Lc[improve]
    k = int(torch.nan_to_num(best_vals, nan=-math.inf).argmax())
    with torch.no_grad():
        value = float(
            _measure_constant(
                Xb[k : k + 1],
                Lb[k : k + 1],
                p64,
                geometry=geometry,
                masked=masked,
                positions=positions,
            )[0]
        )
    like = params.heads[0].A
    mu = _measure_from_log_weights(
        Xb[k].detach().to(like),
        Lb[k].detach().to(like.dtype),
        None if positions is None else positions.to(like),
    )
    if certify:
        lower, upper, how = _certify(mu, params, geometry, masked, value)
    else:
        lower, upper, how = value, value, "dense SVD"
    bound = None
    if not masked and not sphere and len(params.heads) == 1 and n_atoms >= 2:
        A1, V1 = _single_head(p64, "two_dirac")
        try:
            td = two_dirac(A1, R, V=V1)
            bound = td.g
        except ValueError:
            bound = None
    return WorstCaseMeasure(
        measure=mu,
        value=value,
        lower=lower,
        upper=upper,
        bracket=how,
        geometry=geometry,
        construction_value=cons_value,
        two_dirac_bound=bound,
        restart_values=best_vals.detach(),
        labels=tuple(labels),
        history=hist.exp(),
        history_steps=rec,
    )


@dataclass(frozen=True, eq=False)
class WorstCaseSequence:
    r"""Result of :func:`worst_case_sequence`.

    Attributes
    ----------
    X : Tensor, shape (n, d)
        Best sequence found (every token in :math:`B_R`, or on the sphere).
    value : float
        :math:`\|Df(X)\|_2` (or :math:`\|Df^m(X)\|_2`), dense SVD in float64.
    lower, upper : float
    bracket : str
    construction_value : float
        Exact constant of the best eigenvector-construction start.
    construction_bound : float or None
        Formula lower bound of the best construction (THEORY.md §6.3), one head only.
    restart_values : Tensor, shape (n_starts,)
    labels : tuple of str
    history : Tensor, shape (n_starts, n_records)
    history_steps : Tensor, shape (n_records,)
    """

    X: Tensor
    value: float
    lower: float
    upper: float
    bracket: str
    construction_value: float
    construction_bound: float | None
    restart_values: Tensor
    labels: tuple[str, ...]
    history: Tensor
    history_steps: Tensor


def _sequence_starts(
    params: Params, R: float, n: int, sphere: bool
) -> tuple[list[Tensor], list[str], float | None]:
    X, labels, bound = [], [], None
    single = len(params.heads) == 1
    V1 = None
    if single:
        V1 = params.V if isinstance(params, AttentionParams) else params.head_output_matrix(0)
    for h in range(len(params.heads)):
        A = params.heads[h].A
        suffix = f" (head {h})" if not single else ""
        tries: list[tuple[str, dict]] = []
        if sphere:
            if A.shape[0] >= 2:
                tries.append(("sphere", dict(sphere=True)))
        else:
            for variant in ("released", "symmetric"):
                for c in ("+", "-"):
                    tries.append((f"{variant} {c}", dict(variant=variant, case=c)))
        for name, kw in tries:
            try:
                con = adversarial_sequence(A, R, n, V=V1, **kw)
            except ValueError:
                continue
            X.append(_f64(con.X))
            labels.append(f"construction {name}{suffix}")
            if con.lower_bound is not None:
                bound = max(bound or 0.0, con.lower_bound)
            if not sphere and n > 2:
                # best k-copy variant: k tokens at the light position, n - k at the heavy one
                v = _optimal_v(con.gamma)
                t = math.log((1 - v) / v) - con.gamma
                k = min(max(round(n * math.exp(_log_sigmoid(t))), 1), n - 1)
                if k > 1:
                    Xk = _f64(con.X).clone()
                    Xk[:k] = Xk[0]
                    X.append(Xk)
                    labels.append(f"construction {name} k={k}{suffix}")
    return X, labels, bound


def worst_case_sequence(
    params: Params,
    R: float,
    n: int,
    *,
    n_restarts: int = 8,
    steps: int = 300,
    lr: float = 0.05,
    masked: bool = False,
    sphere: bool = False,
    seed: int = 0,
    generator: torch.Generator | None = None,
    init: Tensor | Sequence[Tensor] | None = None,
    progress: bool = False,
    certify: bool = True,
) -> WorstCaseSequence:
    r"""Multi-start gradient ascent of :math:`\|Df(X)\|_2` over sequences in :math:`B_R^n`.

    .. math:: \mathrm{Lip}(f\,|\,B_R^n)=\sup_{X\in B_R^n}\|Df(X)\|_2

    (THEORY.md §5.1; :math:`B_R^n` is the product of balls, every token in :math:`B_R`; uniform
    weights; Euclidean geometry). Tokens are parametrised as in :func:`worst_case_measure`; the
    Jacobian is ``jacrev`` of :func:`~meanfield.attention.attention_points` and the norm the exact
    top singular value. Starts: the eigenvector construction of every head (released and symmetric
    variants, both cases; sphere variant when ``sphere=True``), its best :math:`k`-copy version
    (:math:`k\approx n\varepsilon^*` tokens at the light position), ``init`` and ``n_restarts``
    random sequences. The exact constructions are candidates, so the result is never below them.

    Parameters
    ----------
    params : AttentionParams or MultiHeadParams
    R : float
    n : int
        Sequence length, ``n >= 1``.
    n_restarts : int, default 8
    steps : int, default 300
    lr : float, default 0.05
    masked : bool, default False
        Causal attention (:math:`\|Df^m(X)\|_2`).
    sphere : bool, default False
        Tokens on the sphere of radius ``R``.
    seed : int, default 0
    generator : torch.Generator, optional
    init : Tensor or sequence of Tensor, optional
        Extra starting sequences of shape (n, d).
    progress : bool, default False
    certify : bool, default True

    Returns
    -------
    WorstCaseSequence

    Notes
    -----
    Provenance: the construction is *from the authors' released code*; the search and the
    :math:`k`-copy start are ours (*derived and checked numerically*).
    """
    R = _check_R(R)
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    p64 = _params64(params)
    d, dev = p64.d, p64.device
    gen = generator if generator is not None else torch.Generator(device="cpu").manual_seed(seed)
    pts, labels, bound = _sequence_starts(p64, R, n, sphere)
    n_cons = len(pts)
    for X in _as_init_list(init):
        X = _f64(as_float_tensor(X, "init")).to(dev)
        if X.shape != (n, d):
            raise ValueError(f"init sequences must have shape ({n}, {d}), got {tuple(X.shape)}")
        pts.append(X)
        labels.append("init")
    Xr, _ = _random_starts(n_restarts, n, d, R, sphere, 1.0, gen, dev)
    labels += ["random"] * n_restarts
    X0 = torch.cat([torch.stack(pts), Xr]) if pts else Xr
    if X0.shape[0] == 0:
        raise ValueError("no start: use n_restarts >= 1 or an init sequence")
    Z0 = X0 / R if sphere else _ball_inverse(X0, R)

    def to_points(Z: Tensor) -> Tensor:
        return _sphere(Z, R) if sphere else _ball(Z, R)

    def objective(Z: Tensor) -> Tensor:
        return _sequence_constant(to_points(Z), p64, masked=masked)

    best, best_p, hist, rec = _ascend(
        objective, [Z0], [lr], int(steps), progress=progress, desc="worst_case_sequence"
    )
    best_vals = best.exp()
    Xb = to_points(best_p[0]).detach().clone()
    cons_value = -math.inf
    if n_cons:
        with torch.no_grad():
            Xc = torch.stack(pts[:n_cons])
            vc = _sequence_constant(Xc, p64, masked=masked)
        cons_value = float(torch.nan_to_num(vc, nan=-math.inf).max())
        improve = vc >= best_vals[:n_cons]
        best_vals[:n_cons] = torch.maximum(best_vals[:n_cons], vc)
        Xb[:n_cons][improve] = Xc[improve]
    k = int(torch.nan_to_num(best_vals, nan=-math.inf).argmax())
    with torch.no_grad():
        value = float(_sequence_constant(Xb[k : k + 1], p64, masked=masked)[0])
    like = params.heads[0].A
    Xout = Xb[k].to(like)
    if certify:
        lower, upper, how = _certify(Xout, params, "euclidean", masked, value)
    else:
        lower, upper, how = value, value, "dense SVD"
    return WorstCaseSequence(
        X=Xout,
        value=value,
        lower=lower,
        upper=upper,
        bracket=how,
        construction_value=cons_value,
        construction_bound=bound,
        restart_values=best_vals.detach(),
        labels=tuple(labels),
        history=hist.exp(),
        history_steps=rec,
    )


# =============================================================================================
# 4. mass splitting (§12) and perturbations that change n (§3.2)
# =============================================================================================
def _is_tensor(*xs: object) -> Tensor | None:
    for x in xs:
        if isinstance(x, Tensor):
            return x
    return None


def split_gain(k: float | np.ndarray | Tensor, s: float | np.ndarray | Tensor):
    r"""Gain :math:`G_k` of the duplicate-then-move attack at a Dirac (THEORY.md §12.2).

    .. math::
        \frac{W_2(F\mu,F\nu)}{W_2(\mu,\nu)}=\frac{\|V\delta\|}{\|\delta\|}\,G_k,\qquad
        G_k=\sqrt{(k-1)w_y^2+w_z^2},\quad w_y=\frac{e^s}{k-1+e^s},\quad
        w_z=\frac{e^{2s}}{k-1+e^{2s}},

    for :math:`\mu=\delta_y`, :math:`y=\frac R2u`, :math:`k` copies of which one moves to
    :math:`z=Ru` (:math:`\nu=(1-\frac1k)\delta_y+\frac1k\delta_z`), :math:`s=\lambda R^2/4`,
    :math:`\lambda=u^\top Au`. Computed in logs:
    :math:`\log w=-\mathrm{softplus}(\log(k-1)-s)`, so any :math:`s` is safe.

    Parameters
    ----------
    k : float, array or Tensor
        Number of copies :math:`k\ge1` (real values allowed for curves).
    s : float, array or Tensor
        Exponent :math:`s`.

    Returns
    -------
    float, numpy.ndarray or Tensor
        :math:`G_k` (a Tensor when an input is a Tensor, dtype following it; otherwise numpy
        float64). :math:`G_1=1`, :math:`G_k\approx\sqrt k` for :math:`k\ll e^s`, peak
        :math:`\approx e^{s/2}/2` near :math:`k-1=e^s`.

    Notes
    -----
    Provenance: the phenomenon is *stated in the paper (v1 abstract)*; the closed form is *derived
    and checked numerically* (exact :math:`W_2` of the attack, tests/test_attacks.py). Derivation in
    docs/derivations/mass_splitting.md.
    """
    ref = _is_tensor(k, s)
    if ref is not None:
        dtype = ref.dtype if ref.is_floating_point() else torch.float64
        kt = torch.as_tensor(k, dtype=dtype, device=ref.device)
        st = torch.as_tensor(s, dtype=dtype, device=ref.device)
        if bool((kt < 1).any()):
            raise ValueError("k must be >= 1")
        log_m = torch.log(kt - 1)
        sp = torch.nn.functional.softplus
        log_wy = -sp(log_m - st)
        log_wz = -sp(log_m - 2 * st)
        return torch.exp(0.5 * torch.logaddexp(log_m + 2 * log_wy, 2 * log_wz))
    ka = np.asarray(k, dtype=np.float64)
    sa = np.asarray(s, dtype=np.float64)
    if (ka < 1).any():
        raise ValueError("k must be >= 1")
    with np.errstate(divide="ignore"):
        log_m = np.log(ka - 1.0)
    log_wy = -np.logaddexp(0.0, log_m - sa)
    log_wz = -np.logaddexp(0.0, log_m - 2.0 * sa)
    out = np.exp(0.5 * np.logaddexp(log_m + 2.0 * log_wy, 2.0 * log_wz))
    return out[()] if out.ndim == 0 else out


def _log_g2(m: float, s: float) -> float:
    """Return log G^2 with m = k - 1 copies left behind."""
    return 2.0 * math.log(float(split_gain(m + 1.0, s)))


def optimal_split_k(s: float | np.ndarray) -> int | float | np.ndarray:
    r"""Integer number of copies :math:`k\ge1` maximising :func:`split_gain` (THEORY.md §12.2).

    .. math:: k^*(s)=\arg\max_{k\in\{1,2,\dots\}}G_k(s),

    With :math:`m=k-1`, :math:`E=e^s`:
    :math:`G^2(m)=mE^2/(m+E)^2+E^4/(m+E^2)^2`, which is unimodal in :math:`m` and decreasing for
    :math:`m>E` (docs/derivations/mass_splitting.md), so an integer ternary search on
    :math:`[0,\lceil E\rceil+1]` finds the maximiser; :math:`k^*=1` for :math:`s\le\frac12\log2`.

    Parameters
    ----------
    s : float or array_like
        Exponent :math:`s`.

    Returns
    -------
    int, float or numpy.ndarray
        :math:`k^*` (an ``int`` for a scalar while :math:`e^s<2^{52}`; beyond, the float
        :math:`1+e^s`, whose neighbours have gains equal to float precision; ``inf`` once
        :math:`e^s` overflows). Arrays give float arrays.

    Notes
    -----
    :math:`k^*-1\approx e^s-16e^{-s}` for large :math:`s`. Provenance: *derived and checked
    numerically* (brute force in the tests).
    """
    if np.ndim(s) > 0:
        return np.vectorize(lambda t: float(optimal_split_k(float(t))))(np.asarray(s, dtype=float))
    s = float(s)
    if s <= 0.5 * math.log(2.0):
        return 1
    if s > 709.78:
        return math.inf
    E = math.exp(s)
    if E >= 2.0**52:
        return 1.0 + E
    lo, hi = 0, int(math.ceil(E)) + 1
    while hi - lo > 2:
        m1 = lo + (hi - lo) // 3
        m2 = hi - (hi - lo) // 3
        if _log_g2(m1, s) < _log_g2(m2, s):
            lo = m1 + 1
        else:
            hi = m2
    best = max(range(lo, hi + 1), key=lambda m: _log_g2(m, s))
    return best + 1


def split_constant(
    mu: DiracMeasure,
    params: Params,
    *,
    masked: bool | None = None,
    method: Literal["auto", "engine", "jacrev"] = "auto",
) -> Tensor:
    r"""Infinitesimal splitting constant :math:`L_{\mathrm{split}}(\mu)` (THEORY.md §5.3, §12.1).

    .. math:: L_{\mathrm{split}}(\mu)=\max\Big(L_W(\mu),\ \max_i\Big\|\sum_hW_hV_hC^h_iA_h^\top\Big\|_2\Big),
              \qquad L_W(\mu)=\|D_a^{1/2}JD_a^{-1/2}\|_2 ,

    with :math:`C^h_i` the covariance of head :math:`h`'s attention kernel at atom :math:`i`: the
    local constant when atoms may also split into pieces that move apart.

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched measure with distinct atoms.
    params : AttentionParams or MultiHeadParams
    masked : bool, optional
        Default ``mu.is_causal``.
    method : {"auto", "engine", "jacrev"}, default "auto"
        ``"engine"``: :func:`meanfield.lipschitz.local_lipschitz` with ``geometry="split"``;
        ``"jacrev"``: the dense Jacobians of this module; ``"auto"``: the engine when importable.

    Returns
    -------
    Tensor, shape ()
        In the dtype of ``mu``.

    Notes
    -----
    Provenance: *derived and checked numerically* (THEORY.md §12.1).
    """
    if mu.points.ndim != 2:
        raise ValueError("split_constant needs an unbatched measure")
    masked = mu.is_causal if masked is None else bool(masked)
    if method not in ("auto", "engine", "jacrev"):
        raise ValueError(f"method must be 'auto', 'engine' or 'jacrev', got {method!r}")
    if method in ("auto", "engine"):
        try:
            from .lipschitz import local_lipschitz
        except ImportError:
            if method == "engine":
                raise
        else:
            est = local_lipschitz(mu, params, geometry="split", masked=masked, method="dense")
            return est.value
    p64 = _params64(params)
    with torch.no_grad():
        val = _measure_constant(
            _f64(mu.points).unsqueeze(0),
            _f64(mu.log_weights).unsqueeze(0),
            p64,
            geometry="split",
            masked=masked,
            positions=None if not masked else _f64(mu.positions),
        )[0]
    return val.to(mu.dtype)


# ---------------------------------------------------------------------------- exact W2 in torch
def _w2sq(Y: Tensor, a: Tensor, Z: Tensor, b: Tensor) -> Tensor:
    r"""Exact :math:`W_2^2` between :math:`\sum a_i\delta_{y_i}` and :math:`\sum b_j\delta_{z_j}`.

    Differentiable: in the points with the optimal plan held fixed (Danskin), in the masses through
    the dual potentials (envelope theorem). Network simplex of POT in float64.
    """
    import ot

    M = (Y.unsqueeze(-2) - Z.unsqueeze(-3)).square().sum(-1)
    an = a.detach().cpu().numpy().astype(np.float64)
    bn = b.detach().cpu().numpy().astype(np.float64)
    an, bn = an / an.sum(), bn / bn.sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        G, log = ot.emd(an, bn, np.ascontiguousarray(M.detach().cpu().numpy()), log=True)
    plan = torch.as_tensor(G, dtype=M.dtype, device=M.device)
    f = torch.as_tensor(log["u"], dtype=M.dtype, device=M.device)
    g = torch.as_tensor(log["v"], dtype=M.dtype, device=M.device)
    return (plan * M).sum() + ((a - a.detach()) * f).sum() + ((b - b.detach()) * g).sum()


@dataclass(frozen=True, eq=False)
class Perturbation:
    r"""One perturbation :math:`\nu` of :math:`\mu`, measured exactly on both sides.

    Attributes
    ----------
    kind : str
        ``"move"``, ``"split"``, ``"duplicate"`` or ``"insert"``.
    nu : DiracMeasure
        The perturbed measure.
    input_w2, output_w2 : float
        :math:`W_2(\nu,\mu)` and :math:`W_2(F\nu,F\mu)`, exact (:func:`~meanfield.distances.wasserstein`).
    ratio_w2 : float
        ``output_w2 / input_w2``.
    input_winf, output_winf, ratio_winf : float
        The same with :func:`~meanfield.distances.wasserstein_inf`.
    cost_bound : float
        Upper bound on ``input_w2`` from the construction: the budget
        :math:`(\sum_ia_i\|\delta_i\|^2)^{1/2}` for moves and splits, the §3.2 plan for
        duplicating and inserting a token.
    k : int or None
        Copies of the split atom (``"split"``).
    atom : int or None
        The split or duplicated atom.
    fractions : Tensor or None, shape (k,)
        Mass fractions of the copies (``"split"``).
    z : Tensor or None, shape (d,)
        The inserted token (``"insert"``).
    """

    kind: str
    nu: DiracMeasure
    input_w2: float
    output_w2: float
    ratio_w2: float
    input_winf: float
    output_winf: float
    ratio_winf: float
    cost_bound: float
    k: int | None = None
    atom: int | None = None
    fractions: Tensor | None = None
    z: Tensor | None = None


@dataclass(frozen=True, eq=False)
class MassSplittingAttack:
    r"""Result of :func:`mass_splitting_attack`.

    Attributes
    ----------
    budget : float
        :math:`W_2` budget :math:`\varepsilon` of the move and split perturbations.
    move : Perturbation
        Best move-only perturbation (whole atoms move).
    split : Perturbation
        Best split-then-move perturbation over atoms and :math:`k=2..k_{\max}`.
    ks : tuple of int
        The numbers of copies tried, ``2..k_max``.
    split_by_k : tuple of Perturbation
        The best split-then-move perturbation for every :math:`k` (over atoms and starts),
        measured exactly; ``split`` is the one with the largest exact :math:`W_2` ratio.
    duplicate : tuple of Perturbation
        Duplicating each atom as a token (§3.2), one per atom.
    insert : Perturbation
        Best inserted token :math:`z\in B_R` (§3.2).
    gain : float
        ``split.ratio_w2 / move.ratio_w2``.
    gain_winf : float
        ``split.ratio_winf / move.ratio_winf``.
    """

    budget: float
    move: Perturbation
    split: Perturbation
    ks: tuple[int, ...]
    split_by_k: tuple[Perturbation, ...]
    duplicate: tuple[Perturbation, ...]
    insert: Perturbation
    gain: float
    gain_winf: float


def _measure_perturbation(
    kind: str, mu: DiracMeasure, nu: DiracMeasure, params: Params, cost_bound: float, **extra
) -> Perturbation:
    from .attention import attention

    Fmu, Fnu = attention(mu, params), attention(nu, params)
    iw, ow = float(wasserstein(nu, mu)), float(wasserstein(Fnu, Fmu))
    ii, oi = float(wasserstein_inf(nu, mu)), float(wasserstein_inf(Fnu, Fmu))
    return Perturbation(
        kind=kind,
        nu=nu,
        input_w2=iw,
        output_w2=ow,
        ratio_w2=ow / iw if iw > 0 else math.nan,
        input_winf=ii,
        output_winf=oi,
        ratio_winf=oi / ii if ii > 0 else math.nan,
        cost_bound=cost_bound,
        **extra,
    )


def _project_ball(X: Tensor, R: float | None) -> Tensor:
    if R is None:
        return X
    r = torch.linalg.vector_norm(X, dim=-1, keepdim=True)
    return X * torch.where(r > R, R / r.clamp_min(1e-300), torch.ones_like(r))


def _budget_moves(g: Tensor, la: Tensor, budget: float) -> Tensor:
    r"""Displacements :math:`\delta_i=\varepsilon g_i/(\sqrt{a_i}\|g\|)`: :math:`\sum a_i\|\delta_i\|^2=\varepsilon^2`."""
    return budget * g * torch.exp(-0.5 * la).unsqueeze(-1) / torch.linalg.vector_norm(g)


def _run_single(
    objective: Callable[..., Tensor], init: list[Tensor], lrs: list[float], steps: int
) -> tuple[float, list[Tensor]]:
    """Adam ascent of a positive scalar objective from one start; best value and parameters."""
    params = [p.detach().clone().requires_grad_(True) for p in init]
    opt = torch.optim.Adam([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])
    best, best_p = -math.inf, [p.detach().clone() for p in params]
    for step in range(steps + 1):
        val = objective(*params)
        v = float(val.detach())
        if math.isfinite(v) and v > best:
            best, best_p = v, [p.detach().clone() for p in params]
        if step == steps or not (math.isfinite(v) and v > 0):
            break
        opt.zero_grad()
        (-torch.log(val)).backward()
        for p in params:
            if p.grad is not None:
                torch.nan_to_num_(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
        opt.step()
    return best, best_p


def mass_splitting_attack(
    mu: DiracMeasure,
    params: Params,
    budget: float,
    *,
    k_max: int = 6,
    R: float | None = None,
    atoms: Sequence[int] | None = None,
    n_restarts: int = 3,
    steps: int = 150,
    lr: float = 0.05,
    insert_steps: int = 60,
    seed: int = 0,
    generator: torch.Generator | None = None,
) -> MassSplittingAttack:
    r"""Finite :math:`W_2`-budget attack: move-only versus split-then-move (THEORY.md §12, §3.2).

    Ratios :math:`W_2(F\nu,F\mu)/W_2(\nu,\mu)` with **exact** :math:`W_2` on both sides.

    * **Move-only**: :math:`\nu=\sum_ia_i\delta_{x_i+\delta_i}`, parametrised on the budget sphere
      :math:`\sum_ia_i\|\delta_i\|^2=\varepsilon^2` (:math:`\delta_i=\varepsilon g_i/(\sqrt{a_i}\|g\|)`),
      which bounds :math:`W_2(\nu,\mu)\le\varepsilon` through the identity coupling.
    * **Split-then-move**: atom :math:`i` is split into :math:`k` copies with mass fractions
      :math:`\mathrm{softmax}(f)` (:meth:`DiracMeasure.split`, the same measure), then every atom and
      copy moves under the same budget (masses of the split measure).
    * **Token-count changes** (§3.2): duplicating atom :math:`i` as a token,
      :math:`\mu'=(1-t)\mu+t\delta_{x_i}` with :math:`t=\frac1{n+1}` (cost bound
      :math:`(t\sum_ja_j\|x_j-x_i\|^2)^{1/2}`, which is :math:`(\frac1{n(n+1)}\sum_j\|x_j-x_i\|^2)^{1/2}`
      for :math:`n` uniform tokens), and inserting a token :math:`z\in B_R`,
      :math:`(1-t)\mu+t\delta_z` (cost bound :math:`(t\sum_ja_j\|x_j-z\|^2)^{1/2}`), :math:`z` optimised.

    The displacements (and fractions, :math:`z`) maximise :math:`W_2(F\nu,F\mu)/\varepsilon` by Adam,
    with the exact output :math:`W_2` differentiated through the optimal plan and dual potentials;
    every reported number is then **measured** with :func:`~meanfield.distances.wasserstein` (and
    :func:`~meanfield.distances.wasserstein_inf` for the :math:`W_\infty` comparison of §12.3, where
    the input cost is :math:`\|\delta\|` whatever the mass and the gain disappears). Moved points are
    projected back into :math:`B_R` (non-expansive, so the budget bound still holds).

    Parameters
    ----------
    mu : DiracMeasure
        Unbatched, unmasked input measure.
    params : AttentionParams or MultiHeadParams
        Unmasked attention.
    budget : float
        :math:`\varepsilon>0`.
    k_max : int, default 6
        Largest number of copies (``k = 2..k_max``).
    R : float, optional
        Radius of the ball holding the perturbed measures; default the support radius of ``mu``.
    atoms : sequence of int, optional
        Atoms to split (default all).
    n_restarts : int, default 3
        Starts per (atom, k) and for the move-only attack (the first are structured: the top
        singular vector of the weighted Jacobian for moves; the logit-gain direction
        :math:`A^\top x_i`, the radial direction and the extreme directions of
        :math:`(A+A^\top)/2` for one moved copy).
    steps : int, default 150
    lr : float, default 0.05
    insert_steps : int, default 60
    seed : int, default 0
    generator : torch.Generator, optional

    Returns
    -------
    MassSplittingAttack

    Notes
    -----
    At a Dirac :math:`\mu=\delta_y` move-only gives exactly :math:`\|V\delta\|/\|\delta\|\le\|V\|`
    while splitting reaches :math:`\frac{\|V\delta\|}{\|\delta\|}G_k` (:func:`split_gain`); under
    :math:`W_\infty` both are at most :math:`\|V\|` at a Dirac (§12.3). Provenance: the phenomenon
    is *stated in the paper (v1 abstract)*; the attack and its measurements are ours (*derived and
    checked numerically*).
    """
    if not isinstance(mu, DiracMeasure) or mu.points.ndim != 2:
        raise ValueError("mass_splitting_attack needs one unbatched DiracMeasure")
    if mu.is_causal:
        raise ValueError(
            "mass_splitting_attack is for unmasked attention: pass an untagged measure"
        )
    budget = float(budget)
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be a positive number, got {budget}")
    k_max = int(k_max)
    if k_max < 2:
        raise ValueError(f"k_max must be >= 2, got {k_max}")
    p64 = _params64(params)
    dev = p64.device
    X = _f64(mu.points).to(dev)
    la = _f64(mu.log_weights).to(dev)
    a = la.exp()
    n, d = X.shape
    R_ = float(torch.linalg.vector_norm(X, dim=-1).max()) if R is None else _check_R(R)
    if R is not None and float(torch.linalg.vector_norm(X, dim=-1).max()) > R_ * (1 + 1e-12):
        raise ValueError("mu must lie in the ball of radius R")
    if not R_ > 0:
        raise ValueError("mu is a Dirac at the origin: pass the radius R of the ball")
    R_proj = R_
    gen = generator if generator is not None else torch.Generator(device="cpu").manual_seed(seed)
    mu64 = _measure_from_log_weights(X, la)
    with torch.no_grad():
        Y0 = attention_points(X, p64, log_weights=la)
    like = params.heads[0].A

    def out_w2(Xn: Tensor, lan: Tensor) -> Tensor:
        Yn = attention_points(Xn, p64, log_weights=lan)
        return torch.sqrt(_w2sq(Yn, lan.exp(), Y0, a).clamp_min(0.0))

    def emit(kind: str, Xn: Tensor, lan: Tensor, bound: float, **extra) -> Perturbation:
        nu64 = _measure_from_log_weights(Xn.detach(), lan.detach())
        q = _measure_perturbation(kind, mu64, nu64, p64, bound, **extra)
        nu = _measure_from_log_weights(Xn.detach().to(like), lan.detach().to(like.dtype))
        return dataclasses.replace(q, nu=nu)

    # ------------------------------------------------------------------ move-only
    with torch.no_grad():
        J = _batched_jacobian(
            lambda Y: attention_points(Y, p64, log_weights=la.unsqueeze(0)), X.unsqueeze(0)
        )[0]
        d_out = J.shape[0] // n
        so = (0.5 * la).repeat_interleave(d_out)
        si = (0.5 * la).repeat_interleave(d)
        _, _, Vh = torch.linalg.svd(torch.exp(so[:, None] - si[None, :]) * J)
        top = Vh[0].reshape(n, d)
    move_inits = [top, -top] + [
        torch.randn(n, d, generator=gen, dtype=torch.float64).to(dev) for _ in range(n_restarts)
    ]
    move_inits = move_inits[: max(1, n_restarts)]

    def move_obj(g: Tensor) -> Tensor:
        Xn = _project_ball(X + _budget_moves(g, la, budget), R_proj)
        return out_w2(Xn, la) / budget

    best_move = (-math.inf, None)
    for g0 in move_inits:
        v, (g,) = _run_single(move_obj, [g0], [lr], steps)
        if v > best_move[0]:
            best_move = (v, g)
    Xm = _project_ball(X + _budget_moves(best_move[1], la, budget), R_proj).detach()
    move = emit("move", Xm, la, budget)

    # ------------------------------------------------------------------ split-then-move
    S = 0.5 * sum((_f64(h.A) + _f64(h.A).mT) for h in p64.heads)
    ev = torch.linalg.eigh(S)[1]
    atom_list = list(range(n)) if atoms is None else sorted({int(i) % n for i in atoms})
    ks = tuple(range(2, k_max + 1))
    best_by_k: dict[int, tuple[float, Tensor, Tensor, int]] = {}
    for i in atom_list:
        xi = X[i]
        dirs = []
        logit_dir = sum(_f64(h.A).mT @ xi for h in p64.heads)
        for v_ in (logit_dir, xi, ev[:, -1], -ev[:, -1], ev[:, 0], -ev[:, 0]):
            if float(torch.linalg.vector_norm(v_)) > 1e-12:
                dirs.append(v_ / torch.linalg.vector_norm(v_))
        for k in ks:
            Xk = _f64(mu64.split(i, k).points)
            base_lw = torch.cat([la[:i], la[i + 1 :]])

            def split_lw(f: Tensor, i: int = i, base_lw: Tensor = base_lw) -> Tensor:
                frac = torch.log_softmax(f, 0).clamp_min(LOG_MASS_FLOOR)
                return torch.cat([base_lw[:i], la[i] + frac, base_lw[i:]])

            def split_obj(f: Tensor, g: Tensor, Xk: Tensor = Xk, split_lw=split_lw) -> Tensor:
                lan = split_lw(f)
                Xn = _project_ball(Xk + _budget_moves(g, lan, budget), R_proj)
                return out_w2(Xn, lan) / budget

            for r in range(max(1, n_restarts)):
                g0 = torch.zeros(n + k - 1, d, dtype=torch.float64, device=dev)
                f0 = torch.zeros(k, dtype=torch.float64, device=dev)
                if r < len(dirs):
                    # THEORY.md §12.2: one light copy travels to the sphere along dirs[r]; its mass
                    # fraction f spends the whole budget, a_i f D^2 = budget^2
                    e = dirs[r]
                    xe = float(xi @ e)
                    D = -xe + math.sqrt(max(xe * xe - float(xi @ xi) + R_ * R_, 0.0))
                    g0[i + k - 1] = e
                    if D > 1e-12:
                        frac = min(budget**2 / (float(a[i]) * D * D), 1.0 / k)
                        f0[:-1] = math.log((1.0 - frac) / (k - 1))
                        f0[-1] = math.log(frac)
                else:
                    g0 = torch.randn(n + k - 1, d, generator=gen, dtype=torch.float64).to(dev)
                v, (f, g) = _run_single(split_obj, [f0, g0], [lr, lr], steps)
                if k not in best_by_k or v > best_by_k[k][0]:
                    best_by_k[k] = (v, f, g, i)
    split_by_k = []
    for k in ks:
        _, f, g, i_s = best_by_k[k]
        base_lw = torch.cat([la[:i_s], la[i_s + 1 :]])
        frac = torch.log_softmax(f, 0).clamp_min(LOG_MASS_FLOOR)
        lan = torch.cat([base_lw[:i_s], la[i_s] + frac, base_lw[i_s:]])
        Xs = _project_ball(_f64(mu64.split(i_s, k).points) + _budget_moves(g, lan, budget), R_proj)
        split_by_k.append(
            emit(
                "split",
                Xs.detach(),
                lan.detach(),
                budget,
                k=k,
                atom=i_s,
                fractions=frac.detach().exp().to(like),
            )
        )
    split = max(split_by_k, key=lambda q: q.ratio_w2)

    # ------------------------------------------------------------------ token count changes
    t = 1.0 / (n + 1)
    lt, l1t = math.log(t), math.log1p(-t)
    dup = []
    for i in range(n):
        Xd = torch.cat([X, X[i : i + 1]])
        lwd = torch.cat([la + l1t, torch.tensor([lt], dtype=torch.float64, device=dev)])
        bound = math.sqrt(t * float((a * (X - X[i]).square().sum(-1)).sum()))
        dup.append(emit("duplicate", Xd, lwd, bound, atom=i))
    lwi = torch.cat([la + l1t, torch.tensor([lt], dtype=torch.float64, device=dev)])
    mu_w = a

    def ins_obj(zz: Tensor) -> Tensor:
        z = _ball(zz, R_)
        Xi = torch.cat([X, z.unsqueeze(0)])
        Yi = attention_points(Xi, p64, log_weights=lwi)
        out = _w2sq(Yi, lwi.exp(), Y0, mu_w)
        inp = _w2sq(Xi, lwi.exp(), X, mu_w)
        return torch.sqrt(out.clamp_min(0.0)) / torch.sqrt(inp.clamp_min(1e-300))

    zs = [R_ * dv for dv in _candidate_directions(p64, X)]
    zs += [
        R_ * torch.randn(d, generator=gen, dtype=torch.float64).to(dev) / math.sqrt(d)
        for _ in range(max(0, n_restarts - 1))
    ]
    best_ins = (-math.inf, None)
    for z0 in zs:
        zz0 = _ball_inverse(z0.unsqueeze(0), R_)[0]
        v, (zz,) = _run_single(ins_obj, [zz0], [lr * 4], insert_steps)
        if v > best_ins[0]:
            best_ins = (v, zz)
    zb = _ball(best_ins[1], R_).detach()
    Xi = torch.cat([X, zb.unsqueeze(0)])
    bound_i = math.sqrt(t * float((a * (X - zb).square().sum(-1)).sum()))
    insert = emit("insert", Xi, lwi, bound_i, z=zb.to(like))

    return MassSplittingAttack(
        budget=budget,
        move=move,
        split=split,
        ks=ks,
        split_by_k=tuple(split_by_k),
        duplicate=tuple(dup),
        insert=insert,
        gain=split.ratio_w2 / move.ratio_w2,
        gain_winf=split.ratio_winf / move.ratio_winf,
    )


def _candidate_directions(params: Params, X: Tensor) -> list[Tensor]:
    """Unit candidate directions: extreme eigenvectors of every head's symmetric part, atoms."""
    out = []
    for h in params.heads:
        A = _f64(h.A)
        ev = torch.linalg.eigh(0.5 * (A + A.mT))[1]
        out += [ev[:, -1], -ev[:, -1], ev[:, 0], -ev[:, 0]]
    for x in X:
        nx = float(torch.linalg.vector_norm(x))
        if nx > 1e-12:
            out += [x / nx, -x / nx]
    return out
