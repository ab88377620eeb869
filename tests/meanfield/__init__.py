"""Tests of the meanfield package: attention, measures, Jacobians, streaming, Lipschitz brackets,
certificates, attacks, models, profile."""
