"""Named tolerances per (dtype, oracle), each with its justification.

Every tolerance of the test suite is named here once, grouped by the computation that produces
the two compared numbers (the oracle), not by its value: two tolerances with the same value but a
different reason carry different names. A test imports the name (``from ..tolerances import
F64_REWRITTEN``) and passes it as ``rel=``/``rtol=``/``atol=`` or uses it as a relative bound
(``err <= F64_REDUCTION * scale``). u = 2^-53 ~ 1.1e-16 is the float64 unit roundoff, 2^-24 ~
6e-8 the float32 one. Comparisons of tensors check dtype and shape before values (see
`assert_close`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the tensor helper only: numpy-only tests stay light
    import torch

# ---------------------------------------------------------------------------------------------
# 1. float64 against float64: one closed form (or one finite sum) evaluated by two routes
# ---------------------------------------------------------------------------------------------
#: The same formula on both sides, evaluated in a different order or through a thin wrapper
#: (a registry entry, a limit n -> inf, a window W = n, an object-precision path rounded back):
#: O(1) roundings on each side, so a few ulps.
F64_FEW_ULPS = 1e-15
#: A closed form against an algebraically rewritten one (log form vs direct, factored vs
#: expanded, a docs formula vs the implementation): O(10) roundings including exp/log of O(1)
#: arguments, tens of ulps.
F64_REWRITTEN = 1e-14
#: As F64_REWRITTEN, where exp/log of arguments up to ~100 or a sum of O(100) terms amplifies the
#: rounding (the relative error of exp(x) grows like |x| u): hundreds of ulps.
F64_REWRITTEN_EXP = 1e-13
#: Two float64 implementations of a reduction over O(n d) terms: the library against a naive
#: oracle (dense Jacobian, explicit loop, permutation/LP cost, a spectral norm via SVD, a sum over
#: rows, a JSON round trip of such a value): different summation order, up to ~1e4 ulps.
F64_REDUCTION = 1e-12
#: As F64_REDUCTION through longer chains of dependent operations (Jacobians assembled by
#: autograd, FFT-based circulant norms, a sympy/Lambert-W inversion composed with the bound it
#: inverts): the rounding of each stage is amplified by the next one's condition number.
F64_LONG_CHAIN = 1e-11
#: A closed-form bound evaluated by the library against the formula written out in the test, a
#: registry/wrapper entry of it, or a closed-form inverse (Lambert W, a quadratic root, a crossover
#: n*) plugged back into the forward formula: exp of arguments up to ~40 and the forward map's
#: condition number (~theta) amplify a few ulps to ~1e4 ulps.
F64_CLOSED_FORM = 1e-12
#: A sympy-derived expression lambdified to numpy against the hand-written float64 implementation:
#: the same mathematics in a different operation order, O(10-100) operations with exp/log.
F64_SYMBOLIC = 1e-12
#: Residual of an identity of O(1) quantities (a zero-sum, a marginal of a transport plan, a
#: normalised row, a fitted slope on exact power-law data): absolute, ~1e4 ulps of O(1) terms.
F64_ZERO = 1e-12
#: Absolute residual of an identity over a few O(1) terms (norms of unit vectors, a
#: same-derivative Jacobian, transport marginals on small problems): tens of ulps.
F64_ZERO_TIGHT = 1e-14
#: Absolute floor, a few ulps of an O(1) value, for entries that may be 0 in an identity of a few
#: operations.
F64_ZERO_ULPS = 1e-15
#: Absolute floor that admits only exact zeros among values that span down to ~1e-300 (the
#: relative tolerance does the work).
EXACT_ZERO_FLOOR = 1e-300
#: One subnormal ulp: values that underflow to the subnormal range agree to the last bit.
F64_ONE_SUBNORMAL = 5e-324
#: exp(x + gamma) with gamma ~ 1e9: x + gamma is rounded to gamma's ulp (1.2e-7), which exp turns
#: into a relative error of 1.2e-7.
F64_LARGE_EXPONENT = 1e-6

# ---------------------------------------------------------------------------------------------
# 2. float64 against a high-precision or independent library reference
# ---------------------------------------------------------------------------------------------
#: A well-conditioned scalar special function (Lambert W) against mpmath/sympy at 30-50 digits,
#: or a JSON-stored value recomputed: the float64 result is correctly rounded up to a few ulps.
F64_VS_MPMATH = 1e-15
#: A closed form with exp of large arguments or a sum of near-cancelling terms against an mpmath
#: 50-digit evaluation of the same expression: float64 rounding amplified by the condition number.
F64_VS_MPMATH_COND = 1e-13
#: Against scipy.special.lambertw away from the branch point: scipy's own Halley iteration stops
#: at a few ulps, so both sides carry independent rounding.
F64_VS_SCIPY = 1e-14
#: lambertw_exp(u) against lambertw(exp(u)): exp rounds once (u relative), and W's relative
#: condition number 1/(1 + W) <= 1 passes it through, plus both sides' final roundings.
F64_VS_EXP_COMPOSED = 2e-15

# ---------------------------------------------------------------------------------------------
# 3. Iterative float64 computations (root finders, optimisers, Lanczos, Sinkhorn, fits)
# ---------------------------------------------------------------------------------------------
#: A value located by an iterative scalar solver (brentq, minimize_scalar with xatol 1e-12,
#: fixed point, a Newton refinement) or by a closed form that cancels 0/0 near a limit, compared
#: with an independent route: the solver/cancellation error, far below this, not rounding.
F64_SOLVER = 1e-10
#: A maximum located by scipy's bounded scalar minimiser (xatol 1e-12 in the argument) compared
#: with the closed-form supremum: the stopping rule leaves ~1e-10 in the value.
F64_OPTIMIZER = 1e-9
#: Two float64 assemblies of the same Jacobian (the proof's block decomposition vs the engine's
#: dense one), each followed by an SVD: entries carry factors e^theta with theta up to ~10, so
#: small singular values of the blocks carry absolute errors of ~1e4 u relative to the norm.
F64_DENSE_ASSEMBLY = 1e-9
#: Lanczos or power iteration at the library's default residual rule (||J^T J v - s^2 v|| <=
#: 1e-10 s^2 gives |s - sigma_1| of order 1e-10 sigma_1) against a dense SVD, or an attack
#: search's value re-evaluated by an oracle at the returned measure.
F64_LANCZOS = 1e-9
#: As F64_LANCZOS where the top singular value is less separated (a smaller gap slows the Ritz
#: value's convergence), or two Lanczos runs from different starts compared with each other.
F64_LANCZOS_GAP = 1e-8
#: Lanczos stopped at a residual 1e-6 s^2, or two different Krylov paths (compressed vs full,
#: random vs deterministic start, streaming vs stored), compared: Weyl gives |s - sigma| <= 5e-7.
F64_LANCZOS_COARSE = 1e-6
#: Ritz value printed in the progress line / compared at the solver's 1e-5 stop.
F64_LANCZOS_PRINTED = 1e-5

# ---------------------------------------------------------------------------------------------
# 4. Finite differences (float64)
# ---------------------------------------------------------------------------------------------
#: Central finite differences with h = 1e-6 on O(1) inputs: truncation O(h^2) plus rounding
#: O(u / h) ~ 1e-10, with headroom: relative part.
FD_REL = 1e-6
#: Absolute part of the above, for entries of size ~0.
FD_ABS = 1e-7
#: Central finite differences with a relative step h = 1e-6 |z| of a smooth scalar function
#: (or an O(1) Jacobian entry with h = 1e-5): truncation h^2 ~ 1e-12, rounding u / h ~ 1e-10.
FD_SCALAR = 1e-8

# ---------------------------------------------------------------------------------------------
# 5. float32 (or mixed precision) against the float64 reference
# ---------------------------------------------------------------------------------------------
#: A float32 forward pass of O(n d) operations against float64: u32 ~ 6e-8 times O(100).
F32_FORWARD = 1e-5
#: A float32 spectral norm / Lanczos value / Sinkhorn cost or an end-to-end model Jacobian norm
#: against the float64 one: float32 rounding amplified by a long chain (softmax, matmuls, solver).
F32_VALUE = 1e-4

# ---------------------------------------------------------------------------------------------
# 6. Limits, asymptotics and printed values
# ---------------------------------------------------------------------------------------------
#: A quantity at a large but finite parameter (R = 1e3..1e4, gamma = 1e3, n = 1e6) against its
#: limit: the correction decays like 1/parameter and is below this at the parameters used.
ASYMPTOTE = 1e-3
#: As ASYMPTOTE at parameters an order of magnitude further out (R = 1e6..1e7, small gamma).
ASYMPTOTE_FAR = 1e-4
#: A limit approached like log(g)/g (the two-Dirac asymptote at g = 1e3).
ASYMPTOTE_SLOW = 2e-3
#: A sequence at n = 1e7 against its supremum (correction ~ e^gamma / n).
ASYMPTOTE_CONVERGED = 1e-5
#: A limit whose correction is O(theta) with theta ~ 1e-8 at the point used.
ASYMPTOTE_NEGLIGIBLE = 1e-6
#: A value read back from a printed/rounded report line (4 significant digits).
PRINTED = 1e-4

# ---------------------------------------------------------------------------------------------
# 7. Thresholds that must be exceeded (a wrong variant, a mutation, a missing term)
# ---------------------------------------------------------------------------------------------
#: A wrong formula (mask dropped, transpose forgotten, bias added twice) changes the result by
#: at least this much on the random inputs used: far above every rounding tolerance above.
DIFFERS = 1e-3

# ---------------------------------------------------------------------------------------------
# Keyword bundles for torch.testing.assert_close / `assert_close`
# ---------------------------------------------------------------------------------------------
#: Two float64 implementations of the same finite sum of O(n) terms of size O(1): a few hundred
#: ulps, relative and absolute (entries near 0).
F64_EXACT = dict(rtol=F64_REDUCTION, atol=F64_REDUCTION)
#: float32 against the float64 reference on O(1) inputs: softmax and matmuls lose ~1e-6 relative.
F32_VS_F64 = dict(rtol=2e-5, atol=2e-5)
#: float64 radius-100 inputs: logits are ~1e4, so absolute logit errors of ~1e4 * u propagate.
F64_LARGE_RADIUS = dict(rtol=1e-9, atol=1e-9)
#: Central finite differences in float64 with h = 1e-6: truncation O(h^2) plus rounding O(u / h).
F64_FINITE_DIFF = dict(rtol=FD_REL, atol=FD_ABS)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, **tol: float) -> None:
    """Check dtype, then shape, then values."""
    import torch

    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, **tol)
