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
    for head in heads:  # (A, V, W, c, rope); A may be a pair (Q, K) of factors
        A, V, W, c, rope = (*head, None, None, None)[:5]
        QK = None
        if isinstance(A, tuple):  # factors (Q, K): A = Q^T K formed exactly
            QK = (_mat(A[0]), _mat(A[1]))
            A_ = QK[0].T * QK[1]
        else:
            A_ = _mat(A)
        V_ = _mat(V)
        W_ = mp.eye(V_.rows) if W is None else _mat(W)
        c_ = None if c is None else [mp.mpf(float(v)) for v in np.ravel(c)]
        rot = None
        if rope is not None:  # (inv_freq, scaling, token positions or None)
            if QK is None:
                raise ValueError("a rotary head needs its factors (Q, K)")
            freqs, scaling, pos = rope
            rot = ([mp.mpf(float(f)) for f in freqs], mp.mpf(float(scaling)), pos, QK)
        out.append((A_, V_, W_, c_, rot))
    return out


def _rotate(z: mp.matrix, p, rot, sign=1) -> mp.matrix:
    """Rotary embedding of a head row: pairs (t, t + k/2) turned by p*freq_t, times the scaling
    (``sign=-1``: the transpose, the opposite angles)."""
    freqs, scaling, _, _ = rot
    half = len(freqs)
    out = mp.matrix(2 * half, 1)
    for t in range(half):
        ang = sign * mp.mpf(p) * freqs[t]
        co, si = mp.cos(ang), mp.sin(ang)
        out[t] = scaling * (z[t] * co - z[t + half] * si)
        out[t + half] = scaling * (z[t + half] * co + z[t] * si)
    return out


def _positions(rot, n):
    return list(range(n)) if rot[2] is None else [int(v) for v in rot[2]]


def _rows(X: mp.matrix) -> list[mp.matrix]:
    return [X[i, :].T for i in range(X.rows)]


def _attention(xs, A, c, logw, masked, rot=None):
    n = len(xs)
    P = mp.matrix(n, n)
    if rot is not None:
        pos = _positions(rot, n)
        Q, K = rot[3]
        qs = [_rotate(Q * xs[i], pos[i], rot) for i in range(n)]
        ks = [_rotate(K * xs[j], pos[j], rot) for j in range(n)]
    for i in range(n):
        keys = [j for j in range(n) if (j <= i or not masked) and logw[j] is not None]
        s = {}
        for j in keys:
            if rot is None:
                v = (xs[i].T * A * xs[j])[0] + logw[j]
            else:
                v = (qs[i].T * ks[j])[0] + logw[j]
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
        for A, V, W, c, rot in _heads(heads):
            P = _attention(xs, A, c, logw, masked, rot)
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
        for A, V, W, c, rot in _heads(heads):
            O = W * V
            dout = O.rows
            if J is None:
                J = mp.matrix(n * dout, n * d)
            P = _attention(xs, A, c, logw, masked, rot)
            ms = [sum((P[i, j] * xs[j] for j in range(n)), mp.matrix(d, 1)) for i in range(n)]
            # key_grad[i][k] = d s_ik / d x_k, query_grad[i][j] = d s_ij / d x_i
            if rot is not None:  # K^T R_k^T q~_i and Q^T R_i^T k~_j
                pos = _positions(rot, n)
                Qm, Km = rot[3]
                qs = [_rotate(Qm * xs[i], pos[i], rot) for i in range(n)]
                ks = [_rotate(Km * xs[j], pos[j], rot) for j in range(n)]
                key_grad = [
                    [Km.T * _rotate(qs[i], pos[k], rot, -1) for k in range(n)] for i in range(n)
                ]
                query_grad = [
                    [Qm.T * _rotate(ks[j], pos[i], rot, -1) for j in range(n)] for i in range(n)
                ]
            else:  # A^T x_i + c and A x_j
                bs = [A.T * xs[i] if c is None else A.T * xs[i] + mp.matrix(c) for i in range(n)]
                key_grad = [[bs[i]] * n for i in range(n)]
                query_grad = [[A * xs[j] for j in range(n)]] * n
            for i in range(n):
                self_block = mp.matrix(d, d)
                for j in range(n):
                    if P[i, j] != 0:
                        self_block += P[i, j] * (xs[j] - ms[i]) * query_grad[i][j].T
                for k in range(n):
                    blk = P[i, k] * (mp.eye(d) + (xs[k] - ms[i]) * key_grad[i][k].T)
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
    for A, V, W, c, rot in _heads(heads):
        P = _attention(xs, A, c, logw, masked, rot)
        Y = (P * Xm) * (W * V).T
        out = Y if out is None else out + Y
    return out
