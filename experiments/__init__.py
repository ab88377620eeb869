"""Scripted runs of meanfield: presets, resumable sweeps, results I/O and the `meanfield` CLI."""
