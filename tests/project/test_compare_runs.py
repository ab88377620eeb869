"""benchmarks/compare_runs.py: the field-by-field comparison of two ``make demo`` results."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location(
        "compare_runs", ROOT / "benchmarks" / "compare_runs.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(root: Path, records, doc, arr) -> Path:
    (root / "stage").mkdir(parents=True)
    (root / "stage" / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "stage" / "run.json").write_text(json.dumps(doc))
    np.savez(root / "stage" / "a.npz", x=arr)
    return root


def test_equal_runs_differ_only_in_their_times(tmp_path) -> None:
    cr = _module()
    recs = [{"key": "k1", "n": 2, "value": [1.0, float("nan")], "seconds": 3.0}]
    a = _write(tmp_path / "a", recs, {"fit": 0.5, "metadata": {"created": "x"}}, np.arange(3.0))
    recs_b = [{**recs[0], "seconds": 9.0}]
    b = _write(tmp_path / "b", recs_b, {"fit": 0.5, "metadata": {"created": "y"}}, np.arange(3.0))
    assert list(cr.compare(a, b)) == []
    assert cr.main([str(a), str(b)]) == 0


def test_every_kind_of_difference_is_named(tmp_path) -> None:
    cr = _module()
    recs = [{"key": "k1", "n": 2, "value": [1.0]}, {"key": "k2", "n": 4, "value": [2.0]}]
    a = _write(tmp_path / "a", recs, {"fit": 0.5}, np.arange(3.0))
    # k1's value moves by one ulp, k2 is re-keyed (matched by its parameters), the fit and one
    # array entry change
    recs_b = [
        {"key": "k1", "n": 2, "value": [np.nextafter(1.0, 2.0)]},
        {"key": "k9", "n": 4, "value": [2.0]},
    ]
    b = _write(tmp_path / "b", recs_b, {"fit": 0.25}, np.array([0.0, 1.0, 2.5]))
    lines = list(cr.compare(a, b))
    assert any("s.jsonl[k1].value[0]" in line for line in lines)
    assert not any("k2" in line for line in lines)  # re-keyed, same parameters and values
    assert any("run.json.fit" in line for line in lines)
    assert any("a.npz:x: 1 of 3 entries differ" in line for line in lines)
    assert len(lines) == 3
    assert list(cr.compare(a, b, rtol=1e-12)) == [line for line in lines if "k1" not in line]
    assert cr.main([str(a), str(b)]) == 1


def test_two_virtual_environments_are_the_same_install(tmp_path) -> None:
    cr = _module()
    a = {"source": "kjv 1.0: /tmp/a/.venv/lib/python3.11/site-packages/kjv/Bible.db"}
    b = {"source": "kjv 1.0: /home/u/p/.venv/lib/python3.11/site-packages/kjv/Bible.db"}
    assert list(cr.diff(a, b, "m", 0.0)) == []
    c = {"source": "kjv 1.1: /home/u/p/.venv/lib/python3.11/site-packages/kjv/Bible.db"}
    assert len(list(cr.diff(a, c, "m", 0.0))) == 1
