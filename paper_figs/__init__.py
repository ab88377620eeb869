"""Figures, drawn from saved results only (one script per figure)."""
