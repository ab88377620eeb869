"""Tests of the paper_figs package: the figures."""
