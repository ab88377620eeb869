"""Independent oracles for Jacobian tests: finite differences, token loops, random layers.

Nothing here calls `meanfield.jacobian` or `meanfield.lipschitz`: the block formula is recomputed
with numpy loops from docs/theory.md §1, and finite differences go through `attention_points` only.
"""

from __future__ import annotations

import numpy as np
import torch

from meanfield import AttentionParams, MultiHeadParams

from .tolerances import DIFFERS

D64 = torch.float64


def central_fd_jacobian(fn, X: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    """Central finite-difference Jacobian of ``fn`` at one sample ``X``, shape (out, X.numel())."""
    x = X.detach().reshape(-1).clone()
    cols = []
    for k in range(x.numel()):
        e = torch.zeros_like(x)
        e[k] = h
        plus = fn((x + e).reshape(X.shape)).reshape(-1)
        minus = fn((x - e).reshape(X.shape)).reshape(-1)
        cols.append((plus - minus) / (2 * h))
    return torch.stack(cols, dim=1)


def block_formula_loops(X, A, V, *, c=None, log_w=None, allowed=None):
    """J_ij = P_ij V (I + (x_j - m_i) b_i^T) + delta_ij V C_i A^T with b_i = A^T x_i + c, by loops.

    numpy float64; ``allowed(i, j)`` is the mask predicate. Returns (n*d_v, n*d).
    """
    X, A, V = (np.asarray(t, dtype=np.float64) for t in (X, A, V))
    n, d = X.shape
    d_v = V.shape[0]
    c = np.zeros(d) if c is None else np.asarray(c, dtype=np.float64)
    J = np.zeros((n * d_v, n * d))
    for i in range(n):
        keys = [j for j in range(n) if allowed is None or allowed(i, j)]
        logits = np.array(
            [X[i] @ A @ X[j] + c @ X[j] + (0.0 if log_w is None else float(log_w[j])) for j in keys]
        )
        w = np.exp(logits - logits.max())
        w /= w.sum()
        P = dict(zip(keys, w, strict=True))
        m = sum(P[j] * X[j] for j in keys)
        C = sum(P[j] * np.outer(X[j] - m, X[j] - m) for j in keys)
        b = A.T @ X[i] + c
        for j in keys:
            block = P[j] * V @ (np.eye(d) + np.outer(X[j] - m, b))
            if j == i:
                block = block + V @ C @ A.T
            J[i * d_v : (i + 1) * d_v, j * d : (j + 1) * d] = block
    return J


def nonsymmetric(gen: torch.Generator, d: int, scale: float = 1.0) -> torch.Tensor:
    """A random score matrix that is visibly non-symmetric."""
    A = scale * torch.randn(d, d, generator=gen, dtype=D64) / d**0.5
    if d > 1:
        assert float((A - A.mT).abs().max()) > DIFFERS
    return A


def random_head(gen, d, d_v, *, biases=True, scale=1.0) -> AttentionParams:
    A = nonsymmetric(gen, d, scale)
    V = torch.randn(d_v, d, generator=gen, dtype=D64) / d**0.5
    if not biases:
        return AttentionParams(A, V)
    c = torch.randn(d, generator=gen, dtype=D64)
    b = torch.randn(d_v, generator=gen, dtype=D64)
    return AttentionParams(A, V, c=c, b=b)


def random_params(gen, d, *, kind="single", d_v=3, H=3, d_out=4, biases=True, scale=1.0):
    """``kind`` in {"single", "concat", "wo"}: one head, concatenated heads, heads with W_O."""
    if kind == "single":
        return random_head(gen, d, d_v, biases=biases, scale=scale)
    heads = tuple(random_head(gen, d, d_v, biases=biases, scale=scale) for _ in range(H))
    if kind == "concat":
        return MultiHeadParams(heads)
    W_O = torch.randn(d_out, H * d_v, generator=gen, dtype=D64) / (H * d_v) ** 0.5
    b_O = torch.randn(d_out, generator=gen, dtype=D64) if biases else None
    return MultiHeadParams(heads, W_O=W_O, b_O=b_O)


def random_log_weights(gen, shape, spread=3.0) -> torch.Tensor:
    """Log-masses of a random point of the simplex, spanning about ``spread`` e-folds."""
    return torch.log_softmax(spread * torch.randn(*shape, generator=gen, dtype=D64), dim=-1)
