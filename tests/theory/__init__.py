"""Tests of theory, theory.bounds, theory.symbolic, theory.lambert."""
