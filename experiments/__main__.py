"""`python -m experiments` is the `meanfield` command."""

from .cli import main

raise SystemExit(main())
