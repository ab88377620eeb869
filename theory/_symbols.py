r"""Sympy symbols with assumptions, named as in the notation of docs/theory.md.

Python names follow the code notation (``A_norm`` for :math:`\|A\|_2`, ``lam`` for :math:`\lambda`,
``eps`` for :math:`\varepsilon`); :data:`LATEX_NAMES` maps each symbol to its notation in
docs/theory.md for LaTeX output. Assumptions are the ones the derivations need: counts are positive
integers, norms, radii, gaps and masses are positive.
"""

from __future__ import annotations

import sympy as sp

# Counts.
n = sp.Symbol("n", positive=True, integer=True)  # tokens
N = sp.Symbol("N", positive=True, integer=True)  # tokens, Kim et al. notation (docs/theory.md §8)
# copies (docs/theory.md §10) / head width (docs/conventions.md §1)
k = sp.Symbol("k", positive=True, integer=True)
m = sp.Symbol("m", positive=True)  # k - 1 or n - 1 as a continuous variable

# Norms and geometry.
A_norm = sp.Symbol("A_norm", positive=True)  # ||A||_2
V_norm = sp.Symbol("V_norm", positive=True)  # ||V||_2
Vu_norm = sp.Symbol("Vu_norm", positive=True)  # ||V u||_2
R = sp.Symbol("R", positive=True)  # radius of the ball B_R
theta = sp.Symbol("theta", positive=True)  # ||A||_2 R^2 (package notation)
lam = sp.Symbol("lambda", positive=True)  # lambda = u^T A u > 0 (case +)

# Constructions.
gamma = sp.Symbol("gamma", positive=True)  # logit gap
s = sp.Symbol("s", positive=True)  # gap in the two-Dirac / splitting API
eps = sp.Symbol("epsilon", positive=True)  # light mass
w = sp.Symbol("w", positive=True)  # attention of the heavy atom to the light one
v = sp.Symbol("v", positive=True)  # v = 1 - w
q = sp.Symbol("q", positive=True)  # mass of the zero-cost atom (docs/theory.md §8)
# a cost (docs/theory.md §8) or a ratio (n - 1)/e^gamma (docs/theory.md §3)
t = sp.Symbol("t", positive=True)

# Targets and bound parameters.
L = sp.Symbol("L", positive=True)  # target Lipschitz constant
C = sp.Symbol("C", positive=True)  # constant of the asymptotic lower bound (docs/theory.md §9)
a = sp.Symbol("a", positive=True)  # bound a(1 + b R^2) e^{c R^2} (docs/theory.md §9)
b = sp.Symbol("b", positive=True)
c = sp.Symbol("c", positive=True)  # also c', the exponent coefficient of docs/theory.md §6
x = sp.Symbol("x", positive=True)  # auxiliary unknown
y = sp.Symbol("y", positive=True)  # auxiliary unknown

#: LaTeX names in the notation of docs/theory.md.
LATEX_NAMES: dict[sp.Symbol, str] = {
    A_norm: r"\|A\|_2",
    V_norm: r"\|V\|_2",
    Vu_norm: r"\|Vu\|_2",
    theta: r"\theta",
    lam: r"\lambda",
    eps: r"\varepsilon",
}
