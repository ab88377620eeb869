r"""Local Lipschitz constants of attention with certified brackets (docs/theory.md §16).

:func:`local_lipschitz` estimates, at a sequence or a weighted atomic measure (the definitions
are in docs/theory.md §16 and §A2),

* ``geometry="euclidean"``: :math:`\|Df(X)\|_2` (masked: :math:`\|Df^m(X)\|_2`);
* ``geometry="wasserstein"``: :math:`L_W(\mu) = \|D_a^{1/2}JD_a^{-1/2}\|_2`, which equals
  the Euclidean value for uniform weights; for a causal (position-tagged) measure this is the
  conditional-distance constant;
* ``geometry="split"``: :math:`\max\big(L_W(\mu),\max_i\|\sum_hW_hV_hC^h_iA_h^\top\|_2\big)`
  (mass splitting allowed).

Every :class:`LipschitzEstimate` carries a bracket ``lower <= exact <= upper``:

* ``lower`` is :math:`\|Jv\|/\|v\|` for the returned vector, recomputed from one explicit product
  (in float64 when the inputs are float32), so it is a true lower bound;
* ``upper`` is, for dense problems, Gram iteration on the assembled Jacobian certified by a
  Cholesky test, and for large problems the block-norm bound with a Collatz–Wielandt
  certificate (both in docs/theory.md §B5; docs/certificates.md §5), computed in
  :math:`O(Hn^2d)` without :math:`(nd)^2` storage.

Reference: V. Castin, P. Ablin, G. Peyré, *How Smooth Is Attention?*, ICML 2024 (arXiv
2312.14820 v2). The formulas are our reconstructions (docs/theory.md §16), labelled *derived
and checked numerically*; they are not quoted from the paper.

The products run on one of two paths (``path=``): the stored one keeps every head's
:math:`n\times n` attention matrices; the streaming one keeps only head rows and row
log-normalisers and recomputes the attention tile by tile, in memory linear in :math:`n`, with
its own rounding analysis for ``lower`` and ``upper_prob`` (docs/rounding.md §11).
:func:`stored_bytes` is the fixed count by which ``path="auto"`` chooses; where the stored
margins then put the requested width out of reach (large logits), ``"auto"`` also runs the
streaming call and keeps the narrower bracket.

Both ends include the rounding margin of docs/rounding.md: the error of the attention matrix grows
with the magnitude of the logits (its §2), and is propagated through a nonnegative magnitude
operator of the closed form (its §3–§4). Every norm is computed on :math:`2^{-e}J` for a
power-of-two scale and multiplied back (its §5), so constants up to float64's maximum come back
finite; beyond it ``upper`` is ``inf``. Both ends are rounded outwards when cast to float32.
``converged`` means the residual rule holds for the returned vector, for every method
(docs/rounding.md §7).

The package is split along four concepts: :mod:`~meanfield.lipschitz.engine`
(:class:`LipschitzEstimate`, :func:`local_lipschitz`), :mod:`~meanfield.lipschitz.any_map`
(:func:`local_lipschitz_fn`, :func:`released_metric`: any differentiable map),
:mod:`~meanfield.lipschitz.local_bound` (:func:`certified_local_upper`, the data-dependent
bound) and :mod:`~meanfield.lipschitz.starts` (:func:`kronecker_start`, a start vector close
to the top singular vector). Every name is importable from ``meanfield.lipschitz``.
"""

from .any_map import local_lipschitz_fn, released_metric
from .engine import DENSE_AUTO_MAX as DENSE_AUTO_MAX
from .engine import LipschitzEstimate, local_lipschitz, stored_bytes
from .local_bound import LocalUpperBound, certified_local_upper
from .starts import kronecker_start

__all__ = [
    "LipschitzEstimate",
    "LocalUpperBound",
    "certified_local_upper",
    "kronecker_start",
    "local_lipschitz",
    "local_lipschitz_fn",
    "released_metric",
    "stored_bytes",
]
