"""Tests of the experiments package: the engine and its stages, corpora, fits."""
