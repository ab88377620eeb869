r"""Start vectors of the matrix-free solvers: the Kronecker start (docs/certificates.md §6).

Through its value path alone, attention's Jacobian is :math:`\sum_h P^h\otimes W_hV_h` (token
mixing by the attention matrix :math:`P^h`, features mapped by :math:`W_hV_h`); the full
Jacobian adds the softmax terms. When the heads' attention matrices are alike, the value path is
close to one Kronecker product :math:`\bar P\otimes M`, with :math:`\bar P = \frac1H\sum_hP^h`
and :math:`M = \sum_hW_hV_h`, whose top right singular vector is :math:`v_{\bar P}\otimes v_M`.
That vector is cheap (a few dozen Lanczos steps on an :math:`n\times n` and a :math:`d\times d`
matrix, no product with :math:`J`) and often close to the top right singular vector of the whole
Jacobian: cosines 0.98-0.998 on randomly initialised GPT-2 layers and 0.37-0.89 on trained
MiniLM and SmolLM2 layers, where a random start has about :math:`1/\sqrt{nd}`.

:func:`kronecker_start` returns it plus a seeded Gaussian vector of the same norm, so that the
start keeps a random component in every direction: where the structure does not hold, the run
starts from what is essentially a random vector. A chosen start voids the
Kuczyński–Woźniakowski bound, which assumes a uniformly random one, so
:func:`~meanfield.lipschitz.local_lipschitz` forms no probabilistic certificate from it.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from ..attention import admissible_keys, head_logits, head_mask
from ..jacobian import AttentionLinearization
from ..jacobian.linearization import log_attention

__all__ = ["kronecker_start"]

#: Lanczos steps for the two top singular vectors (a start needs no more accuracy).
_LANCZOS_STEPS = 40


def _top_right_vector(M: Tensor) -> Tensor:
    """Unit top right singular vector of ``M`` (..., r, c): Lanczos on M^T M from the ones vector.

    Full reorthogonalisation, ``min(_LANCZOS_STEPS, c)`` steps; the gap between the top two
    singular values of the matrices here can be a few percent, where power iteration would need
    hundreds of steps.
    """
    # direction only: divide by the largest entry (constants near float64's range would
    # overflow M^T M); where that fails, no vector (zeros), and the start is the Gaussian alone
    scale = M.abs().amax((-2, -1), keepdim=True)
    ok = torch.isfinite(scale) & (scale > 0)
    M = torch.where(ok, M / torch.where(ok, scale, 1.0), 0.0)
    c = M.shape[-1]
    k = max(1, min(_LANCZOS_STEPS, c))
    q = torch.ones(M.shape[:-2] + (c,), dtype=M.dtype, device=M.device) / c**0.5
    basis = [q]
    alphas: list[Tensor] = []
    betas: list[Tensor] = []
    for j in range(k):
        w = (M.mT @ (M @ basis[j].unsqueeze(-1))).squeeze(-1)
        alphas.append((w * basis[j]).sum(-1))
        Qb = torch.stack(basis, dim=-1)  # (..., c, j + 1)
        w = w - (Qb @ (Qb.mT @ w.unsqueeze(-1))).squeeze(-1)
        w = w - (Qb @ (Qb.mT @ w.unsqueeze(-1))).squeeze(-1)  # twice is enough
        beta = torch.linalg.vector_norm(w, dim=-1)
        if j == k - 1 or bool((beta <= 1e-10 * alphas[0].abs().clamp_min(1e-300)).all()):
            break
        betas.append(beta)
        basis.append(w / beta.clamp_min(1e-300).unsqueeze(-1))
    m = len(alphas)
    T = torch.diag_embed(torch.stack(alphas, -1))
    if m > 1:
        off = torch.diag_embed(torch.stack(betas[: m - 1], -1), offset=1)
        T = T + off + off.mT
    _, vecs = torch.linalg.eigh(T)
    v = (torch.stack(basis[:m], dim=-1) @ vecs[..., -1:]).squeeze(-1)
    v = v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    good = ok.squeeze(-1) & torch.isfinite(v).all(-1, keepdim=True)
    return torch.where(good, v, 0.0)


#: v_M per parameters object (it depends on the weights only); a stale entry after an in-place
#: change of the weights only makes the start less good, never a result wrong.
_VM_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _value_vector(lin: AttentionLinearization) -> Tensor:
    """Top right singular vector of M = sum_h W_h V_h, cached per parameters and dtype."""
    per = _VM_CACHE.setdefault(lin.params, {})
    key = (lin.X.dtype, lin.X.device)
    if key not in per:
        V = torch.stack([h.V for h in lin.params.heads]).to(lin.X)  # rotary heads included
        per[key] = _top_right_vector(torch.einsum("hov,hvd->od", lin.W.to(lin.X), V))
    return per[key]


def _mean_attention(lin: AttentionLinearization, weighted: bool) -> Tensor:
    """Mean over every head of the attention matrices of the operator, (..., n, n)."""
    P_an = lin.P_w if (weighted and lin.P_w is not None) else lin.P
    total = P_an.sum(-3) if lin.analytic_heads else None
    rr = lin.rope_rows
    if rr is not None:  # the rotary heads' attention matrices, formed by linearize
        P_r = rr.P_w if (weighted and rr.P_w is not None) else rr.P
        total = P_r.sum(-3) if total is None else total + P_r.sum(-3)
    elif lin.rope_heads:
        n = lin.n
        allowed = admissible_keys(lin.masked, n, n, lin.positions, None, lin.X.device)
        idx = lin.token_index
        for h in lin.rope_heads:
            head = lin.params.heads[h]
            logits = head_logits(
                lin.X, lin.X, head, lin.log_weights, query_index=idx, key_index=idx
            )
            logP = log_attention(logits, head_mask(head, allowed, idx, idx, n, n, lin.X.device))
            if weighted and lin.P_w is not None and lin.log_weights is not None:
                half = 0.5 * lin.log_weights.unsqueeze(-2)
                logP = logP + half.mT - half
            P = logP.exp()
            total = P if total is None else total + P
    assert total is not None
    return total / len(lin.params.heads)


def kronecker_start(
    lin: AttentionLinearization,
    *,
    geometry: str = "euclidean",
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Start vector :math:`\hat s + \hat g` for the top singular vector of :math:`J` at ``lin``.

    :math:`\hat s = v_{\bar P}\otimes v_M/\|\cdot\|`, the top right singular vector of the
    Kronecker approximation :math:`\bar P\otimes M` of the value path (module docstring;
    :math:`\bar P` is the mean of the heads' attention matrices of the operator of
    ``geometry``, :math:`M = \sum_hW_hV_h`; zero if either matrix is not finite), and
    :math:`\hat g` a unit Gaussian vector drawn from ``generator``. Cost :math:`O(Hn^2 + d_{\rm out}dd_v H)` to form the two matrices,
    then :math:`O(n^2 + d_{\rm out}d)` per Lanczos step (rotary heads add their attention
    matrices, :math:`O(Hn^2k)`); no product with :math:`J`. :math:`v_M` depends on the weights
    only and is kept per parameters object.

    Parameters
    ----------
    lin : AttentionLinearization
    geometry : {"euclidean", "wasserstein"}, default "euclidean"
        ``"wasserstein"`` uses the weighted attention matrices :math:`\tilde P` of
        :math:`D_a^{1/2}JD_a^{-1/2}`.
    generator : torch.Generator, optional
        Source of the Gaussian part (the global generator when omitted).

    Returns
    -------
    Tensor, shape (..., n, d), in the dtype of ``lin``
    """
    if geometry not in ("euclidean", "wasserstein"):
        raise ValueError(f"geometry must be 'euclidean' or 'wasserstein', got {geometry!r}")
    vM = _value_vector(lin).to(lin.X)
    vP = _top_right_vector(_mean_attention(lin, geometry == "wasserstein"))
    s = vP.unsqueeze(-1) * vM  # (..., n, d), unit norm (zero where a matrix was not finite)
    gdev = generator.device if generator is not None else torch.device("cpu")
    g = torch.randn(s.shape, generator=generator, dtype=torch.float64, device=gdev).to(s)
    g = g / torch.linalg.vector_norm(g.flatten(-2), dim=-1)[..., None, None]
    return s + g
