"""Dependency rules of DESIGN.md §3, checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

import pytest


def loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return {name.split(".")[0] for name in out.stdout.split()}


@pytest.mark.parametrize(
    ("statement", "forbidden"),
    [
        (
            "import meanfield",
            {"sympy", "matplotlib", "experiments", "paper_figs", "theory", "transformers", "ot"},
        ),
        ("import theory", {"torch", "matplotlib", "meanfield", "experiments", "paper_figs"}),
    ],
)
def test_import_does_not_load(statement, forbidden):
    loaded = loaded_after(statement)
    assert not (loaded & forbidden), f"{statement!r} loaded {sorted(loaded & forbidden)}"
