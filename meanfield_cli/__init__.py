"""The ``meanfield`` command line: the top layer, above ``experiments`` and ``paper_figs``.

It holds the ``meanfield`` console script, the ``reproduce`` pipeline and the registry of stages
and figures. It may import every other package of the project (``theory``, ``meanfield``, the
experiment stages of ``experiments`` and the figures of ``paper_figs``), and none of them imports
it (docs/architecture.md). Its name is ``meanfield_cli``, not ``cli`` or ``app``: installed
packages share one namespace.

- :mod:`meanfield_cli.main`: the console script (one module per command in ``commands/``);
  ``python -m meanfield_cli`` runs it too;
- :mod:`meanfield_cli.pipeline`: ``meanfield reproduce`` (stages, figures, report);
- :mod:`meanfield_cli.registry`: the stages and the figures that read their results.
"""
