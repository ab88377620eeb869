"""``python -m meanfield_cli`` is the ``meanfield`` command (:mod:`meanfield_cli.main`)."""

from .main import main

raise SystemExit(main())
