"""Every Python block of README.md runs as written, and the facts it asserts hold.

Blocks fenced as ``python`` (or ``py``) run in a fresh namespace each, in the order they appear;
shell blocks (``bash``, ``sh``, ``shell``, ``console``) are skipped. A README block states its
documented outputs as ``assert`` statements or ``torch.testing.assert_close`` calls, so running it
checks them.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console", "text", ""}


def _blocks() -> list[tuple[str, str, int]]:
    text = README.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append((m.group(1).lower(), m.group(2), line))
    return out


def _python_blocks() -> list[tuple[str, int]]:
    return [(code, line) for lang, code, line in _blocks() if lang in PYTHON]


def test_readme_has_python_blocks_and_no_unknown_languages():
    langs = {lang for lang, _, _ in _blocks()}
    assert langs <= PYTHON | SHELL, f"unknown code block languages {sorted(langs - PYTHON - SHELL)}"
    assert len(_python_blocks()) >= 2


@pytest.mark.parametrize(
    ("code", "line"), [pytest.param(c, n, id=f"line{n}") for c, n in _python_blocks()]
)
def test_readme_python_block_runs(code: str, line: int) -> None:
    namespace: dict[str, object] = {"__name__": "__readme__"}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102
    if "print(" in code:
        assert stdout.getvalue().strip(), f"README.md:{line} prints nothing"


def test_first_script_prints_a_finite_distance():
    (code, line), *_ = _python_blocks()
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})  # noqa: S102
    m = re.fullmatch(r"tensor\(([0-9.e+-]+), dtype=torch\.float64\)", stdout.getvalue().strip())
    assert m is not None, stdout.getvalue()
    assert 0 < float(m.group(1)) < 10
