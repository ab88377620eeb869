"""One module per ``meanfield`` command; each has ``register(subparsers)``.

A command's handler takes the parsed arguments and returns a JSON-serialisable dict; its printer
writes the short human-readable form. :mod:`meanfield_cli.main` prints one or the other.
"""
