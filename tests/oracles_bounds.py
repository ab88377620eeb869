"""Independent numpy oracles for the tests of :mod:`theory.bounds`.

Written from the definitions in docs/theory.md and sharing no code with theory/: a naive
log-weighted softmax attention, the closed-form Jacobian blocks of docs/theory.md §1 (checked
against central finite differences in tests/theory/test_bounds_sqrt_n.py), the mean-field local
constant of docs/theory.md §16, and the two constructions (random points in the ball, the
eigenvector construction).
"""

from __future__ import annotations

import numpy as np


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    return e / e.sum(axis=1, keepdims=True)


def attention_weights(X, A, log_a=None, masked=False):
    logits = X @ A @ X.T
    if log_a is not None:
        logits = logits + log_a[None, :]
    if masked:
        logits = np.where(np.tril(np.ones_like(logits, dtype=bool)), logits, -np.inf)
    return softmax_rows(logits)


def attention(X, A, V, log_a=None, masked=False):
    return attention_weights(X, A, log_a, masked) @ X @ V.T


def jacobian(X, A, V, log_a=None, masked=False):
    """Closed-form Jacobian (docs/theory.md §1), shape (n*d_v, n*d), blocks J_ij = d f_i / d x_j."""
    n, d = X.shape
    dv = V.shape[0]
    P = attention_weights(X, A, log_a, masked)
    m = P @ X
    J = np.zeros((n * dv, n * d))
    for i in range(n):
        D = X - m[i]
        C = (P[i][:, None] * D).T @ D
        b = A.T @ X[i]
        for j in range(n):
            blk = P[i, j] * V @ (np.eye(d) + np.outer(D[j], b))
            if i == j:
                blk = blk + V @ C @ A.T
            J[i * dv : (i + 1) * dv, j * d : (j + 1) * d] = blk
    return J


def fd_jacobian(fun, X, h=1e-6):
    x0 = X.ravel()
    cols = []
    for k in range(x0.size):
        e = np.zeros_like(x0)
        e[k] = h
        diff = fun((x0 + e).reshape(X.shape)) - fun((x0 - e).reshape(X.shape))
        cols.append(diff.ravel() / (2 * h))
    return np.stack(cols, axis=1)


def spec(M):
    return np.linalg.norm(M, 2)


def mean_field_local(X, a, A, V):
    """L_W of docs/theory.md §16: ||D_a^{1/2} J D_a^{-1/2}||_2 with the weighted Jacobian."""
    n, d = X.shape
    dv = V.shape[0]
    J = jacobian(X, A, V, log_a=np.log(a))
    scale = np.sqrt(np.repeat(a, dv))[:, None] / np.sqrt(np.repeat(a, d))[None, :]
    return spec(J * scale)


def random_ball(rng, n, d, R):
    Z = rng.normal(size=(n, d))
    r = R * rng.uniform(0.2, 1.0, size=(n, 1)) ** (1 / d)
    return Z / np.linalg.norm(Z, axis=1, keepdims=True) * r


def random_instance(rng, n_range, R_range, d, dv):
    """A random head and input: ``(n, R, A, V, X)`` with A (d, d), V (dv, d), X in B_R^n.

    Draws, in this order, ``n = rng.integers(*n_range)``, ``R = rng.uniform(*R_range)``, A, V
    (standard normal) and X (:func:`random_ball`).
    """
    n = int(rng.integers(*n_range))
    R = float(rng.uniform(*R_range))
    A = rng.normal(size=(d, d))
    V = rng.normal(size=(dv, d))
    return n, R, A, V, random_ball(rng, n, d, R)


def construction(u, R, n, case):
    if case == "+":
        X = np.tile(R / 2 * u, (n, 1))
        X[0] = R * u
    else:
        X = np.tile(R * u, (n, 1))
        X[0] = -R * u
    return X
