"""Independent oracles for the attack tests (no meanfield.attacks code).

The closed-form Jacobian blocks of the attention map (docs/derivations/jacobian_products.md) in
numpy, weighted and masked; the two-Dirac optimum recomputed from its quadratic; a log-log slope.
"""

from __future__ import annotations

import math

import numpy as np
import torch

F64 = torch.float64


def jacobian_oracle(X, A, V, log_w=None, masked=False):
    """Dense Jacobian (n d_v, n d) from the closed-form blocks, in numpy.

    Blocks as in docs/derivations/jacobian_products.md.

    d f_i / d x_j = P_ij V (I + (x_j - m_i)(A^T x_i)^T) + delta_ij V C_i A^T, logits + log a_j.
    """
    X, A, V = (np.asarray(t, dtype=np.float64) for t in (X, A, V))
    n, d = X.shape
    dv = V.shape[0]
    lw = np.zeros(n) if log_w is None else np.asarray(log_w, dtype=np.float64)
    L = X @ A @ X.T + lw[None, :]
    if masked:
        L = np.where(np.tril(np.ones((n, n), bool)), L, -np.inf)
    L = L - L.max(1, keepdims=True)
    P = np.exp(L)
    P /= P.sum(1, keepdims=True)
    J = np.zeros((n * dv, n * d))
    for i in range(n):
        m = P[i] @ X
        C = sum(P[i, l] * np.outer(X[l] - m, X[l] - m) for l in range(n))
        b = A.T @ X[i]
        for j in range(n):
            blk = P[i, j] * V @ (np.eye(d) + np.outer(X[j] - m, b))
            if i == j:
                blk = blk + V @ C @ A.T
            J[i * dv : (i + 1) * dv, j * d : (j + 1) * d] = blk
    return J


def seq_norm(X, A, V, masked=False):
    return np.linalg.norm(jacobian_oracle(X, A, V, masked=masked), 2)


def lw_norm(mu, A, V, masked=False):
    """L_W(mu) = ||D_a^{1/2} J D_a^{-1/2}||_2 from the oracle (docs/theory.md §A2)."""
    lw = mu.log_weights.double().numpy()
    J = jacobian_oracle(mu.points.double(), A, V, lw, masked=masked)
    d, dv = mu.d, np.asarray(V).shape[0]
    so, si = np.repeat(0.5 * lw, dv), np.repeat(0.5 * lw, d)
    return np.linalg.norm(np.exp(so[:, None] - si[None, :]) * J, 2)


def random_head(rng, d, scale=1.0):
    A = torch.tensor(rng.standard_normal((d, d)) * scale / math.sqrt(d))
    V = torch.tensor(rng.standard_normal((d, d)))
    return A, V


def sup_g(gamma, Vu=1.0):
    """docs/theory.md §5 optimum, recomputed from the quadratic."""
    if gamma == 0:
        v = 0.5
    else:
        v = ((3 * gamma - 2) + math.sqrt(9 * gamma**2 + 4 * gamma + 4)) / (8 * gamma)
    return math.exp(gamma / 2) * math.sqrt(v * (1 - v)) * (1 + gamma * v) * Vu


def slope(x, y):
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])
