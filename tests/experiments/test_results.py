"""Results I/O: atomic writes leave either the old file or the new one, never a torn one."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.engine import _results as results


def test_failed_write_keeps_previous_file(tmp_path):
    path = tmp_path / "r.json"
    results.write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        results.write_json(path, {"a": object()})
    assert results.load_json(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_npz_roundtrip_without_pickle(tmp_path):
    path = results.save_npz(tmp_path / "x.npz", a=np.arange(3.0), b=np.eye(2))
    data = results.load_npz(path)
    assert np.array_equal(data["a"], np.arange(3.0)) and np.array_equal(data["b"], np.eye(2))
    with pytest.raises(ValueError, match="pickle"):
        results.save_npz(tmp_path / "y.npz", obj=np.array([object()], dtype=object))
    assert not (tmp_path / "y.npz").exists()


def test_jsonl_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "records.jsonl"
    results.append_jsonl(path, {"n": 2, "value": 1.5})
    results.append_jsonl(path, {"n": 4, "value": float("inf")})
    with open(path, "a") as fh:
        fh.write('{"n": 6, "val')  # a crash mid-record
    assert results.load_jsonl(path) == [{"n": 2, "value": 1.5}, {"n": 4, "value": "inf"}]


def test_csv_long_format(tmp_path):
    path = results.write_csv(
        tmp_path / "c.csv", [{"n": 2, "v": 1.0}, {"n": 4, "v": 2.0, "seed": 3}]
    )
    lines = path.read_text().splitlines()
    assert lines[0] == "n,v,seed" and lines[2] == "4,2.0,3"


def test_metadata_fields():
    meta = results.run_metadata(seed=3, device="cpu", dtype="float64", config={"x": 1})
    assert meta["schema_version"] == results.SCHEMA_VERSION
    assert {"python", "numpy", "torch", "meanfield"} <= set(meta["versions"])
    assert meta["seed"] == 3 and meta["config"] == {"x": 1}


def test_atomic_files_get_ordinary_permissions(tmp_path):
    import os
    import stat

    from experiments.engine import atomic_write_text, default_file_mode

    p = atomic_write_text(tmp_path / "a.txt", "x")
    assert stat.S_IMODE(os.stat(p).st_mode) == default_file_mode()
    old = os.umask(0o022)
    try:
        assert default_file_mode() == 0o644
    finally:
        os.umask(old)


def test_run_metadata_records_the_numerical_stack():
    from importlib import metadata

    versions = results.run_metadata()["versions"]
    for key, dist in (("scipy", "scipy"), ("sympy", "sympy"), ("torch", "torch")):
        assert versions[key].split("+")[0] == metadata.version(dist).split("+")[0]
    try:
        assert versions["pot"] == metadata.version("POT")
    except metadata.PackageNotFoundError:
        assert "pot" not in versions


def test_record_float_inverts_the_encoding_of_non_finite_floats(tmp_path):
    import math

    from experiments.engine import load_jsonl, record_float
    from experiments.engine._results import append_jsonl

    values = [1.5, -0.0, math.inf, -math.inf, math.nan, 3]
    append_jsonl(tmp_path / "r.jsonl", {"v": values})
    (stored,) = load_jsonl(tmp_path / "r.jsonl")
    back = [record_float(x) for x in stored["v"]]
    assert back[:4] == [1.5, -0.0, math.inf, -math.inf] and math.isnan(back[4])
    assert back[5] == 3.0 and isinstance(back[5], float)
    assert math.isnan(record_float("other"))
