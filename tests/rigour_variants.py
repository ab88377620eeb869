"""Adversarial instances of the attention variants with 50-digit references (issue 25 §2).

A deterministic generator of small instances (2-6 tokens, width 1-4, one or two heads of width
2-4, float64 and float32, masked and unmasked, some with masses) for every variant of
:class:`meanfield.AttentionParams`: QK-norm, soft-capping, sliding windows, ALiBi, head-space
biases with rotary embeddings, partial rotary, and two model-shaped combinations (``gemma2``:
soft-cap, window, grouped heads, rotary, logit scale; ``qwen3``: QK-norm, rotary, logit scale).
Each instance is plain numpy data; :func:`variant_torch_inputs` builds the ``meanfield``
inputs, :func:`exact_variant_values` the singular values of the exact Jacobian from
tests/mpmath_oracle.py (50 digits), and :func:`check_variant_instance` runs
:func:`meanfield.local_lipschitz` against them, as ``check_instance`` of tests/meanfield/test_rigour.py
does for plain heads. A float32 instance is the float32-rounded one: every array and scalar is
rounded to float32 before the exact value is formed.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath as mp
import numpy as np
import torch

from meanfield.lipschitz import local_lipschitz
from meanfield.measures import DiracMeasure
from meanfield.params import AttentionParams, MultiHeadParams, RMSNorm, RotaryEmbedding
from tests import mpmath_oracle as oracle
from tests.adversarial_instances import near_ties, spread_masses

METHODS = ("dense", "lanczos", "power")
VARIANT_KINDS = (
    "qk_norm",
    "softcap",
    "window",
    "alibi",
    "biases_rope",
    "partial_rope",
    "gemma2",
    "qwen3",
)
SCALAR_KEYS = ("logit_scale", "softcap", "alibi_slope")
VARIANT_KEYS = oracle.VARIANT_KEYS


# ------------------------------------------------------------------------------ instances
def _positions(rng: np.random.Generator, n: int, top: int = 5000) -> np.ndarray:
    """``n`` increasing token indices below ``top`` (gaps of any size)."""
    return np.sort(rng.choice(top, size=n, replace=False)).astype(np.int64)


def _freqs(rng: np.random.Generator, half: int) -> list:
    return (1.0 / 10.0 ** rng.uniform(0, 4, size=half)).tolist()


def _rope(rng: np.random.Generator, k: int, rotary: int | None = None) -> tuple:
    """``(inv_freq, scaling, head_dim)`` rotating ``rotary`` (default all ``k``) coordinates."""
    r = k if rotary is None else rotary
    return (_freqs(rng, r // 2), float(rng.uniform(0.5, 1.5)), k)


def _norm(rng: np.random.Generator, k: int, eps: float) -> tuple:
    """An RMS norm ``(weight, eps)``; weights around 1, sometimes one near 0 or negative."""
    w = 1.0 + 0.3 * rng.standard_normal(k)
    if rng.integers(4) == 0:
        w[rng.integers(k)] *= 10 ** -rng.uniform(0, 6) * (-1) ** rng.integers(2)
    return (w, eps)


def _factors(rng: np.random.Generator, k: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((k, d)), rng.standard_normal((k, d)) / math.sqrt(d)


def _qk_norm_heads(rng, n, d, X):
    k = int(rng.integers(2, 5))
    eps = float(rng.choice([1e-12, 1e-6, 1e-2]))
    Q, K = _factors(rng, k, d)
    scale = float(rng.choice([1 / math.sqrt(k), rng.uniform(0.1, 10.0)]))
    head = dict(Q=Q, K=K, q_norm=_norm(rng, k, eps), k_norm=_norm(rng, k, eps), logit_scale=scale)
    mode = int(rng.integers(3))
    if mode == 1:  # a pre-norm query row and a key row near 0 (|u|^2/k ~ eps or below)
        i, j = rng.integers(n), rng.integers(n)
        tiny = math.sqrt(eps) * 10 ** rng.uniform(-2, 2)
        head["q_bias"] = -(Q @ X[i]) + tiny * rng.standard_normal(k)
        head["k_bias"] = -(K @ X[j]) + tiny * rng.standard_normal(k)
    elif rng.integers(2):
        head["q_bias"] = rng.standard_normal(k)
        head["k_bias"] = rng.standard_normal(k)
    if mode == 2:  # large radius: the normed logits stay bounded, the gradients ~ 1/|x|
        X *= 10 ** rng.uniform(2, 4)
    if rng.integers(3) == 0 and k % 2 == 0:
        head["rope"] = _rope(rng, k)
    return [head], X


def _softcap_heads(rng, n, d, X):
    mode = int(rng.integers(3))
    k = int(rng.integers(2, 5))
    Q, K = _factors(rng, k, d)
    if mode == 0:  # moderate logits, caps around them
        head = dict(Q=Q, K=K, softcap=float(rng.choice([0.5, 5.0, 30.0, 50.0])))
    elif mode == 1:  # saturation: logits 1e3-1e5 against a small cap
        X *= 10 ** rng.uniform(1.5, 2.5)
        head = dict(Q=Q, K=K, softcap=float(10 ** rng.uniform(-1, 0.7)))
    else:  # near-zero pre-cap logits at large |x|: the tokens along a direction Q and K kill
        e = rng.standard_normal(d)
        e /= np.linalg.norm(e)
        if d >= 2:
            Q = Q - np.outer(Q @ e, e)
            K = K - np.outer(K @ e, e)
            X = 10 ** rng.uniform(2, 4) * np.outer(np.ones(n), e) + X * 1e-3
        else:  # d = 1: tiny factors against large tokens
            X = X * 10 ** rng.uniform(2, 4)
            Q = Q * 10 ** -rng.uniform(4, 8)
        head = dict(Q=Q, K=K, softcap=float(10 ** rng.uniform(-1, 1.7)))
    if rng.integers(3) == 0:
        head["logit_scale"] = float(rng.uniform(0.05, 2.0))
    if rng.integers(3) == 0:
        head["q_bias"] = rng.standard_normal(k)
        head["k_bias"] = rng.standard_normal(k)
    return [head], X


def make_variant_instance(seed: int, kind: str | None = None) -> dict:
    """A deterministic adversarial instance of one variant kind (plain numpy data).

    The dict holds ``X`` (n, d), ``heads`` (one dict per head: ``Q, K`` or ``A``, ``V``,
    ``rope = (inv_freq, scaling, head_dim)`` or absent, and the variant fields of
    ``meanfield.AttentionParams``, RMS norms as ``(weight, eps)``), ``W_O`` (``None``: one head
    without projection), ``token_index`` (or ``None``: ``0, ..., n-1``), ``weights``, ``masked``,
    ``geometry`` and ``dtype``.
    """
    rng = np.random.default_rng(seed)
    kind = VARIANT_KINDS[seed % len(VARIANT_KINDS)] if kind is None else kind
    if kind not in VARIANT_KINDS:
        raise ValueError(f"unknown variant kind {kind!r}")
    masked = bool(rng.integers(2))
    n = int(rng.integers(2, 7))
    d = int(rng.integers(1, 5))
    X = rng.standard_normal((n, d)) * 10 ** rng.uniform(0, 1)
    token_index = None
    W_O = None
    if kind == "qk_norm":
        heads, X = _qk_norm_heads(rng, n, d, X)
    elif kind == "softcap":
        heads, X = _softcap_heads(rng, n, d, X)
    elif kind == "window":  # W from 1 to n (causal with masked, else symmetric)
        if rng.integers(2):
            head: dict[str, Any] = dict(A=rng.standard_normal((d, d)) / math.sqrt(d))
            if rng.integers(2):
                head["c"] = rng.standard_normal(d)
        else:
            head = dict(zip("QK", _factors(rng, int(rng.integers(2, 5)), d)))
        if rng.integers(3) == 0:  # near ties far out, where x_j - m_i cancels
            X = near_ties(rng, n, d, far=(0.5, 2.0), close=(2, 8))
        if rng.integers(3) == 0:  # gapped token indices, the window in their units
            token_index = np.cumsum(rng.integers(1, 4, size=n)).astype(np.int64)
            head["window"] = int(rng.integers(1, token_index[-1] - token_index[0] + 2))
        else:
            head["window"] = int(rng.integers(1, n + 1))
        heads = [head]
    elif kind == "alibi":  # slopes up to 10, positions up to 5000
        if rng.integers(2):
            head = dict(A=rng.standard_normal((d, d)) / math.sqrt(d))
        else:
            head = dict(zip("QK", _factors(rng, int(rng.integers(2, 5)), d)))
        head["alibi_slope"] = float(10 ** rng.uniform(-2, 1) * (1 if rng.integers(4) else -1))
        if rng.integers(3):
            token_index = _positions(rng, n)
        if rng.integers(3) == 0:
            head["window"] = int(rng.integers(1, n + 1)) if token_index is None else 2500
        heads = [head]
    elif kind == "biases_rope":  # head-space biases with rotary at large positions
        k = int(rng.choice([2, 4]))
        Q, K = _factors(rng, k, d)
        X = X * 10 ** rng.uniform(0, 1.5)
        heads = [dict(Q=Q, K=K, q_bias=rng.standard_normal(k) * 10 ** rng.uniform(-1, 2),
                      k_bias=rng.standard_normal(k) * 10 ** rng.uniform(-1, 2),
                      rope=_rope(rng, k))]  # fmt: skip
        token_index = _positions(rng, n)
    elif kind == "partial_rope":  # rotary on the first 2 of 3 or 4 coordinates
        k = int(rng.choice([3, 4]))
        Q, K = _factors(rng, k, d)
        heads = [dict(Q=Q, K=K, rope=_rope(rng, k, rotary=2))]
        if rng.integers(2):
            heads[0]["q_bias"] = rng.standard_normal(k)
            heads[0]["k_bias"] = rng.standard_normal(k)
        token_index = None if rng.integers(3) == 0 else _positions(rng, n)
    elif kind == "gemma2":  # soft-cap, window, two query heads on one key/value head, rotary
        k = int(rng.choice([2, 4]))
        K = rng.standard_normal((k, d)) / math.sqrt(d)
        V = rng.standard_normal((d, d))
        rope = _rope(rng, k)
        cap = float(rng.choice([50.0, 30.0, 10 ** rng.uniform(-1, 1)]))
        window = int(rng.integers(1, n + 1))
        scale = float(rng.choice([1 / math.sqrt(k), rng.uniform(0.05, 1.0)]))
        if rng.integers(2):  # large radius: saturated caps
            X = X * 10 ** rng.uniform(1, 2)
        heads = [
            dict(Q=rng.standard_normal((k, d)), K=K, V=V, rope=rope, softcap=cap,
                 window=window if h == 0 else None, logit_scale=scale)
            for h in range(2)
        ]  # fmt: skip
        W_O = rng.standard_normal((d, 2 * d)) * 10 ** rng.uniform(-1, 1)
        masked = bool(rng.integers(4))
        token_index = None if rng.integers(2) else _positions(rng, n)
    else:  # qwen3: QK-norm, rotary, logit scale, one or two heads (grouped)
        k = int(rng.choice([2, 4]))
        H = int(rng.integers(1, 3))
        K = rng.standard_normal((k, d)) / math.sqrt(d)
        V = rng.standard_normal((d, d))
        rope = _rope(rng, k)
        eps = float(rng.choice([1e-6, 1e-12]))
        kn = _norm(rng, k, eps)
        qn = _norm(rng, k, eps)
        if rng.integers(2):
            X = X * 10 ** rng.uniform(1, 3)
        heads = [
            dict(Q=rng.standard_normal((k, d)), K=K, V=V, rope=rope, q_norm=qn, k_norm=kn,
                 logit_scale=1 / math.sqrt(k))
            for _ in range(H)
        ]  # fmt: skip
        W_O = rng.standard_normal((d, H * d)) * 10 ** rng.uniform(-1, 1) if H > 1 else None
        token_index = None if rng.integers(2) else _positions(rng, n)
    for head in heads:
        if "V" not in head:
            head["V"] = rng.standard_normal((int(rng.integers(1, d + 1)), d))
    if W_O is None and len(heads) > 1:  # pragma: no cover - every multi-head kind sets W_O
        raise AssertionError("a multi-head instance needs W_O")
    dtype = "float32" if rng.integers(4) == 0 else "float64"
    weights = None
    geometry = "euclidean"
    if not masked and rng.integers(3) == 0:  # masses over up to 100 decades (float32: 30)
        weights = spread_masses(rng, n, 30 if dtype == "float32" else 100)
        geometry = "wasserstein" if rng.integers(4) else "euclidean"
    if dtype == "float32":
        X, W_O, heads = _round_float32(X, W_O, heads)
    return dict(
        seed=seed, kind=kind, X=X, heads=heads, W_O=W_O, token_index=token_index,
        weights=weights, masked=masked, geometry=geometry, dtype=dtype,
    )  # fmt: skip


def _f32(a):
    return np.asarray(a, np.float32).astype(np.float64)


def _round_float32(X, W_O, heads):
    """Every array and scalar rounded to float32 (the exact instance of a float32 run)."""
    out = []
    for head in heads:
        h = {}
        for key, val in head.items():
            if val is None or key == "window":
                h[key] = val
            elif key in ("q_norm", "k_norm"):
                h[key] = (_f32(val[0]), float(np.float32(val[1])))
            elif key == "rope":
                h[key] = (_f32(val[0]).tolist(), float(np.float32(val[1])), val[2])
            elif key in SCALAR_KEYS:
                h[key] = float(np.float32(val))
            else:
                h[key] = _f32(val)
        out.append(h)
    return _f32(X), None if W_O is None else _f32(W_O), out


# ----------------------------------------------------------------------- meanfield inputs
def variant_params(inst: dict, dtype: torch.dtype | None = None):
    """The instance's ``AttentionParams`` (one head, no ``W_O``) or ``MultiHeadParams``."""
    dt = dtype or (torch.float32 if inst["dtype"] == "float32" else torch.float64)

    def t(a):
        return None if a is None else torch.tensor(np.asarray(a, dtype=np.float64), dtype=dt)

    heads = []
    for h in inst["heads"]:
        kw: dict = {}
        for key in ("q_bias", "k_bias", "c"):
            if h.get(key) is not None:
                kw[key] = t(h[key])
        for key in ("q_norm", "k_norm"):
            if h.get(key) is not None:
                kw[key] = RMSNorm(t(h[key][0]), h[key][1])
        for key in (*SCALAR_KEYS, "window"):
            if h.get(key) is not None:
                kw[key] = h[key]
        if h.get("rope") is not None:
            freqs, scaling, head_dim = h["rope"]
            kw["rope"] = RotaryEmbedding(t(freqs), scaling, head_dim=head_dim)
        if "A" in h:
            heads.append(AttentionParams(t(h["A"]), t(h["V"]), **kw))
        else:
            heads.append(AttentionParams(None, t(h["V"]), Q=t(h["Q"]), K=t(h["K"]), **kw))
    if inst["W_O"] is None and len(heads) == 1:
        return heads[0]
    return MultiHeadParams(tuple(heads), W_O=t(inst["W_O"]))


def variant_torch_inputs(inst: dict):
    """``(x, params, weights, token_index)`` for ``meanfield``.

    ``x`` is the token tensor, or a :class:`~meanfield.measures.DiracMeasure` when the instance
    has masses; ``weights`` are then the exact masses of the instance, ``exp`` of the stored
    log-masses (in float32 they differ from the given ones by a rounding), else ``None``.
    """
    dt = torch.float32 if inst["dtype"] == "float32" else torch.float64
    params = variant_params(inst, dt)
    X = torch.tensor(inst["X"], dtype=dt)
    ti = inst["token_index"]
    token_index = None if ti is None else torch.as_tensor(np.asarray(ti, dtype=np.int64))
    if inst["weights"] is None:
        return X, params, None, token_index
    mu = DiracMeasure(X, torch.tensor(inst["weights"], dtype=dt), normalize=True)
    return mu, params, torch.exp(mu.log_weights.to(torch.float64)).numpy(), token_index


# ------------------------------------------------------------------- 50-digit references
def oracle_heads(inst: dict) -> list[tuple]:
    """The heads of ``inst`` in the tuple form of tests/mpmath_oracle.py."""
    W = inst["W_O"]
    d_v = inst["heads"][0]["V"].shape[0]
    out = []
    for idx, h in enumerate(inst["heads"]):
        A = h["A"] if "A" in h else (h["Q"], h["K"])
        Wh = None if W is None else W[:, idx * d_v : (idx + 1) * d_v]
        rope = None
        if h.get("rope") is not None:
            rope = (h["rope"][0], h["rope"][1], None)  # positions: the token_index argument
        var = {key: h[key] for key in VARIANT_KEYS if h.get(key) is not None}
        out.append((A, h["V"], Wh, h.get("c"), rope, var))
    return out


def exact_variant_forward(inst: dict, weights=None) -> mp.matrix:
    """The instance's outputs (n, d_out) at 50 digits."""
    return oracle.forward(
        inst["X"], oracle_heads(inst), weights=weights, masked=inst["masked"],
        token_index=inst["token_index"],
    )  # fmt: skip


def exact_variant_jacobian(inst: dict, weights) -> mp.matrix:
    """The instance's Jacobian in its geometry (Wasserstein-scaled with masses) at 50 digits."""
    return oracle.jacobian(
        inst["X"], oracle_heads(inst), weights=weights, masked=inst["masked"],
        geometry=inst["geometry"], token_index=inst["token_index"],
    )  # fmt: skip


def exact_variant_values(inst: dict, weights) -> list:
    """All singular values (descending) of :func:`exact_variant_jacobian`, 50 digits."""
    return oracle.singular_values(exact_variant_jacobian(inst, weights))


# ------------------------------------------------------------------------------ the check
def check_variant_instance(
    inst: dict, *, methods=METHODS, path: Any = "auto", upper: Any = "auto", certify: bool = True
) -> None:
    """Every method of ``methods`` on ``inst``, as ``check_instance`` of tests/meanfield/test_rigour.py.

    With ``certify=True``: ``lower <= exact <= upper``, ``lower <= upper_prob``,
    ``exact <= upper_prob``, no NaN, the width rule met when converged on it, and honest
    convergence. With ``certify=False`` (the trivial bracket): each method runs on the residual
    rule and, converged, its value is within the residual tolerance (plus the rounding model
    below) of a singular value of the exact Jacobian; the ``"lanczos"`` run, on
    ``tol = 1e-10`` in float64, must reach the
    largest one; the ``"dense"`` value is within ``64 u (1 + M)`` of it (``u`` the unit
    roundoff, ``M`` of :func:`logit_error_scale`).
    """
    x, params, weights, token_index = variant_torch_inputs(inst)
    svals = exact_variant_values(inst, weights)
    exact = svals[0]
    f32 = inst["dtype"] == "float32"
    tol = 1e-3 if f32 else (1e-6 if certify else 1e-10)
    runs: list[tuple[Any, float | None]] = [(m, tol) for m in methods]
    if certify and "lanczos" in methods:  # lanczos also as the default call, on the width rule
        runs.append(("lanczos", None))
    for method, run_tol in runs:
        est = local_lipschitz(
            x, params, geometry=inst["geometry"], masked=inst["masked"], method=method,
            tol=run_tol, token_index=token_index, path=path, upper=upper if certify else "auto",
            certify=certify,
        )  # fmt: skip
        tag = f"{inst['kind']} seed={inst['seed']} {method}"
        if run_tol is None:
            tag += " (width rule)"
        val = float(est.value)
        lo, up = float(est.lower), float(est.upper)
        tag += f" {est.path}: lower={lo!r} value={val!r} exact={mp.nstr(exact, 20)} upper={up!r}"
        assert not math.isnan(lo) and not math.isnan(up) and not math.isnan(val), tag
        assert lo <= up, tag
        assert mp.mpf(lo) <= exact, tag
        assert exact <= mp.mpf(up), tag
        if certify and est.upper_prob is not None:
            # probabilistic end: fails with probability <= delta = 1e-6 over the start vector;
            # the seeds are fixed, so a failure here is a bug
            pu = float(est.upper_prob)
            assert not math.isnan(pu) and lo <= pu, tag + f" upper_prob={pu!r}"
            assert exact <= mp.mpf(pu), tag + f" upper_prob={pu!r}"
            if est.stop_rule == "width" and bool(est.converged) and bool(est.width_reachable):
                assert est.width is not None and pu <= est.width * lo, tag + f" upper_prob={pu!r}"
        if method == "dense":
            if not certify:  # the float SVD of the assembled Jacobian: rounding only
                u = 2.0**-24 if f32 else 2.0**-53
                rtol = 64 * u * (1 + logit_error_scale(inst))
                assert abs(mp.mpf(val) - exact) <= rtol * exact, tag + f" rtol={rtol:.1e}"
            continue
        if not bool(est.converged) or est.stop_rule != "residual":
            continue
        # honest convergence: sigma^2 within tol sigma^2 of some exact sigma_k^2 (residual
        # bound for J^T J) plus the rounding of the products (float32: 1e-4; float64: a
        # conditioning-free 1e-9 as in tests/meanfield/test_rigour.py), plus the certified relative
        # width where there is one (docs/rounding.md §7)
        v = mp.mpf(val)
        slack = tol + (1e-4 if f32 else 1e-9)
        if certify:
            slack += 2 * max(0.0, (val - lo) / val)
        else:  # no bracket: the computed operator's distance to the exact one, by the rounding
            # model of the dense check (squared values: twice the relative distance)
            slack += 2 * 64 * (2.0**-24 if f32 else 2.0**-53) * (1 + logit_error_scale(inst))
        gap = min(abs(v**2 - s**2) for s in svals)
        assert gap <= slack * v**2, tag + f" converged to {v} (gap {mp.nstr(gap, 5)})"
        if not certify and method == "lanczos" and not f32:
            assert abs(v**2 - exact**2) <= slack * exact**2, tag + " not the largest value"


# ------------------------------------------------------------------- rounding scales
def logit_error_scale(inst: dict) -> float:
    r"""A first-order scale :math:`M` of the float rounding of the logits: each computed logit
    is within about :math:`u\,M` of the exact one (:math:`u` the unit roundoff).

    Per head and admissible pair, :math:`M_{ij}` is the logit formed with absolute values: the
    query and key rows :math:`|Q||x_i| + |b_q|` (through an RMS norm, :math:`|w|` times that
    over the norm's :math:`r_i`, the amplification of a cancelling pre-norm row), each rotated
    row times :math:`1 + \tau_i\max\omega` (the rounding of the angle), :math:`|s|` times their
    dot product, plus :math:`|c|^\top|x_j|` and :math:`|m||\tau_j - \tau_i|` (ALiBi); the
    cap's derivative is at most 1. Returns :math:`\max M_{ij}` (a scale for tolerances, not a
    bound).
    """
    X = np.abs(np.asarray(inst["X"], dtype=np.float64))
    n = X.shape[0]
    tau = np.arange(n) if inst["token_index"] is None else np.asarray(inst["token_index"])
    worst = 0.0
    for h in inst["heads"]:
        if "A" in h:
            M = X @ np.abs(h["A"]) @ X.T
        else:
            rows = []
            for key, bias, norm in (("Q", "q_bias", "q_norm"), ("K", "k_bias", "k_norm")):
                mag = X @ np.abs(h[key]).T
                if h.get(bias) is not None:
                    mag = mag + np.abs(h[bias])
                if h.get(norm) is not None:
                    w, eps = h[norm]
                    u = np.asarray(inst["X"]) @ np.asarray(h[key]).T
                    if h.get(bias) is not None:
                        u = u + h[bias]
                    k = u.shape[1]
                    r = np.sqrt((u**2).sum(1) / k + eps)
                    mag = np.abs(w) * mag / r[:, None]
                if h.get("rope") is not None:
                    mag = mag * (1 + tau[:, None] * max(h["rope"][0]))
                rows.append(mag)
            M = abs(h.get("logit_scale") or 1.0) * rows[0] @ rows[1].T
        if h.get("c") is not None:
            M = M + (X @ np.abs(h["c"]))[None, :]
        if h.get("alibi_slope") is not None:
            M = M + abs(h["alibi_slope"]) * np.abs(tau[None, :] - tau[:, None])
        allowed = np.ones((n, n), dtype=bool)
        if inst["masked"]:
            allowed &= np.tri(n, dtype=bool)
        if h.get("window") is not None:
            allowed &= np.abs(tau[:, None] - tau[None, :]) < h["window"]
        worst = max(worst, float(M[allowed].max()))
    return worst


def output_scale(inst: dict) -> float:
    r""":math:`\max_j\|x_j\|_\infty` times the largest absolute row sum of the heads' output
    matrices :math:`W_hV_h` summed over heads: the size of the outputs' terms."""
    d_v = inst["heads"][0]["V"].shape[0]
    W = inst["W_O"]
    total = 0.0
    for idx, h in enumerate(inst["heads"]):
        O = h["V"] if W is None else W[:, idx * d_v : (idx + 1) * d_v] @ h["V"]
        total += float(np.abs(O).sum(1).max())
    return float(np.abs(inst["X"]).max()) * total
