r"""Real-data sweeps: local Lipschitz constant of attention layers against sequence length n.

The paper's real-data experiment (docs/experiments.md): for each even n, 10 non-overlapping
windows of n tokens of a text go through a transformer; the hidden states entering one attention
layer are captured, and the local Lipschitz constant of the layer's map at that input is
estimated. The released code's y-axis was not :math:`\|J\|_2` but
:math:`\sqrt{\|J(X)^\top f(X)\|}` (defect D1); this module records **both**:

- the certified bracket ``lower <= ||J(X)||_2 <= upper`` of the map, from
  :func:`meanfield.local_lipschitz` (pure attention maps, matrix-free Lanczos on
  :math:`J^\top J` with tangent products, block upper certificate) or
  :func:`meanfield.lipschitz.local_lipschitz_fn` (the "block" map; autograd products, no
  matrix-free upper certificate: ``upper = inf``). Rotary heads (SmolLM2) have no block
  certificate either (``upper = inf``); the lower end is always certified (:math:`\|Jv\|` for a
  unit :math:`v`);
- the released metric :func:`meanfield.lipschitz.released_metric`;
- the RMS token norm :math:`R(X)=(\frac1n\sum_i\|x_i\|^2)^{1/2}` (the paper's "mean radius") and
  the maximum token norm (the theory's R, docs/theory.md, notation).

Configurations (:data:`CONFIGS`) are the offline stand-ins of docs/experiments.md, each labelled
with the paper configuration it stands in for. The map is explicit (D2): ``"heads+WO"`` (the
attention heads with the output projection, as GPT2Attention) and, for the MiniLM (BERT
architecture) layers, the labelled ``"block"`` variant (residual + LayerNorm, the map of the
released ``bert_encoder``/``bert_decoder`` folders). Masks are explicit: the causal stand-ins are
genuinely masked (unlike D3), and every module runs in eval mode (unlike D4). Windows use one
running pointer per grid (D6 fixed). Users with real checkpoints pass ``models=[path or hub
name]`` (loaded offline by :func:`meanfield.models.load_model`).

Cost: see :data:`PRESETS`. Layout under ``results_dir / "real_data"``: one resumable
:class:`~experiments.engine.Sweep` per (configuration, corpus, grid),
``<config>__<corpus>__<grid>.jsonl`` with one record per n (its windows estimated in batched
calls; a killed run loses at most that n), and ``manifest.json`` listing the sweeps with their
labels, provenance and configuration hash. The short and long grids of one configuration are
separate sweeps, each with its own running pointer from token 0, so their windows may coincide.

One module per concept: :mod:`.settings` (the configurations, corpora and presets),
:mod:`.sweep` (windows, hidden-state capture and the resumable estimation sweep, ``run``) and
:mod:`.report` (reading the sweeps back, fits, summary, CSV export and the report section).
"""

from __future__ import annotations

from ..engine import ModuleStage
from .report import (
    CURVE_TOLERANCE,
    PAPER_OWN_MODELS,
    claims,
    curve_difference,
    export_csv,
    load_sweeps,
    report_section,
    row_verdict,
    summary,
    sweep_fits,
)
from .settings import (
    CONFIGS,
    CORPUS_STANDS_IN,
    NAME,
    PRESETS,
    TRAINING_LENGTH,
    RealConfig,
    RealDataSettings,
    resolve,
)
from .sweep import execute

__all__ = [
    "CONFIGS",
    "CORPUS_STANDS_IN",
    "CURVE_TOLERANCE",
    "PAPER_OWN_MODELS",
    "NAME",
    "PRESETS",
    "TRAINING_LENGTH",
    "STAGE",
    "RealConfig",
    "RealDataSettings",
    "curve_difference",
    "execute",
    "export_csv",
    "load_sweeps",
    "claims",
    "report_section",
    "resolve",
    "row_verdict",
    "run",
    "summary",
    "sweep_fits",
]

#: The stage (experiments/engine/_stage.py contract).
STAGE = ModuleStage.from_module(__name__, "Real data: local Lipschitz constant vs n")
#: Run the real-data sweeps of a preset (:meth:`experiments.engine.ModuleStage.run`).
run = STAGE.run
