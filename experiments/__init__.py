"""The paper's experiments as stages, above their run engine (:mod:`experiments.engine`)."""
