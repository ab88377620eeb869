r"""Invertible residual attention blocks :math:`x\mapsto x+g(x)` and their fixed-point inverse.

The construction is that of Kim, Papamakarios & Mnih (ICML 2021, "invertible self-attention"):
when :math:`\mathrm{Lip}(g)\le c<1` the block is a bijection, and the preimage of :math:`y` is the
unique fixed point of :math:`x\mapsto y-g(x)`, reached by Banach iteration at rate :math:`c`
(docs/derivations/invertible.md).

* :class:`ResidualAttention` holds :math:`g = s\,f` for an attention map :math:`f` (Kim's L2
  multi-head attention, :func:`~meanfield.l2_self_attention`, or dot-product attention,
  :func:`~meanfield.self_attention`) and a scale :math:`s`.
* :func:`l2_lipschitz_upper` is a **global** bound on :math:`\mathrm{Lip}_2` of L2 attention on
  :math:`n` tokens, proved in docs/derivations/invertible.md §2;
  :func:`dot_product_lipschitz_upper` is a bound for dot-product attention that holds only on the
  ball :math:`\|x_i\|\le R` (docs/theory.md §1): dot-product attention has no global one.
* :func:`contractive_scale` gives the scale :math:`s` that makes the certified bound equal to a
  target :math:`c<1`; :func:`certified_lipschitz` returns the bound of a block and its scope.
* :func:`invert_fixed_point` runs the iteration and records the residual of every iterate, the
  observed contraction ratios and whether they respect a given bound (:func:`check_contraction`).
* :func:`dot_product_tie_input` builds inputs of radius :math:`R` at which the local constant of
  dot-product attention grows like :math:`R^2` at a fixed number of tokens (a query attending
  evenly to keys far apart; docs/derivations/invertible.md §4), where the iteration fails.

Tensors in, tensors out; dtype and device follow the inputs; float64 is the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._theory_import import require_theory
from ._typing import AnyParams as Params
from .attention import l2_self_attention, self_attention
from .params import AttentionParams, L2AttentionParams, MultiHeadParams

__all__ = [
    "ContractionCheck",
    "FixedPointResult",
    "LipschitzCertificate",
    "ResidualAttention",
    "TieInput",
    "certified_lipschitz",
    "check_contraction",
    "contractive_scale",
    "dot_product_lipschitz_upper",
    "dot_product_tie_input",
    "invert_fixed_point",
    "l2_lipschitz_upper",
    "residual_forward",
]


#: Relative margin added to the certified bounds for the rounding of the weight norms (an SVD in
#: float64 has a relative error of a few units of 1e-16; docs/derivations/invertible.md §2).
_NORM_MARGIN = 1e-12


def _out_width(params: Params) -> tuple[int, int]:
    """(input width, output width) of the attention map."""
    if isinstance(params, L2AttentionParams):
        d_out = params.n_heads * params.W_V.shape[2] if params.W_O is None else params.W_O.shape[1]
        return params.D, d_out
    if isinstance(params, MultiHeadParams):
        return params.d, params.d_out
    return params.d, params.d_v


@dataclass(frozen=True, eq=False)
class ResidualAttention:
    r"""The residual block :math:`x\mapsto x+g(x)`, :math:`g = s\,f`, row convention.

    Parameters
    ----------
    params : L2AttentionParams, AttentionParams or MultiHeadParams
        The attention map :math:`f`: :func:`~meanfield.l2_self_attention` for
        :class:`~meanfield.L2AttentionParams`, :func:`~meanfield.self_attention` (unmasked)
        otherwise. Its output width must equal its input width.
    scale : float, default 1.0
        The factor :math:`s>0` (see :func:`contractive_scale`).
    """

    params: Params
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.params, (L2AttentionParams, AttentionParams, MultiHeadParams)):
            raise TypeError(
                "params must be L2AttentionParams, AttentionParams or MultiHeadParams, "
                f"got {type(self.params).__name__}"
            )
        d, d_out = _out_width(self.params)
        if d != d_out:
            raise ValueError(
                f"a residual block needs an attention map of equal input and output width, "
                f"got {d} -> {d_out}"
            )
        s = float(self.scale)
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"scale must be a positive finite number, got {self.scale!r}")
        object.__setattr__(self, "scale", s)

    @property
    def l2(self) -> bool:
        """Whether the map is Kim's L2 attention (globally Lipschitz)."""
        return isinstance(self.params, L2AttentionParams)

    def residual(self, X: Tensor) -> Tensor:
        r""":math:`g(X) = s\,f(X)`, shape (..., n, d)."""
        if isinstance(self.params, L2AttentionParams):
            return self.scale * l2_self_attention(X, self.params)
        return self.scale * self_attention(X, self.params)

    def __call__(self, X: Tensor) -> Tensor:
        r""":math:`X + g(X)`."""
        return X + self.residual(X)


def residual_forward(X: Tensor, block: ResidualAttention) -> Tensor:
    r"""The forward map :math:`X + g(X)` of ``block`` (same as ``block(X)``)."""
    return block(X)


# ----------------------------------------------------------------------------- certified bounds
def _spec(M: Tensor) -> float:
    """Spectral norm of the last two dimensions, in float64, maximised over leading ones."""
    return float(torch.linalg.matrix_norm(M.detach().to(torch.float64), ord=2).max())


def l2_lipschitz_upper(params: L2AttentionParams, n: int) -> float:
    r"""Global bound on :math:`\mathrm{Lip}_2` of L2 multi-head attention on ``n`` tokens.

    With :math:`k` the query width of a head and :math:`\phi = W_0\big(\frac{n-1}{e}\big)`,

    .. math:: \mathrm{Lip}_2(F)\ \le\ \sqrt{\frac nk}\,(1+4\phi)\,
              \Big(\sum_h\|W^{Q,h}\|_2^4\,\|W^{V,h}\|_2^2\Big)^{1/2}\,\|W^O\|_2 ,

    for the Frobenius norm on :math:`\mathbb R^{n\times D}`, on the whole space (no radius). It
    is :func:`theory.bounds.kim_l2_upper` with ``p=2, wq_power=2``, proved in
    docs/derivations/invertible.md §2 (block norms of the Jacobian and the softmax-variance
    lemma). A relative margin of ``1e-12`` covers the rounding of the weight norms.

    Parameters
    ----------
    params : L2AttentionParams
    n : int
        Number of tokens, ``n >= 1``.

    Returns
    -------
    float
    """
    require_theory()
    from theory.bounds import kim_l2_upper

    if not isinstance(params, L2AttentionParams):
        raise TypeError(f"params must be L2AttentionParams, got {type(params).__name__}")
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    H, _, k = params.W_Q.shape
    q = [_spec(params.W_Q[h]) for h in range(H)]
    v = [_spec(params.W_V[h]) for h in range(H)]
    o = 1.0 if params.W_O is None else _spec(params.W_O)
    bound = kim_l2_upper(
        n, D=H * k, H=H, WQ_norms=q, WV_norms=v, WO_norm=o, p=2, wq_power=2, variant="N-1"
    )
    return float(bound) * (1.0 + _NORM_MARGIN)


def dot_product_lipschitz_upper(params: AttentionParams, n: int, radius: float) -> float:
    r"""Bound on :math:`\mathrm{Lip}_2` of one dot-product head on the ball :math:`\|x_i\|\le R`.

    The triangle form of docs/theory.md §1, :math:`\|V\|_2(\sqrt n(1+\theta)+\theta)` with
    :math:`\theta=\|A\|_2R^2`: it holds for inputs whose tokens all lie in the ball of radius
    ``radius`` and grows without limit with it; dot-product attention has no global bound
    (docs/derivations/invertible.md §4). A value bias is allowed; a key bias is not.

    Parameters
    ----------
    params : AttentionParams
    n : int
    radius : float

    Returns
    -------
    float
    """
    require_theory()
    from theory.bounds import sqrt_n_upper

    if not isinstance(params, AttentionParams):
        raise TypeError(
            f"the dot-product bound is for one head (AttentionParams), got {type(params).__name__}"
        )
    if params.c is not None:
        raise ValueError("the dot-product bound of docs/theory.md §1 has no key bias c")
    R = float(radius)
    if not (math.isfinite(R) and R >= 0):
        raise ValueError(f"radius must be a nonnegative number, got {radius!r}")
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    bound = sqrt_n_upper(_spec(params.A), _spec(params.V), R, n, form="triangle")
    return float(bound) * (1.0 + _NORM_MARGIN)


@dataclass(frozen=True)
class LipschitzCertificate:
    r"""A proved bound on the Lipschitz constant of a residual map :math:`g` and where it holds.

    Attributes
    ----------
    bound : float
        :math:`c` with :math:`\|g(x)-g(x')\|\le c\|x-x'\|`.
    scope : str
        ``"global"`` (all inputs) or ``"ball"`` (inputs whose tokens have norm at most
        ``radius``).
    radius : float or None
    n : int
        Number of tokens the bound is for.
    """

    bound: float
    scope: str
    radius: float | None
    n: int


def certified_lipschitz(
    block: ResidualAttention, n: int, *, radius: float | None = None
) -> LipschitzCertificate:
    r"""The certified bound of :math:`g = s\,f` on ``n`` tokens.

    L2 attention: :math:`s` times :func:`l2_lipschitz_upper`, valid everywhere (``radius`` must
    be omitted). Dot-product attention: :math:`s` times :func:`dot_product_lipschitz_upper` on the
    ball of radius ``radius`` (required).
    """
    if isinstance(block.params, L2AttentionParams):
        if radius is not None:
            raise ValueError("the L2 bound is global: give no radius")
        return LipschitzCertificate(
            block.scale * l2_lipschitz_upper(block.params, n), "global", None, int(n)
        )
    if radius is None:
        raise ValueError(
            "dot-product attention has no global Lipschitz bound: give the radius of the ball"
        )
    if not isinstance(block.params, AttentionParams):
        raise TypeError("the dot-product certificate covers one head (AttentionParams)")
    b = block.scale * dot_product_lipschitz_upper(block.params, n, radius)
    return LipschitzCertificate(b, "ball", float(radius), int(n))


def contractive_scale(
    params: L2AttentionParams | AttentionParams,
    n: int,
    *,
    target: float = 0.5,
    radius: float | None = None,
) -> float:
    r"""The scale :math:`s` for which the certified bound of :math:`s\,f` equals ``target``.

    For L2 attention the bound is global, so :math:`x\mapsto x+s\,f(x)` is invertible on all of
    :math:`\mathbb R^{n\times D}` with a fixed-point iteration contracting at rate ``target``.
    For dot-product attention (``radius`` required) the bound only holds on the ball of that
    radius: the same scale certifies nothing for inputs outside it.

    Parameters
    ----------
    params : L2AttentionParams or AttentionParams
    n : int
    target : float, default 0.5
        The certified constant :math:`c`, ``0 < target < 1``.
    radius : float, optional
        Dot-product attention only: the radius of the ball.

    Returns
    -------
    float
    """
    t = float(target)
    if not (0 < t < 1):
        raise ValueError(f"target must lie in (0, 1), got {target!r}")
    cert = certified_lipschitz(ResidualAttention(params, 1.0), n, radius=radius)
    if not cert.bound > 0:
        raise ValueError("the attention map is constant (zero certified bound): any scale works")
    return t / cert.bound


# ---------------------------------------------------------------------------- fixed-point solve
@dataclass(frozen=True)
class ContractionCheck:
    r"""The observed ratios :math:`r_k/r_{k-1}` of successive steps against a bound :math:`c`.

    Attributes
    ----------
    bound : float
    max_ratio : float
        Largest observed ratio over the informative steps (``nan`` if there are none).
    holds : bool
        Every ratio satisfies :math:`r_k/r_{k-1}\le c+2\eta/r_{k-1}` (:math:`\eta`: the
        evaluation error of one step, docs/derivations/invertible.md §3).
    max_excess : float
        :math:`\max_k\big(r_k/r_{k-1}-c-2\eta/r_{k-1}\big)` (negative when the check holds).
    n_informative : int
        Steps whose rounding slack :math:`2\eta/r_{k-1}` is at most 1 % of :math:`c`.
    eta : float
    """

    bound: float
    max_ratio: float
    holds: bool
    max_excess: float
    n_informative: int
    eta: float


@dataclass(frozen=True, eq=False)
class FixedPointResult:
    r"""Outcome of :func:`invert_fixed_point`.

    Attributes
    ----------
    x : Tensor
        The last iterate whose residual was computed (the preimage when ``converged``).
    residuals : Tensor, shape (m,)
        :math:`r_k=\|x_k+g(x_k)-y\|` for every iterate :math:`x_0,\dots,x_{m-1}` (float64);
        :math:`r_k=\|x_{k+1}-x_k\|` is also the length of step :math:`k`.
    converged : bool
        :math:`r_k\le\mathrm{tol}\cdot\max(1,\|y\|)` was reached.
    status : str
        ``"converged"``, ``"max_iter"`` or ``"diverged"`` (non-finite or beyond
        :math:`10^{6}\max(1,\|y\|)`).
    n_iter : int
        Number of evaluations of :math:`g`.
    ratios : Tensor, shape (m-1,)
        :math:`r_k/r_{k-1}`, the observed contraction of each step.
    rate : float
        Geometric-mean contraction over the informative steps,
        :math:`(r_{\mathrm{last}}/r_{\mathrm{first}})^{1/m'}` (``nan`` with fewer than two).
    eta : float
        Evaluation error of one step (see :class:`ContractionCheck`).
    check : ContractionCheck or None
        Against the ``lipschitz`` bound given to :func:`invert_fixed_point`.
    """

    x: Tensor
    residuals: Tensor
    converged: bool
    status: str
    n_iter: int
    ratios: Tensor
    rate: float
    eta: float
    check: ContractionCheck | None


def _informative(residuals: Tensor, eta: float, bound: float) -> Tensor:
    """Mask over the ratios: steps whose rounding slack is at most 1 % of ``bound``."""
    prev = residuals[:-1]
    return (2 * eta) <= 0.01 * bound * prev


def check_contraction(residuals: Tensor, bound: float, *, eta: float = 0.0) -> ContractionCheck:
    r"""Check Banach's inequality :math:`r_k\le c\,r_{k-1}` on a residual history.

    If :math:`\mathrm{Lip}(g)\le c`, the exact steps satisfy
    :math:`\|x_{k+1}-x_k\|=\|g(x_k)-g(x_{k-1})\|\le c\|x_k-x_{k-1}\|`. With an evaluation error
    :math:`\eta` per step, :math:`r_k\le c\,r_{k-1}+2\eta`; the check allows exactly that slack.

    Parameters
    ----------
    residuals : Tensor, shape (m,)
        :attr:`FixedPointResult.residuals`.
    bound : float
        The certified :math:`c`.
    eta : float, default 0
        Evaluation error of one step (:attr:`FixedPointResult.eta`).
    """
    r = residuals.detach().to(torch.float64).cpu()
    c = float(bound)
    if r.numel() < 2:
        return ContractionCheck(c, math.nan, True, -math.inf, 0, float(eta))
    prev, nxt = r[:-1], r[1:]
    ok = prev > 0
    ratio = torch.where(ok, nxt / torch.where(ok, prev, 1.0), torch.zeros_like(nxt))
    slack = torch.where(ok, 2 * eta / torch.where(ok, prev, 1.0), torch.full_like(nxt, math.inf))
    excess = ratio - c - slack
    info = _informative(r, eta, c) & ok
    max_ratio = float(ratio[info].max()) if bool(info.any()) else math.nan
    return ContractionCheck(
        bound=c,
        max_ratio=max_ratio,
        holds=bool((excess <= 0).all()),
        max_excess=float(excess.max()),
        n_informative=int(info.sum()),
        eta=float(eta),
    )


def invert_fixed_point(
    Y: Tensor,
    block: ResidualAttention,
    *,
    x0: Tensor | None = None,
    max_iter: int = 200,
    tol: float | None = None,
    lipschitz: float | None = None,
) -> FixedPointResult:
    r"""Solve :math:`x+g(x)=y` by the iteration :math:`x_{k+1}=y-g(x_k)`, :math:`x_0=y`.

    When :math:`\mathrm{Lip}(g)\le c<1` on a set that holds the iterates, the map
    :math:`x\mapsto y-g(x)` is a contraction and the iterates converge to the unique preimage,
    with :math:`\|x_k-x^*\|\le\frac{c^k}{1-c}\|x_1-x_0\|` (Banach; docs/derivations/invertible.md
    §3). Without such a bound nothing is promised: the iteration may wander or converge to
    another solution of :math:`x+g(x)=y` (a different preimage, when the block is not
    injective).

    Parameters
    ----------
    Y : Tensor, shape (..., n, d)
        The output to invert; norms are taken over the whole tensor (Frobenius).
    block : ResidualAttention
    x0 : Tensor, optional
        Starting point (default ``Y``).
    max_iter : int, default 200
        Largest number of evaluations of :math:`g`.
    tol : float, optional
        Stop when :math:`\|x_k+g(x_k)-y\|\le\mathrm{tol}\cdot\max(1,\|y\|)`; default
        :math:`10^3` units in the last place of the dtype (``2.2e-13`` in float64).
    lipschitz : float, optional
        A certified bound :math:`c` (e.g. ``certified_lipschitz(block, n).bound``): the result
        then carries :func:`check_contraction` of the observed ratios against it.

    Returns
    -------
    FixedPointResult
    """
    if not isinstance(block, ResidualAttention):
        raise TypeError(f"block must be a ResidualAttention, got {type(block).__name__}")
    if not isinstance(Y, Tensor) or not Y.is_floating_point():
        raise TypeError("Y must be a floating tensor")
    max_iter = int(max_iter)
    if max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter}")
    eps = torch.finfo(Y.dtype).eps
    tol = 1e3 * eps if tol is None else float(tol)
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    Y = Y.detach()
    x = Y.clone() if x0 is None else x0.detach().to(Y).clone()
    if x.shape != Y.shape:
        raise ValueError(f"x0 has shape {tuple(x.shape)}, Y has {tuple(Y.shape)}")
    y_norm = float(torch.linalg.vector_norm(Y.to(torch.float64)))
    scale = max(1.0, y_norm)
    res: list[float] = []
    g_max = 0.0
    status = "max_iter"
    x_out = x
    with torch.no_grad():
        for _ in range(max_iter):
            g = block.residual(x)
            x_next = Y - g
            r = float(torch.linalg.vector_norm((x - x_next).to(torch.float64)))
            g_max = max(g_max, float(torch.linalg.vector_norm(g.to(torch.float64))))
            res.append(r)
            x_out = x
            if not math.isfinite(r) or r > 1e6 * scale:
                status = "diverged"
                break
            if r <= tol * scale:
                status = "converged"
                break
            x = x_next
    residuals = torch.tensor(res, dtype=torch.float64)
    # Evaluation error of one step, x_k - (y - g(x_k)): a forward-error margin 64 sqrt(N) u of the
    # magnitudes involved (docs/derivations/invertible.md §3).
    N = Y.numel()
    eta = 64.0 * math.sqrt(N) * (eps / 2) * 2.0 * (g_max + y_norm)
    prev = residuals[:-1]
    ratios = residuals[1:] / torch.where(prev > 0, prev, torch.ones_like(prev))
    rate = math.nan
    if lipschitz is not None:
        info = _informative(residuals, eta, float(lipschitz)) & (prev > 0)
    else:
        info = (prev > 0) & (2 * eta <= 1e-3 * prev)
    idx = torch.nonzero(info).flatten()
    if idx.numel() >= 1:
        first, last = int(idx[0]), int(idx[-1]) + 1
        if residuals[first] > 0 and residuals[last] > 0:
            rate = float((residuals[last] / residuals[first]) ** (1.0 / (last - first)))
    check = None if lipschitz is None else check_contraction(residuals, lipschitz, eta=eta)
    return FixedPointResult(
        x=x_out,
        residuals=residuals,
        converged=status == "converged",
        status=status,
        n_iter=len(res),
        ratios=ratios,
        rate=rate,
        eta=eta,
        check=check,
    )


# ------------------------------------------------------------------- dot-product failure inputs
@dataclass(frozen=True, eq=False)
class TieInput:
    r"""Input of :func:`dot_product_tie_input`.

    Attributes
    ----------
    X : Tensor, shape (n, d)
        Row 0 is the query at the origin; rows 1.. are keys at :math:`\pm Rw`.
    w : Tensor, shape (d,)
        Unit direction.
    lam : float
        :math:`w^\top A^\top Vw`, the extreme eigenvalue (largest in absolute value) of the
        symmetric part of :math:`A^\top V`.
    kappa : float
        :math:`C_0 = \kappa R^2ww^\top` is the covariance of the query's attention law.
    growth : float
        :math:`\kappa R^2\lambda`, the eigenvalue of the rank-one part :math:`VC_0A^\top` of the
        query's own Jacobian block; :math:`\|Df(X)\|_2\ge|\kappa R^2\lambda|-\|V\|_2`.
    R : float
    n : int
    """

    X: Tensor
    w: Tensor
    lam: float
    kappa: float
    growth: float
    R: float
    n: int


def dot_product_tie_input(params: AttentionParams, R: float, n: int) -> TieInput:
    r"""A query at the origin attending evenly to keys at :math:`\pm Rw` (Kim et al.'s mechanism).

    Every score of the query :math:`x_0=0` is zero, so its attention is uniform over the
    :math:`n` tokens whatever :math:`R`, and its attention law has covariance
    :math:`C_0=\kappa R^2ww^\top`. The query's own Jacobian block is
    :math:`\frac1nV+VC_0A^\top`, whose rank-one part has the eigenvalue
    :math:`\kappa R^2\,w^\top A^\top Vw`: the local constant grows like :math:`R^2` at a fixed
    number of tokens, which is why dot-product attention is not globally Lipschitz
    (docs/derivations/invertible.md §4). :math:`w` maximises :math:`|w^\top A^\top Vw|` (an
    eigenvector of the symmetric part of :math:`A^\top V`). The keys are split
    :math:`\lfloor(n-1)/2\rfloor+1` at :math:`+Rw` and the rest at :math:`-Rw`: the imbalance
    makes the query's output nonzero, which the fixed-point iteration needs to leave an
    unstable preimage.

    Parameters
    ----------
    params : AttentionParams
        One head with :math:`d_v=d`.
    R : float
        Radius (largest token norm), ``R > 0``.
    n : int
        Number of tokens, ``n >= 2``.

    Returns
    -------
    TieInput
        ``X`` in the dtype and device of ``params``.
    """
    if not isinstance(params, AttentionParams):
        raise TypeError(f"params must be AttentionParams, got {type(params).__name__}")
    if params.d_v != params.d:
        raise ValueError("the construction needs a square value map (d_v = d)")
    R = float(R)
    if not (math.isfinite(R) and R > 0):
        raise ValueError(f"R must be a positive number, got {R!r}")
    n = int(n)
    if n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n}")
    A = params.A.detach().to(torch.float64)
    V = params.V.detach().to(torch.float64)
    M = A.mT @ V
    evals, evecs = torch.linalg.eigh((M + M.mT) / 2)
    w = evecs[:, int(evals.abs().argmax())]
    lam = float(w @ M @ w)
    n_plus = (n - 1) // 2 + 1
    n_minus = n - 1 - n_plus
    signs = torch.tensor([1.0] * n_plus + [-1.0] * n_minus, dtype=torch.float64)
    X = torch.cat([torch.zeros(1, A.shape[0], dtype=torch.float64), R * signs[:, None] * w])
    kappa = (n - 1) / n - ((n_plus - n_minus) / n) ** 2
    return TieInput(
        X=X.to(params.A),
        w=w.to(params.A),
        lam=lam,
        kappa=kappa,
        growth=kappa * R * R * lam,
        R=R,
        n=n,
    )
