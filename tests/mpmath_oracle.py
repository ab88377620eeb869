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
(tests/meanfield/test_rigour.py, tests/meanfield/test_rigour_variants_oracle.py).

**Heads.** A head is a tuple ``(A, V, W, c, rope, variants)``; trailing entries may be left out
(``W``: identity, ``c``, ``rope``, ``variants``: none). ``A`` is a matrix or a pair ``(Q, K)``
of factors; ``rope = (inv_freq, scaling, positions or None)`` needs the factors and rotates the
first ``2 len(inv_freq)`` coordinates of a head row (partial rotary when the head is wider; the
rest passes unchanged and unscaled). ``variants`` is a dict with any of the keys

``q_bias``, ``k_bias`` (head-space biases, length ``k``), ``q_norm``, ``k_norm`` (pairs
``(weight, eps)`` of an RMS norm :math:`w\odot z/\sqrt{\|z\|^2/k + \varepsilon}`),
``logit_scale`` (:math:`s`), ``softcap`` (:math:`\kappa`), ``window`` (:math:`W`) and
``alibi_slope`` (:math:`m`),

in the order of operations of ``meanfield.AttentionParams`` (written out here independently):

.. math::
    q_i = R_{\tau_i}\,\mathrm{norm}_q(Qx_i + b_q),\quad
    k_j = R_{\tau_j}\,\mathrm{norm}_k(Kx_j + b_k),\quad t_{ij} = s\,q_i^\top k_j + c^\top x_j,\quad
    \ell_{ij} = \kappa\tanh(t_{ij}/\kappa) + m(\tau_j - \tau_i) + \log a_j,

(a head given by ``A`` has :math:`t_{ij} = x_i^\top Ax_j + c^\top x_j`), and key :math:`j` is
admissible for query :math:`i` when :math:`j \le i` (masked) and :math:`|\tau_i - \tau_j| < W`.
The token indices :math:`\tau` are the ``token_index`` argument, else the rotary positions,
else ``0, ..., n-1``. With variants the Jacobian block is the same expression with
:math:`b_i` and :math:`Ax_j` replaced by the gradients of :math:`\ell_{ik}` in the key
:math:`x_k` and of :math:`\ell_{ij}` in the query :math:`x_i` (chain rule through the norm,
rotation and cap, in closed form). Heads without variants follow the original code path.
"""

from __future__ import annotations

from collections.abc import Sequence

import mpmath as mp
import numpy as np

DPS = 50

VARIANT_KEYS = (
    "q_bias",
    "k_bias",
    "q_norm",
    "k_norm",
    "logit_scale",
    "softcap",
    "window",
    "alibi_slope",
)


def _mat(a) -> mp.matrix:
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    return mp.matrix([[mp.mpf(float(v)) for v in row] for row in a])


def _vec(a) -> mp.matrix:
    return mp.matrix([mp.mpf(float(v)) for v in np.ravel(np.asarray(a, dtype=np.float64))])


def _variants(var, QK, k) -> dict | None:
    """The variant dict of a head read into mpmath (``None`` when it has none)."""
    if not var:
        return None
    unknown = sorted(set(var) - set(VARIANT_KEYS))
    if unknown:
        raise ValueError(f"unknown attention variants {unknown}")
    out: dict = {}
    needs_factors = ("q_bias", "k_bias", "q_norm", "k_norm", "logit_scale")
    if QK is None and any(var.get(key) is not None for key in needs_factors):
        raise ValueError("head-space biases, QK-norm and logit_scale need the factors (Q, K)")
    for key in ("q_bias", "k_bias"):
        if var.get(key) is not None:
            out[key] = _vec(var[key])
            if out[key].rows != k:
                raise ValueError(f"{key} must have length {k}")
    for key in ("q_norm", "k_norm"):
        if var.get(key) is not None:
            w, eps = var[key]
            w_ = _vec(w)
            if w_.rows != k:
                raise ValueError(f"{key} weight must have length {k}")
            out[key] = (w_, mp.mpf(float(eps)))
    for key in ("logit_scale", "softcap", "alibi_slope"):
        if var.get(key) is not None:
            out[key] = mp.mpf(float(var[key]))
    if var.get("window") is not None:
        out["window"] = int(var["window"])
        if out["window"] < 1:
            raise ValueError("window must be at least 1")
    return out or None


def _heads(heads: Sequence[tuple]) -> list[tuple]:
    out = []
    for head in heads:  # (A, V, W, c, rope, variants); A may be a pair (Q, K) of factors
        A, V, W, c, rope, var = (*head, None, None, None, None)[:6]
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
            if 2 * len(freqs) > QK[0].rows:
                raise ValueError("the rotary width 2 len(inv_freq) exceeds the head width")
            rot = ([mp.mpf(float(f)) for f in freqs], mp.mpf(float(scaling)), pos, QK)
        var_ = _variants(var, QK, None if QK is None else QK[0].rows)
        out.append((A_, V_, W_, c_, rot, (QK, var_)))
    return out


def _rotate(z: mp.matrix, p, rot, sign=1) -> mp.matrix:
    """Rotary embedding of a head row: pairs (t, t + r/2) of the first r = 2 len(freqs)
    coordinates turned by p*freq_t, times the scaling; the others pass unchanged (partial
    rotary). ``sign=-1``: the transpose, the opposite angles."""
    freqs, scaling, _, _ = rot
    half = len(freqs)
    out = mp.matrix(z.rows, 1)
    for t in range(half):
        ang = sign * mp.mpf(p) * freqs[t]
        co, si = mp.cos(ang), mp.sin(ang)
        out[t] = scaling * (z[t] * co - z[t + half] * si)
        out[t + half] = scaling * (z[t + half] * co + z[t] * si)
    for t in range(2 * half, z.rows):
        out[t] = z[t]
    return out


def _positions(rot, n):
    return list(range(n)) if rot[2] is None else [int(v) for v in rot[2]]


def _token_index(heads, n, token_index) -> list[int]:
    """Token indices tau: ``token_index``, else the rotary positions, else 0, ..., n-1."""
    tau = None if token_index is None else [int(v) for v in np.ravel(token_index)]
    for _, _, _, _, rot, _ in heads:
        if rot is not None and rot[2] is not None:
            pos = [int(v) for v in rot[2]]
            if token_index is not None and pos != tau:
                raise ValueError("the rotary positions differ from token_index")
            tau = pos if tau is None else tau
    tau = list(range(n)) if tau is None else tau
    if len(tau) != n:
        raise ValueError(f"token_index must have {n} entries")
    return tau


def _placed(hs, n, token_index) -> tuple[list[tuple], list[int]]:
    """The heads with ``token_index`` as the positions of rotary heads that have none, and tau."""
    tau = _token_index(hs, n, token_index)
    if token_index is None:
        return hs, tau
    out = []
    for head in hs:
        rot = head[4]
        if rot is not None and rot[2] is None:
            head = (*head[:4], (rot[0], rot[1], tau, rot[3]), head[5])
        out.append(head)
    return out, tau


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


def _normed(z: mp.matrix, norm):
    """RMS norm of a head row and its Jacobian (identity without a norm)."""
    if norm is None:
        return z, None
    w, eps = norm
    k = z.rows
    r = mp.sqrt(mp.fsum(v * v for v in z) / k + eps)
    out = mp.matrix([w[a] * z[a] / r for a in range(k)])
    Jn = mp.matrix(k, k)  # diag(w) (I / r - z z^T / (k r^3))
    for a in range(k):
        for b in range(k):
            Jn[a, b] = w[a] * ((1 / r if a == b else 0) - z[a] * z[b] / (k * r**3))
    return out, Jn


def _variant_logits(xs, head, tau, grads):
    """Logits l_ij without log-masses (variant head) and, with ``grads``, the gradients
    ``gq[i][j] = d l_ij / d x_i`` and ``gk[i][j] = d l_ij / d x_j``."""
    A, _, _, c, rot, (QK, var) = head
    n, d = len(xs), xs[0].rows
    cv = None if c is None else mp.matrix(c)
    S = [[mp.mpf(0)] * n for _ in range(n)]
    gq = [[None] * n for _ in range(n)]
    gk = [[None] * n for _ in range(n)]
    if QK is not None:
        Qm, Km = QK
        scale = var.get("logit_scale", mp.mpf(1))
        rpos = tau if rot is None or rot[2] is None else _positions(rot, n)
        qs, ks, Jq, Jk = [], [], [], []
        for i in range(n):
            u, v = Qm * xs[i], Km * xs[i]
            if "q_bias" in var:
                u = u + var["q_bias"]
            if "k_bias" in var:
                v = v + var["k_bias"]
            u, Ju = _normed(u, var.get("q_norm"))
            v, Jv = _normed(v, var.get("k_norm"))
            if rot is not None:
                u, v = _rotate(u, rpos[i], rot), _rotate(v, rpos[i], rot)
            qs.append(u)
            ks.append(v)
            Jq.append(Ju)
            Jk.append(Jv)
        for i in range(n):
            for j in range(n):
                S[i][j] = scale * mp.fsum(qs[i][a] * ks[j][a] for a in range(qs[i].rows))
                if grads:  # s Q^T Jn_q^T R_i^T k_j and s K^T Jn_k^T R_j^T q_i
                    a_ = ks[j] if rot is None else _rotate(ks[j], rpos[i], rot, -1)
                    b_ = qs[i] if rot is None else _rotate(qs[i], rpos[j], rot, -1)
                    a_ = a_ if Jq[i] is None else Jq[i].T * a_
                    b_ = b_ if Jk[j] is None else Jk[j].T * b_
                    gq[i][j] = scale * (Qm.T * a_)
                    gk[i][j] = scale * (Km.T * b_)
    else:
        for i in range(n):
            for j in range(n):
                S[i][j] = (xs[i].T * A * xs[j])[0]
                if grads:
                    gq[i][j] = A * xs[j]
                    gk[i][j] = A.T * xs[i]
    for i in range(n):
        for j in range(n):
            if cv is not None:
                S[i][j] += mp.fsum(cv[t] * xs[j][t] for t in range(d))
                if grads:
                    gk[i][j] = gk[i][j] + cv
            if "softcap" in var:
                kap = var["softcap"]
                th = mp.tanh(S[i][j] / kap)
                S[i][j] = kap * th
                if grads:
                    g = 1 - th * th
                    gq[i][j], gk[i][j] = g * gq[i][j], g * gk[i][j]
            if "alibi_slope" in var:
                S[i][j] += var["alibi_slope"] * (tau[j] - tau[i])
    return S, gq, gk


def _variant_attention(xs, head, logw, masked, tau, grads=False):
    """Attention matrix of a variant head (and the logit gradients, with ``grads``)."""
    n = len(xs)
    var = head[5][1]
    S, gq, gk = _variant_logits(xs, head, tau, grads)
    P = mp.matrix(n, n)
    win = var.get("window")
    for i in range(n):
        keys = [
            j
            for j in range(n)
            if (j <= i or not masked)
            and logw[j] is not None
            and (win is None or abs(tau[i] - tau[j]) < win)
        ]
        s = {j: S[i][j] + logw[j] for j in keys}
        top = max(s.values())
        z = mp.fsum(mp.exp(v - top) for v in s.values())
        for j in keys:
            P[i, j] = mp.exp(s[j] - top) / z
    return P, gq, gk


def _head_attention(xs, head, logw, masked, tau):
    A, _, _, c, rot, (_, var) = head
    if var is None:
        return _attention(xs, A, c, logw, masked, rot)
    return _variant_attention(xs, head, logw, masked, tau)[0]


def _logw(weights, n):
    if weights is None:
        return [mp.mpf(0)] * n
    return [None if float(w) == 0.0 else mp.log(mp.mpf(float(w))) for w in weights]


def forward(X, heads, *, weights=None, masked=False, token_index=None) -> mp.matrix:
    """Outputs (n, d_out) of the map above, in mpmath."""
    with mp.workdps(DPS):
        return _forward_mp(_mat(X), heads, weights, masked, token_index)


def jacobian(
    X, heads, *, weights=None, masked=False, geometry="euclidean", token_index=None
) -> mp.matrix:
    """The (n d_out) x (n d) Jacobian (Wasserstein-scaled when asked), in mpmath."""
    with mp.workdps(DPS):
        Xm = _mat(X)
        xs = _rows(Xm)
        n, d = Xm.rows, Xm.cols
        logw = _logw(weights, n)
        J: mp.matrix = None
        hs, tau = _placed(_heads(heads), n, token_index)
        for head in hs:
            A, V, W, c, rot, (_, var) = head
            O = W * V
            dout = O.rows
            if J is None:
                J = mp.matrix(n * dout, n * d)
            if var is not None:  # gq[i][j] = d l_ij / d x_i, gk[i][j] = d l_ij / d x_j
                P, gq, gk = _variant_attention(xs, head, logw, masked, tau, grads=True)
                key_grad, query_grad = gk, gq
            else:
                P = _attention(xs, A, c, logw, masked, rot)
            ms = [sum((P[i, j] * xs[j] for j in range(n)), mp.matrix(d, 1)) for i in range(n)]
            # key_grad[i][k] = d s_ik / d x_k, query_grad[i][j] = d s_ij / d x_i
            if var is not None:
                pass  # from _variant_attention above
            elif rot is not None:  # K^T R_k^T q~_i and Q^T R_i^T k~_j
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
                    if P[i, k] != 0:
                        blk = P[i, k] * (mp.eye(d) + (xs[k] - ms[i]) * key_grad[i][k].T)
                    else:
                        blk = mp.matrix(d, d)
                    if k == i:
                        blk = blk + self_block
                    blk = O * blk
                    for a in range(dout):
                        for t in range(d):
                            J[i * dout + a, k * d + t] += blk[a, t]
        if geometry == "wasserstein" and weights is not None:
            a_ = [mp.mpf(float(w)) for w in weights]
            dout = J.rows // n
            for i in range(n):
                for k in range(n):
                    r = mp.sqrt(a_[i] / a_[k])
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


def central_difference_jacobian(
    X, heads, *, weights=None, masked=False, h="1e-20", token_index=None, dps=DPS
):
    """Jacobian of :func:`forward` by central differences at ``dps`` digits (default 50), for
    checking the formula (a larger ``dps`` with a smaller ``h`` for steep variants)."""
    with mp.workdps(dps):
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
                fp = _forward_mp(Xp, heads, weights, masked, token_index)
                fm = _forward_mp(Xm_, heads, weights, masked, token_index)
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


def _forward_mp(Xm, heads, weights, masked, token_index=None):
    xs = _rows(Xm)
    logw = _logw(weights, Xm.rows)
    out = None
    hs, tau = _placed(_heads(heads), Xm.rows, token_index)
    for head in hs:
        _, V, W, _, _, _ = head
        P = _head_attention(xs, head, logw, masked, tau)
        Y = (P * Xm) * (W * V).T
        out = Y if out is None else out + Y
    return out
