"""The demo: a random two-dimensional attention layer acting on a weighted measure.

Computes masked and unmasked mean-field attention of an unbalanced atomic measure, the exact
W_2 distances between input and outputs, and writes ``demo.npz`` plus ``demo.json``; the figure
is drawn from those files by :mod:`paper_figs.fig_demo`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from meanfield import AttentionParams, DiracMeasure, attention, local_lipschitz
from meanfield.distances import conditional_wasserstein, wasserstein

from .engine import run_metadata, save_npz, write_json

log = logging.getLogger(__name__)

__all__ = ["DemoConfig", "main", "run"]


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo (all have defaults)."""

    seed: int = 0
    n: int = 12
    R: float = 2.0
    mass_decades: float = 3.0
    dtype: str = "float64"
    out: str = "meanfield_demo"

    def __post_init__(self) -> None:
        if self.n < 2:
            raise ValueError(f"n must be at least 2, got {self.n}")
        if not self.R > 0:
            raise ValueError(f"R must be positive, got {self.R}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")


def build(config: DemoConfig) -> tuple[DiracMeasure, AttentionParams]:
    """The demo's measure (n atoms in B_R, log-uniform masses, positions) and head (d = 2)."""
    dtype = getattr(torch, config.dtype)
    g = torch.Generator().manual_seed(config.seed)
    A = torch.randn(2, 2, generator=g, dtype=torch.float64)
    A = A / torch.linalg.matrix_norm(A, ord=2)  # ||A||_2 = 1, non-symmetric
    V = torch.eye(2, dtype=torch.float64) + 0.3 * torch.randn(
        2, 2, generator=g, dtype=torch.float64
    )
    directions = torch.randn(config.n, 2, generator=g, dtype=torch.float64)
    directions /= directions.norm(dim=-1, keepdim=True)
    radii = config.R * torch.rand(config.n, 1, generator=g, dtype=torch.float64).sqrt()
    log_a = -config.mass_decades * torch.log(torch.tensor(10.0)) * torch.rand(config.n, generator=g)
    weights = torch.softmax(log_a.double(), 0)
    positions = torch.randperm(config.n, generator=g).double().add(1) / config.n
    mu = DiracMeasure((directions * radii).to(dtype), weights.to(dtype), positions.to(dtype))
    return mu, AttentionParams(A.to(dtype), V.to(dtype))


def run(config: DemoConfig) -> dict[str, Any]:
    """Compute the demo's outputs; returns the JSON summary (also written to ``out``)."""
    mu, head = build(config)
    out_u = attention(mu, head)
    out_m = attention(mu, head, masked=True)
    summary = {
        "W2(mu, F(mu))": float(wasserstein(mu, out_u)),
        "W2(mu, Fm(mu))": float(wasserstein(mu, out_m)),
        "W2(F(mu), Fm(mu))": float(wasserstein(out_u, out_m)),
        "Wc(F(mu), Fm(mu))": float(conditional_wasserstein(out_u, out_m)),
        "radius(mu)": float(mu.radius()),
        "A_norm": float(head.A_norm()),
        "V_norm": float(head.V_norm()),
    }
    # Local Lipschitz constants of F at mu: W_2 geometry (unmasked) and the conditional distance
    # W_c (masked, positions fixed), each as a certified bracket (docs/theory.md §16).
    unmasked_mu = DiracMeasure(mu.points, mu.weights)
    lipschitz: dict[str, dict[str, Any]] = {}
    for name, measure in (("F", unmasked_mu), ("Fm", mu)):
        est = local_lipschitz(measure, head, geometry="wasserstein")
        lipschitz[name] = {k: float(getattr(est, k)) for k in ("value", "lower", "upper")}
        lipschitz[name]["method"] = est.method
    out = Path(config.out)
    save_npz(
        out / "demo.npz",
        points=mu.points,
        weights=mu.weights,
        positions=mu.positions,
        unmasked=out_u.points,
        masked=out_m.points,
        A=head.A,
        V=head.V,
    )
    doc = {
        "kind": "demo",
        "metadata": run_metadata(
            seed=config.seed, device="cpu", dtype=config.dtype, config=asdict(config)
        ),
        "distances": summary,
        "local_lipschitz": lipschitz,
    }
    write_json(out / "demo.json", doc)
    log.info("wrote %s", out / "demo.npz")
    return doc


def main(config: DemoConfig) -> Path:
    """Run the demo and return its output directory."""
    run(config)
    return Path(config.out)
