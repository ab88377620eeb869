"""A worst-case measure: where one attention head is least smooth among measures in the ball B_R.

Over measures in B_R, the local Lipschitz constant of mean-field attention (W_2 geometry) is
largest at very unbalanced measures. Two Diracs on an eigen-direction of A, a heavy atom and a
light one of exactly optimal mass eps*, give a closed-form lower bound g(eps*) (docs/theory.md
§5). A multi-start gradient ascent over measures of n atoms then searches for worse, starting
among others from that construction (and off-axis pairs, docs/theory.md §A3), and certifies the
best value found with a bracket. The proved upper bound of docs/theory.md §17 caps every result.

Run: ``python examples/worst_case_measure.py``
"""

import torch

from meanfield import AttentionParams, local_lipschitz
from meanfield.attacks import two_dirac, worst_case_measure
from theory.bounds import mean_field_upper

torch.set_num_threads(1)  # the search works on tiny dense problems: one thread is fastest
g = torch.Generator().manual_seed(0)
A = torch.randn(2, 2, generator=g, dtype=torch.float64)
head = AttentionParams(A=A, V=torch.eye(2, dtype=torch.float64))
R = 3.0

# The construction: heavy atom and light atom along a direction u of A, logit gap gamma.
td = two_dirac(A, R, V=head.V)
print(f"two Diracs: gap gamma = {td.gamma:.4f}, light mass eps* = {td.eps:.3e}")
print(f"closed-form lower bound g(eps*) = {td.g:.6f}")
at_td = local_lipschitz(td.measure, head, geometry="wasserstein")
print(f"local constant at the two Diracs: {float(at_td.value):.6f}")

# The search over measures of 2 atoms (a few restarts and steps are enough in d = 2). This A is
# indefinite, so an off-axis pair (docs/theory.md §A3) beats the on-axis construction by far.
wc = worst_case_measure(head, R, n=2, n_restarts=4, steps=150, seed=0)
print(f"worst case found: {wc.value:.6f}, certified bracket [{wc.lower:.6f}, {wc.upper:.6f}]")
for x, a in zip(wc.measure.points, wc.measure.weights):
    print(f"  atom at |x| = {float(x.norm()):.4f} with mass {float(a):.3e}")

upper = float(mean_field_upper(head.A_norm(), head.V_norm(), R))
print(f"proved upper bound over all measures in B_R: {upper:.6g}")
