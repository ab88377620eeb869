r"""Rounding margin of the numpy certified local bound (docs/rounding.md §8).

:func:`theory.bounds.certified_local_upper` evaluates a closed-form bound in float64. Its value
for one head is :math:`\|W_hV_h\|_2\,(t_1+t_2+t_3)`; this module turns the computed terms into a
number that is at least the *exact* bound of the exact inputs:

* the attention matrix carries a relative error :math:`\varepsilon_P` from the logits (their
  rounding grows with their magnitude, docs/rounding.md §2) and from the exponentials;
* :math:`m_i`, :math:`\kappa_i` and :math:`C_i` are formed from uncentred coordinates, so their
  absolute error is of order :math:`\gamma_{n+d}\max_j\|x_j\|`, which matters at near-ties where
  :math:`\kappa_i` is tiny;
* spectral norms from LAPACK are backward stable: relative error :math:`\gamma_{4m}`.

Numpy only; no torch. A public module of :mod:`theory` (outside its ``__init__`` exports): the
torch bound of :mod:`meanfield` applies the same margin (``meanfield.lipschitz.local_bound``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["U64", "RotaryRows", "gamma", "head_upper", "logit_error"]

#: Unit roundoff of float64.
U64 = 2.0**-53


def gamma(k: float) -> float:
    r""":math:`\gamma_k = ku/(1-ku)` for float64 (``inf`` when :math:`ku\ge1`)."""
    ku = k * U64
    return ku / (1.0 - ku) if ku < 1.0 else math.inf


@dataclass(frozen=True)
class RotaryRows:
    r"""A rotary head's factors and rotation, for its rounding margin (docs/rounding.md §8.1).

    The logits are :math:`s_{ij} = \langle\mathcal R_iQx_i, \mathcal R_jKx_j\rangle` with
    :math:`\mathcal R_p` the rotation by the angles :math:`p\,\omega` (``inv_freq`` repeated over
    the two halves) times ``scaling``; ``positions`` are the tokens' positions.
    """

    Q: np.ndarray
    K: np.ndarray
    inv_freq: np.ndarray
    scaling: float
    positions: np.ndarray

    def rounding(self) -> float:
        r"""Relative error of one computed rotation, :math:`4u(2 + \max|p\omega|) + 4u`.

        The cosines and sines of angles up to :math:`\max|p\omega|` and the scaling, then the two
        products and the sum of a rotated coordinate (docs/rounding.md §2.1, §3.1).
        """
        top = float(np.max(np.abs(self.positions))) if self.positions.size else 0.0
        freq = float(np.max(np.abs(self.inv_freq))) if self.inv_freq.size else 0.0
        return 4 * U64 * (2 + top * freq) + 4 * U64

    def magnitude(self, X: np.ndarray) -> np.ndarray:
        r"""Logits on absolute values, :math:`\bar q_i\cdot\bar k_j`.

        The rotated rows are bounded entrywise, :math:`\bar q = |\alpha|(|Q||x| + \mathrm{swap})`
        (docs/rounding.md §2.1).
        """
        aX = np.abs(X)

        def rot(Z: np.ndarray) -> np.ndarray:
            half = Z.shape[-1] // 2
            return abs(self.scaling) * (Z + np.concatenate([Z[:, half:], Z[:, :half]], axis=1))

        return rot(aX @ np.abs(self.Q).T) @ rot(aX @ np.abs(self.K).T).T


def logit_error(
    X: np.ndarray,
    A: np.ndarray,
    c: np.ndarray | None,
    S: np.ndarray,
    rotary: RotaryRows | None = None,
) -> float:
    r"""Relative error :math:`\varepsilon_P` of the computed attention matrix (docs/rounding.md §2).

    ``S`` are the computed logits (``-inf`` where masked). The logits are off by at most
    :math:`\gamma_{2d+4}(|x_i|^\top|A||x_j|+|c|^\top|x_j|)` plus the subtraction of the row maximum
    (:math:`u` times the spread); the softmax turns a logit error :math:`\delta` into a relative
    error :math:`\mathrm{expm1}(2\delta)`, and the exponential and normalisation add
    :math:`u(\text{spread}+\log n+8)`. A rotary head (``rotary``; ``A`` and ``c`` unused) has
    the magnitude of :meth:`RotaryRows.magnitude` and its rotations' rounding on top
    (docs/rounding.md §8.1).
    """
    aX = np.abs(X)
    n, d = X.shape
    if rotary is None:
        sbar = aX @ np.abs(A) @ aX.T
        if c is not None:
            sbar = sbar + (aX @ np.abs(c))[None, :]
        rel = gamma(2 * d + 4)
    else:
        sbar = rotary.magnitude(X)
        rel = gamma(rotary.Q.shape[0] + d + 4) + 2 * rotary.rounding()
    finite = np.isfinite(S)
    hi = np.max(np.where(finite, S, -np.inf), axis=1, keepdims=True)
    lo = np.min(np.where(finite, S, np.inf), axis=1, keepdims=True)
    spread = float(np.max(hi - lo))
    delta = rel * sbar * (1 + gamma(2 * d + 4)) + U64 * np.abs(hi - S)
    delta = float(np.max(np.where(finite, delta, 0.0)))
    return math.expm1(2 * delta) * (1 + 4 * U64) + U64 * (spread + math.log(n) + 8)


def head_upper(
    X: np.ndarray,
    A: np.ndarray,
    c: np.ndarray | None,
    S: np.ndarray,
    WV: np.ndarray,
    t1: float,
    t2: float,
    t3: float,
    kappa2: np.ndarray,
    beta2: np.ndarray,
    rotary: RotaryRows | None = None,
) -> float:
    r"""One head's term :math:`\|W_hV_h\|_2(t_1+t_2+t_3)` plus its rounding margin, rounded up.

    With :math:`e_\kappa = 2\gamma_{2(n+d)+8}\max_j\|x_j\|` (the absolute error of the computed
    differences :math:`x_j-m_i`), :math:`\beta_{\max}=\max_i\beta_i` and
    :math:`\kappa_{\max}=\max_i\kappa_i`, the terms move by at most

    * :math:`t_1`: :math:`(\varepsilon_P+\gamma_{4n})t_1`;
    * :math:`t_2`: :math:`(2\varepsilon_P+\gamma_{2n+d})t_2+e_\kappa\beta_{\max}\sqrt n`;
    * :math:`t_3`: :math:`(2\varepsilon_P+\gamma_{4(n+d)})t_3+\|A\|_2(2e_\kappa\kappa_{\max}+
      e_\kappa^2)`;

    and :math:`\|W_hV_h\|_2` by :math:`\gamma_{4\max(d_v,d)}` relatively (docs/rounding.md §8).
    Each relative factor is doubled to cover second-order terms. A rotary head (``rotary``) has
    the logit error of :func:`logit_error`, :math:`|\alpha|^2\|Q\|_2\|K\|_2` in the place of
    :math:`\|A\|_2` and its gradients' two rotations in the relative factors of :math:`t_2` and
    :math:`t_3` (docs/rounding.md §8.1).
    """
    n, d = X.shape
    eps = logit_error(X, A, c, S, rotary)
    wv = float(np.linalg.norm(WV, 2)) * (1 + 2 * gamma(4 * max(WV.shape) + 8))
    e_k = 2 * gamma(2 * (n + d) + 8) * float(np.max(np.linalg.norm(X, axis=1)))
    bmax = math.sqrt(max(float(np.max(beta2)), 0.0))
    kmax = math.sqrt(max(float(np.max(kappa2)), 0.0))
    if rotary is None:
        nA = float(np.linalg.norm(A, 2)) * (1 + 2 * gamma(4 * d + 8))
        grad = 0.0
    else:
        k = rotary.Q.shape[0]
        nQ = float(np.linalg.norm(rotary.Q, 2)) * (1 + 2 * gamma(4 * max(k, d) + 8))
        nK = float(np.linalg.norm(rotary.K, 2)) * (1 + 2 * gamma(4 * max(k, d) + 8))
        nA = rotary.scaling**2 * nQ * nK * (1 + 4 * U64)
        # the gradients K^T R_j^T q~_i and Q^T R_i^T k~_j: two computed rotations and a product
        # of length k more than the plain head's
        grad = 4 * rotary.rounding() + gamma(2 * k + 8)
    m1 = t1 * (1 + 2 * (eps + gamma(4 * n + 8)))
    m2 = t2 * (1 + 2 * (2 * eps + grad + gamma(2 * n + d + 8))) + 2 * e_k * bmax * math.sqrt(n)
    m3 = t3 * (1 + 2 * (2 * eps + grad + gamma(4 * (n + d) + 8)))
    m3 += 2 * nA * (2 * e_k * kmax + e_k**2)
    out = wv * (m1 + m2 + m3) * (1 + 8 * U64)
    return float(np.nextafter(out, np.inf)) if math.isfinite(out) else math.inf
