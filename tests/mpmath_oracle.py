r"""Independent 50-digit reference for the local Lipschitz constant of attention (mpmath only).

Nothing here imports ``meanfield``: the inputs are plain float64 numbers (read exactly), the
attention matrix, the Jacobian and its singular values are computed in mpmath with
``mp.dps = 50``.

Map: :math:`f(X)_i = \sum_hW_hV_h\sum_jP^h_{ij}x_j` with
:math:`P^h_{ij}\propto a_j\exp(x_i^\top A_hx_j + c_h^\top x_j)` over admissible keys (``j <= i``
when masked). Jacobian block :math:`(i, k)` of one head, :math:`b_i = A^\top x_i + c`:

.. math:: WV\Big(P_{ik}I + P_{ik}(x_k - m_i)b_i^\top
          + \delta_{ik}\sum_jP_{ij}(x_j - m_i)(Ax_j)^\top\Big),

and the Wasserstein operator multiplies block :math:`(i, k)` by :math:`\sqrt{a_i/a_k}`. The
formula is checked against central differences of :func:`forward` in mpmath
(tests/test_rigour.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import mpmath as mp
import numpy as np

DPS = 50


def _mat(a) -> mp.matrix:
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    return mp.matrix([[mp.mpf(float(v)) for v in row] for row in a])


def _heads(heads: Sequence[tuple]) -> list[tuple]:
    out = []
    for head in heads:  # (A, V, W, c); A may be a pair (Q, K) of factors
        A, V, W, c = (*head, None, None)[:4]
        if isinstance(A, tuple):  # factors (Q, K): A = Q^T K formed exactly
            A_ = _mat(A[0]).T * _mat(A[1])
        else:
            A_ = _mat(A)
        V_ = _mat(V)
        W_ = mp.eye(V_.rows) if W is None else _mat(W)
        c_ = None if c is None else [mp.mpf(float(v)) for v in np.ravel(c)]
        out.append((A_, V_, W_, c_))
    return out


def _rows(X: mp.matrix) -> list[mp.matrix]:
    return [X[i, :].T for i in range(X.rows)]


def _attention(xs, A, c, logw, masked):
    n = len(xs)
    P = mp.matrix(n, n)
    for i in range(n):
        keys = [j for j in range(n) if (j <= i or not masked) and logw[j] is not None]
        s = {}
        for j in keys:
            v = (xs[i].T * A * xs[j])[0] + logw[j]
            if c is not None:
                v += mp.fsum(c[t] * xs[j][t] for t in range(len(c)))
            s[j] = v
        top = max(s.values())
        z = mp.fsum(mp.exp(v - top) for v in s.values())
        for j in keys:
            P[i, j] = mp.exp(s[j] - top) / z
    return P


def _logw(weights, n):
    if weights is None:
        return [mp.mpf(0)] * n
    return [None if float(w) == 0.0 else mp.log(mp.mpf(float(w))) for w in weights]


def forward(X, heads, *, weights=None, masked=False) -> mp.matrix:
    """Outputs (n, d_out) of the map above, in mpmath."""
    with mp.workdps(DPS):
        Xm = _mat(X)
        xs = _rows(Xm)
        n = len(xs)
        logw = _logw(weights, n)
        out = None
        for A, V, W, c in _heads(heads):
            P = _attention(xs, A, c, logw, masked)
            M = P * Xm  # rows m_i
            Y = M * (W * V).T
            out = Y if out is None else out + Y
        return out


def jacobian(X, heads, *, weights=None, masked=False, geometry="euclidean") -> mp.matrix:
    """The (n d_out) x (n d) Jacobian (Wasserstein-scaled when asked), in mpmath."""
    with mp.workdps(DPS):
        Xm = _mat(X)
        xs = _rows(Xm)
        n, d = Xm.rows, Xm.cols
        logw = _logw(weights, n)
        J = None
        for A, V, W, c in _heads(heads):
            O = W * V
            dout = O.rows
            if J is None:
                J = mp.matrix(n * dout, n * d)
            P = _attention(xs, A, c, logw, masked)
            ms = [sum((P[i, j] * xs[j] for j in range(n)), mp.matrix(d, 1)) for i in range(n)]
            for i in range(n):
                b = A.T * xs[i]
                if c is not None:
                    b = b + mp.matrix(c)
                self_block = mp.matrix(d, d)
                for j in range(n):
                    if P[i, j] != 0:
                        self_block += P[i, j] * (xs[j] - ms[i]) * (A * xs[j]).T
                for k in range(n):
                    blk = P[i, k] * (mp.eye(d) + (xs[k] - ms[i]) * b.T)
                    if k == i:
                        blk = blk + self_block
                    blk = O * blk
                    for a in range(dout):
                        for t in range(d):
                            J[i * dout + a, k * d + t] += blk[a, t]
        if geometry == "wasserstein" and weights is not None:
            a = [mp.mpf(float(w)) for w in weights]
            dout = J.rows // n
            for i in range(n):
                for k in range(n):
                    r = mp.sqrt(a[i] / a[k])
                    for p in range(dout):
                        for t in range(d):
                            J[i * dout + p, k * d + t] *= r
        return J


def singular_values(J: mp.matrix) -> list:
    """All singular values, descending (eigenvalues of the smaller Gram matrix), mpmath."""
    with mp.workdps(DPS):
        G = J.T * J if J.cols <= J.rows else J * J.T
        ev = mp.eigsy(G, eigvals_only=True)
        vals = sorted((mp.sqrt(max(e, 0)) for e in ev), reverse=True)
        return vals


def spectral_norm(J: mp.matrix):
    """Top singular value (mpmath)."""
    return singular_values(J)[0]


def central_difference_jacobian(X, heads, *, weights=None, masked=False, h="1e-20"):
    """Jacobian of :func:`forward` by 50-digit central differences (for checking the formula)."""
    with mp.workdps(DPS):
        X0 = np.asarray(X, dtype=np.float64)
        n, d = X0.shape
        step = mp.mpf(h)
        cols = []
        base = _mat(X0)
        for k in range(n):
            for t in range(d):
                Xp, Xm_ = base.copy(), base.copy()
                Xp[k, t] += step
                Xm_[k, t] -= step
                fp = _forward_mp(Xp, heads, weights, masked)
                fm = _forward_mp(Xm_, heads, weights, masked)
                cols.append(
                    [
                        (fp[i, a] - fm[i, a]) / (2 * step)
                        for i in range(fp.rows)
                        for a in range(fp.cols)
                    ]
                )
        J = mp.matrix(len(cols[0]), len(cols))
        for c_, col in enumerate(cols):
            for r, v in enumerate(col):
                J[r, c_] = v
        return J


def _forward_mp(Xm, heads, weights, masked):
    xs = _rows(Xm)
    logw = _logw(weights, Xm.rows)
    out = None
    for A, V, W, c in _heads(heads):
        P = _attention(xs, A, c, logw, masked)
        Y = (P * Xm) * (W * V).T
        out = Y if out is None else out + Y
    return out
