"""Oracles for the bounded-logit bounds: exact float64 Jacobians of the variant heads (torch).

The heads are built with :class:`meanfield.AttentionParams` (``softcap``, ``q_norm``/``k_norm``
with ``logit_scale``, ``window``) and differentiated by torch autograd through
:func:`meanfield.attention.attention_points`, independently of the numpy formulas of
``theory/bounds/bounded_logits.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import meanfield
from meanfield.attention import attention_points
from meanfield.params import RMSNorm

F64 = torch.float64


@dataclass
class Head:
    """One random head of a given form and the norms its bounds take."""

    form: str  # "softcap", "qk_norm", "window", "plain"
    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    scale: float
    kappa: float | None = None
    eps: float | None = None
    wq: np.ndarray | None = None
    wk: np.ndarray | None = None
    window: int | None = None

    @property
    def A(self) -> np.ndarray:
        return self.scale * self.Q.T @ self.K

    def params(self) -> meanfield.AttentionParams:
        t = lambda a: torch.as_tensor(a, dtype=F64)  # noqa: E731
        if self.form == "qk_norm":
            return meanfield.AttentionParams(
                None,
                t(self.V),
                Q=t(self.Q),
                K=t(self.K),
                q_norm=RMSNorm(t(self.wq), self.eps),
                k_norm=RMSNorm(t(self.wk), self.eps),
                logit_scale=self.scale,
                window=self.window,
            )
        return meanfield.AttentionParams(
            None,
            t(self.V),
            Q=t(self.scale * self.Q),
            K=t(self.K),
            softcap=self.kappa,
            window=self.window,
        )


def random_head(rng: np.random.Generator, form: str, d: int, k: int, *, d_v: int = 2) -> Head:
    Q = rng.standard_normal((k, d))
    K = rng.standard_normal((k, d))
    V = rng.standard_normal((d_v, d))
    scale = float(rng.uniform(0.3, 1.5))
    h = Head(form, Q, K, V, scale)
    if form == "softcap":
        h.kappa = float(rng.choice([0.3, 1.0, 3.0, 10.0]))
    if form == "qk_norm":
        h.eps = float(rng.choice([1e-6, 1e-3, 0.1, 1.0]))
        h.wq = rng.uniform(0.3, 1.7, k)
        h.wk = rng.uniform(0.3, 1.7, k)
    if form in ("window", "softcap", "qk_norm") and (form == "window" or rng.integers(3) == 0):
        h.window = int(rng.integers(1, 4))
    return h


def jacobian(
    X: np.ndarray | torch.Tensor,
    params: meanfield.AttentionParams | meanfield.MultiHeadParams,
    *,
    masked: bool = False,
    log_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The (n d_out, n d) float64 Jacobian of the sequence map (log-masses fixed)."""
    Xt = torch.as_tensor(X, dtype=F64)
    n, d = Xt.shape

    def f(Z: torch.Tensor) -> torch.Tensor:
        return attention_points(Z, params, masked=masked, log_weights=log_weights)

    J = torch.autograd.functional.jacobian(f, Xt)
    return J.reshape(n * J.shape[1], n * d)


def exact_norm(X, params, *, masked: bool = False) -> float:
    """sigma_max of the exact Jacobian: the local constant ||Df(X)||_2."""
    return float(torch.linalg.matrix_norm(jacobian(X, params, masked=masked), ord=2))


def wasserstein_local(X, log_a: np.ndarray, params) -> float:
    """L_W(mu) = ||D_a^{1/2} J D_a^{-1/2}||_2 for mu = sum_j a_j delta_{x_j} (docs/theory.md §16)."""
    X_ = torch.as_tensor(X, dtype=F64)
    n, d = X_.shape
    lw = torch.as_tensor(log_a, dtype=F64)
    J = jacobian(X_, params, log_weights=lw)
    d_out = J.shape[0] // n
    a = torch.exp(lw - torch.logsumexp(lw, 0))
    left = torch.sqrt(a).repeat_interleave(d_out)
    right = torch.rsqrt(a).repeat_interleave(d)
    return float(torch.linalg.matrix_norm(left[:, None] * J * right[None, :], ord=2))


def ball_points(rng: np.random.Generator, n: int, d: int, R: float) -> np.ndarray:
    """n points in the ball of radius R, the largest on the sphere."""
    X = rng.standard_normal((n, d))
    X *= rng.uniform(0.0, 1.0, size=(n, 1)) ** (1.0 / d)
    X *= R / max(float(np.max(np.linalg.norm(X, axis=1))), 1e-300)
    return X


def radius(X: np.ndarray) -> float:
    return float(np.max(np.linalg.norm(X, axis=1)))
