"""The application layer: the ``meanfield`` command, the ``reproduce`` pipeline, the registry.

This package sits above both the experiment stages (``experiments.*``) and the figures
(``paper_figs``): it may import both, and nothing imports it (docs/architecture.md).

- :mod:`experiments.app.main`: the console script (one module per command in ``commands/``);
- :mod:`experiments.app.pipeline`: ``meanfield reproduce`` (stages, figures, report);
- :mod:`experiments.app.registry`: the stages and the figures that read their results.
"""
