"""Tests of meanfield_cli: the meanfield command and the reproduce pipeline."""
