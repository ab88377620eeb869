r"""Adversarial inputs on real attention layers: the √n construction against n (figure F4).

What is measured (docs/experiments.md; docs/theory.md §1–§3)
-------------------------------------------------------------------
For each configuration of the paper's adversarial table and each sequence length :math:`n`:

1. the input is the closed-form construction of docs/theory.md §3 built from **one head's** score
   matrix :math:`A_h` (biases ignored, as in the released code), with the paper's radius
   :math:`R`: one token plus :math:`n-1` copies on the line :math:`\mathbb Ru`
   (:func:`meanfield.attacks.adversarial_sequence`). Two variants: ``"released"`` (real
   eigenvectors of the score matrix and the −8 rule, exactly the released choice) and
   ``"symmetric"`` (extreme eigenvectors of :math:`(A_h+A_h^\top)/2`, docs/theory.md §3 remarks);
2. the local Lipschitz constant :math:`\|Df(X)\|_2` of the **whole multi-head map** (every head,
   biases, :math:`W^O` when the map has it, the causal mask when the configuration has one) as a
   certified bracket (:func:`meanfield.lipschitz.local_lipschitz`, float64);
3. beside it: the global √n bound of docs/theory.md §1 summed over heads, the certified
   data-dependent local bound of §2a (generalised below), and the released data-dependent
   quantity of §2 (**not a valid bound as written**; stored as a labelled heuristic).

The construction only depends on :math:`n` through the number of copies, so it is built once per
(configuration, variant) at the largest :math:`n` of the grid and cut: the first :math:`n` rows of
that sequence are exactly ``adversarial_sequence(A_h, R, n).X``.

Configurations (docs/experiments.md table, offline stand-ins of "Models and texts")
----------------------------------------------------------------------
=============  =====================  ==========================================  ====  ===========
id             paper                  offline stand-in                            R     paper's C
=============  =====================  ==========================================  ====  ===========
``bert_enc``   BERT-enc L0 head 0     all-MiniLM-L6-v2 L0 head 0, map "heads"     15.5  4.39
``bert_dec``   BERT-"dec" L6 head 7   all-MiniLM-L6-v2 L3 head 7, "heads", causal 21.5  5.73
``gpt2_rand``  GPT-2-rand L6 head 0   random GPT-2 (seed 320) L6 head 0,          100   0.92
                                      "heads+WO", causal (the paper's own model)
``gpt2``       GPT-2 L0 head 0        SmolLM2-135M L0 head 0, "heads+WO",         10    46.9
                                      causal, RoPE, GQA
=============  =====================  ==========================================  ====  ===========

* Map "heads" is ``BertSelfAttention`` (concatenated heads, no :math:`W^O`), the map the released
  adversarial BERT runs differentiated (defect D2); "heads+WO" is ``GPT2Attention``.
* ``bert_dec`` applies an explicit causal mask: a genuinely masked run, unlike the released one
  (defect D3).
* ``gpt2`` with SmolLM2: the construction uses the head's :math:`A` **without** the rotary
  embedding (the score at relative position 0), so the logit gap :math:`\gamma` is only
  approximate for this map (docs/theory.md §1); records carry ``construction_exact = False``. The
  bounds are extended to rotary heads below.
* The paper's printed constants are hand-set curves (defect D7), compared here against the
  least-squares fit of our measurements.
* Real checkpoints (``bert-base-uncased``, ``gpt2``, any local directory) replace the stand-ins
  with the override ``models={"bert_enc": "/path/to/bert-base-uncased", ...}``; the paper's own
  layer is then used.

Bounds (float64)
----------------
With :math:`W_hV_h` the output matrix of head :math:`h` (:math:`V_h` without :math:`W^O`):

* **Global** (docs/theory.md §1), :math:`\sum_h\|W_hV_h\|_2\,B(\|A_h\|_{\mathrm{eff}},1,R,n)`, for
  the ``"sqrt3"`` form :math:`B=\sqrt3\,(\theta^2(4n+1)+n)^{1/2}` (the recalled constant) and the
  ``"triangle"`` form :math:`B=\sqrt n(1+\theta)+\theta` (never larger), :math:`\theta=
  \|A_h\|_{\mathrm{eff}}R^2` (:func:`theory.bounds.sqrt_n_upper`). *Our derivation*: a query
  bias adds :math:`c_h` to the key gradient :math:`A_h^\top x_i` (docs/conventions.md, biases), so
  :math:`\|A_h\|_{\mathrm{eff}}=\|A_h\|_2+\|c_h\|/R` bounds both the :math:`T_2` and :math:`T_3`
  factors; for a rotary head the relative-position forms :math:`A_r=\alpha^2Q_h^\top
  \mathrm{Rot}_rK_h` all satisfy :math:`\|A_r\|_2\le\alpha^2\|Q_h\|_2\|K_h\|_2`, which the proof
  of §1 only needs (:math:`T_3` by Cauchy–Schwarz), so that product is used.
* **Certified local** (docs/theory.md §2a, *derived*): :func:`meanfield.certified_local_upper`, the
  data-dependent three-term bound summed over heads with :math:`\|W_hV_h\|_2`, biases, masks and
  rotary heads included (the rotary form is our extension).
* **Released heuristic** (docs/theory.md §2, *from the authors' released code*):
  :math:`\sum_h\|V_h\|_2(R_h^2r^2(n+1)+n)^{1/2}` (:func:`theory.bounds.released_data_dependent`);
  not a bound as written.

Results (``results_dir / "adversarial"``)
-----------------------------------------
``<id>.jsonl`` (one :class:`~experiments.engine.Sweep` record per (n, variant)), ``<id>.meta.json``
(run metadata), ``<id>.json`` (configuration, model provenance and head norms of the latest run,
whose ``config_hash`` selects the records), and for the worst-case search ``worst_case.jsonl`` /
``worst_case.json``. Every run is resumable: finished points are skipped and a model is only
loaded when one of its points is missing.

Modules
-------
:mod:`.settings` (the configurations and presets), :mod:`.bounds` (the √n fit and the bounds
drawn beside the measured constants), :mod:`.sweep` (the models, the per-configuration sweeps,
the worst-case search, ``run`` and the CSV export) and :mod:`.report` (reading the results back,
the summary and the section of ``report.md``).
"""

from __future__ import annotations

from ..engine import ModuleStage
from .bounds import fit_sqrt_n, global_bound, released_heuristic
from .report import (
    SQRT_N_TOLERANCE,
    claims,
    load_results,
    report_section,
    sqrt_n_consistent,
    summary,
)
from .settings import (
    CONFIGS,
    NAME,
    PAPER_N_GRID,
    PRESETS,
    AdvConfig,
    AdversarialSettings,
    resolve,
)
from .sweep import execute, export_csv

__all__ = [
    "CONFIGS",
    "NAME",
    "PAPER_N_GRID",
    "PRESETS",
    "SQRT_N_TOLERANCE",
    "STAGE",
    "AdvConfig",
    "AdversarialSettings",
    "execute",
    "export_csv",
    "fit_sqrt_n",
    "global_bound",
    "load_results",
    "released_heuristic",
    "claims",
    "report_section",
    "resolve",
    "run",
    "sqrt_n_consistent",
    "summary",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(__name__, "Adversarial inputs on real models")
#: Run the adversarial sweeps of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
