"""A weighted measure and its image under attention, with the exact W_2 distance between them.

Attention acts on a weighted atomic measure mu = sum_j a_j delta_{x_j} (mean-field attention F);
on the empirical measure of a sequence it reproduces ordinary self-attention. The script checks
that identity, measures W_2(mu, F(mu)) and the local Lipschitz constant of F at mu, and, given a
directory, draws the two measures into ``measure_attention.png`` there.

Run: ``python examples/measure_attention.py [OUT_DIR]``
"""

import sys
from pathlib import Path

import torch

from meanfield import (
    AttentionParams,
    DiracMeasure,
    attention,
    local_lipschitz,
    self_attention,
    wasserstein,
)

g = torch.Generator().manual_seed(0)
f64 = dict(dtype=torch.float64)
head = AttentionParams(A=torch.randn(2, 2, generator=g, **f64), V=torch.eye(2, **f64))

# Six atoms in the plane; one heavy atom and a few very light ones (masses over 4 decades).
X = torch.randn(6, 2, generator=g, **f64)
a = torch.tensor([0.6, 0.3, 0.09, 9e-3, 9e-4, 1e-4], **f64)
mu = DiracMeasure(X, weights=a / a.sum())
nu = attention(mu, head)  # F(mu): every atom moves, masses stay
print(f"W2(mu, F(mu)) = {float(wasserstein(mu, nu)):.6f}")

# On the uniform measure m(X) of a sequence, F(m(X)) = m(f(X)): the atoms of F(m(X)) are the
# outputs of self-attention on X. Masked (causal) attention needs position-tagged measures.
for masked in (False, True):
    m_X = DiracMeasure.from_sequence(X, causal=masked)
    gap = attention(m_X, head, masked=masked).points - self_attention(X, head, masked=masked)
    print(f"masked = {masked}: max |F(m(X)) - f(X)| = {float(gap.abs().max()):.2e}")

# The local Lipschitz constant of F at mu in the Wasserstein geometry, with its certified bracket.
est = local_lipschitz(mu, head, geometry="wasserstein")
print(f"Lip(F at mu, W2) = {float(est.value):.10g}")
print(f"certified bracket [{float(est.lower):.10g}, {float(est.upper):.10g}]")

if len(sys.argv) > 1:  # optional picture (matplotlib is imported only here)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 4))
    size = 30 + 300 * mu.weights.sqrt()
    ax.scatter(*mu.points.T, s=size, label="mu", alpha=0.6)
    ax.scatter(*nu.points.T, s=size, label="F(mu)", alpha=0.6, marker="s")
    for x, y in zip(mu.points, nu.points):
        ax.annotate("", xy=y.tolist(), xytext=x.tolist(), arrowprops=dict(arrowstyle="->", lw=0.6))
    ax.set_aspect("equal")
    ax.legend()
    fig.tight_layout()
    path = Path(sys.argv[1]) / "measure_attention.png"
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")
