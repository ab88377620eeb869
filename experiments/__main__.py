"""`python -m experiments` is the `meanfield` command (:mod:`experiments.app.main`)."""

from .app.main import main

raise SystemExit(main())
