"""A bound derived symbolically: Kim's softmax-variance lemma, max_t g(t) = W_0((N-1)/e).

``theory.symbolic`` starts from the defining expression, lets sympy differentiate and solve, and
checks the result against the closed form of docs/theory.md (it raises if they differ). The
derivation comes with its steps, its LaTeX and a numpy function; the script evaluates it, checks
it against a brute-force maximum of g over a fine grid and against the closed form of
``theory.bounds``.

Run: ``python examples/symbolic_bound.py``
"""

import numpy as np

from theory.bounds import kim_softmax_lemma as closed_form
from theory.symbolic import kim_softmax_lemma

d = kim_softmax_lemma()  # sympy runs once per process (cached)
print(f"{d.name}: max_t g(t) = {d.expr}")
print(f"LaTeX: {d.latex}")
for i, step in enumerate(d.steps, 1):
    print(f"  step {i}: {step}")

# g(t) = (N - 1) t / (e^t + N - 1) is the expression the derivation started from.
t = np.linspace(0.0, 40.0, 400_001)
for N in (2, 10, 1000, 10**6):
    derived = float(d.func(N))  # the lambdified sympy result (scipy's lambertw)
    brute = float(np.max((N - 1) * t / (np.exp(t) + N - 1)))
    stated = float(closed_form(N))  # theory.bounds, written independently with theory.lambert
    print(
        f"N = {N:>7d}: derived {derived:.12f}  grid max {brute:.12f}  theory.bounds {stated:.12f}"
    )
