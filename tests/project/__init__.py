"""Tests of the project as a whole: layering, documentation references, README, examples,
packaging, benchmarks."""
