"""Independent reference implementations: explicit loops over tokens, no shared code paths.

These never call `meanfield` internals; they recompute attention from its definition
(docs/theory.md §A1 and §4, docs/conventions.md §1) with plain Python loops and `math.exp` after max-subtraction.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def naive_head(X, A, V, *, log_w=None, allowed=None, c=None, b=None, queries=None):
    """Gamma(x_i) for one head, token by token. Arrays are numpy float64."""
    X = np.asarray(X, dtype=np.float64)
    Q = X if queries is None else np.asarray(queries, dtype=np.float64)
    n = X.shape[0]
    out = []
    for i in range(Q.shape[0]):
        keys = [j for j in range(n) if allowed is None or allowed(i, j)]
        logits = []
        for j in keys:
            s = float(Q[i] @ A @ X[j])
            if c is not None:
                s += float(c @ X[j])
            if log_w is not None:
                s += float(log_w[j])
            logits.append(s)
        mx = max(logits)
        ws = [math.exp(t - mx) for t in logits]
        tot = sum(ws)
        acc = np.zeros(V.shape[0])
        for w, j in zip(ws, keys):
            acc += (w / tot) * (V @ X[j])
        if b is not None:
            acc = acc + b
        out.append(acc)
    return np.stack(out)


def naive_multihead(X, heads, W_O=None, b_O=None, *, log_w=None, allowed=None):
    """Concatenate naive heads (each a dict with A, V, optional c, b), then project."""
    outs = [
        naive_head(X, h["A"], h["V"], log_w=log_w, allowed=allowed, c=h.get("c"), b=h.get("b"))
        for h in heads
    ]
    Y = np.concatenate(outs, axis=1)
    if W_O is not None:
        Y = Y @ np.asarray(W_O).T
        if b_O is not None:
            Y = Y + b_O
    return Y


def causal_index(i, j):
    """Sequence mask: query i sees keys j <= i."""
    return j <= i


def brute_force_w2_uniform(X, Y):
    """W_2 between uniform clouds of equal size by searching all permutations (Birkhoff)."""
    X, Y = np.asarray(X, float), np.asarray(Y, float)
    n = X.shape[0]
    best = min(
        sum(float(np.sum((X[i] - Y[s[i]]) ** 2)) for i in range(n))
        for s in itertools.permutations(range(n))
    )
    return math.sqrt(best / n)
