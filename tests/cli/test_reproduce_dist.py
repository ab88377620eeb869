"""``reproduce`` and ``experiment`` on Dask, the lock on ``--out``, a killed driver resumed.

The Dask tests skip without the optional extra ``meanfield[dist]``; the lock tests run always.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from experiments.engine import load_jsonl
from experiments.engine._lock import LOCK_NAME
from meanfield_cli import pipeline as rp
from meanfield_cli.main import main

from ..certified_records import UNIT_ROUNDOFF, Guarantees, compare_runs, gamma

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _need_dask() -> None:
    pytest.importorskip("dask")
    pytest.importorskip("distributed")


def _records(root: Path) -> dict[str, dict[str, dict]]:
    """Every JSONL file under ``root``: key -> record without its timings (``seconds*``)."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(root.rglob("*.jsonl")):
        recs = load_jsonl(path)
        by_key = {
            r["key"]: {k: v for k, v in r.items() if not k.startswith("seconds")} for r in recs
        }
        assert len(by_key) == len(recs), f"{path}: a point recorded twice"
        out[str(path.relative_to(root))] = by_key
    return out


def _npz(root: Path) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for path in sorted(root.rglob("*.npz")):
        with np.load(path, allow_pickle=False) as z:
            out[str(path.relative_to(root))] = {k: z[k] for k in z.files}
    return out


@pytest.mark.parametrize(
    "only",
    [
        pytest.param(["synthetic", "verify_bounds", "kim_tightness"], id="engine-stages"),
        pytest.param(
            ["real_data", "adversarial", "synthetic", "verify_bounds"],
            id="with-models",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_tiny_preset_on_two_workers_is_bit_identical_to_serial(tmp_path: Path, only) -> None:
    """A 2-worker LocalCluster against the serial run: the same records, float for float.

    The stages that load models (real_data, adversarial) take a minute more: slow suite.
    """
    _need_dask()
    serial = rp.reproduce(tmp_path / "s", "tiny", only=only, figures=False, progress=False)
    dist = rp.reproduce(tmp_path / "d", "tiny", only=only, figures=False, progress=False, workers=2)
    assert {k: e["status"] for k, e in serial["stages"].items()} == dict.fromkeys(only, "ok")
    assert {k: e["status"] for k, e in dist["stages"].items()} == dict.fromkeys(only, "ok")
    ex = dist["execution"]
    assert ex["workers"] == 2 and ex["scheduler"] is None and ex["rounds"] >= 1
    assert len(ex["import_seconds"]) == 2 and ex["warmup_seconds"] >= ex["start_seconds"] > 0
    assert sum(w["tasks"] for w in ex["per_worker"].values()) >= 40  # every point ran on a worker
    assert "execution" not in serial
    s, d = _records(tmp_path / "s" / "results"), _records(tmp_path / "d" / "results")
    assert sum(len(v) for v in s.values()) >= 40 and len(s) >= 5
    assert s == d  # exact equality of every value, floats included
    zs, zd = _npz(tmp_path / "s" / "results"), _npz(tmp_path / "d" / "results")
    assert zs.keys() == zd.keys() and zs
    for name in zs:
        assert zs[name].keys() == zd[name].keys()
        for k in zs[name]:
            if "second" in k:
                continue
            np.testing.assert_array_equal(zs[name][k], zd[name][k], err_msg=f"{name}:{k}")
    assert not (tmp_path / "d" / LOCK_NAME).exists()  # released


def test_workers_without_dask_is_a_one_line_error(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the extra were absent
    out = tmp_path / "o"
    code = main(["reproduce", "--preset", "tiny", "--out", str(out), "--workers", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "meanfield[dist]" in err[0]
    code = main(["reproduce", "--out", str(out), "--workers", "2", "--scheduler", "tcp://x:1"])
    assert code == 2 and "not both" in capsys.readouterr().err


HOLD = """
import sys, time
from experiments.engine._lock import OutDirLock
with OutDirLock(sys.argv[1], command="holder"):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_lock_on_reproduce_live_then_stale(tmp_path: Path, capsys, caplog) -> None:
    """A live run holds OUT: a second fails at once naming it; killed, its lock is taken over."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], env=ENV, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        args = ["reproduce", "--preset", "tiny", "--out", str(out), "--only", "verify_bounds"]
        t0 = time.perf_counter()
        code = main([*args, "--no-figures"])
        elapsed = time.perf_counter() - t0
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"meanfield: error: {out} is in use by pid {holder.pid}")
        assert "command: holder" in err[0]
        assert elapsed < 10  # at once: nothing was computed
        assert not (out / "results").exists()
        # the same for `experiment` on its own --out
        code = main(["experiment", "verify_bounds", "--preset", "tiny", "--out", str(out)])
        assert code == 2 and f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == holder.pid  # left behind
    with caplog.at_level(logging.WARNING, logger="experiments.engine._lock"):
        doc = rp.reproduce(out, "tiny", only=["verify_bounds"], figures=False, progress=False)
    assert doc["stages"]["verify_bounds"]["status"] == "ok"
    assert "taking over a stale lock" in caplog.text and f"pid {holder.pid}" in caplog.text
    assert len(load_jsonl(out / "results" / "verify_bounds" / "instances.jsonl")) == 30
    assert not (out / LOCK_NAME).exists()


def test_killed_driver_resumes_on_two_workers(tmp_path: Path) -> None:
    """SIGKILL the driver mid-run; the rerun (Dask) takes the stale lock and finishes the rest.

    Every point is then recorded once, with the values of an uninterrupted serial run.
    """
    _need_dask()
    res, ref = tmp_path / "res", tmp_path / "ref"
    cmd = [sys.executable, "-m", "meanfield_cli", "experiment", "verify_bounds", "--preset", "tiny"]
    cmd += ["--set", "n_instances=60", "--no-progress"]
    proc = subprocess.Popen([*cmd, "--out", str(res)], env=ENV, cwd=ROOT)
    path = res / "verify_bounds" / "instances.jsonl"
    deadline = time.monotonic() + 120
    while len(load_jsonl(path)) < 8 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(load_jsonl(path))
    assert proc.returncode == -signal.SIGKILL and 8 <= n_before < 60
    assert (res / LOCK_NAME).exists()  # stale
    code = main(
        ["experiment", "verify_bounds", "--preset", "tiny", "--set", "n_instances=60"]
        + ["--no-progress", "--out", str(res), "--workers", "2"]
    )
    assert code == 0
    assert main([*cmd[3:], "--out", str(ref)]) == 0  # uninterrupted, serial
    got, want = _records(res), _records(ref)
    assert len(want["verify_bounds/instances.jsonl"]) == 60
    assert got == want
    report = json.loads((res / "verify_bounds" / "report.json").read_text())
    assert report["n_theorem_violations"] == 0 and not (res / LOCK_NAME).exists()


def _guarantees(root: Path, files) -> dict[str, Guarantees]:
    """What the real-data computation guarantees, per records file, from the run's manifest.

    ``tol`` and ``max_iter`` are the sweep's stored solver settings. The hidden states come from
    the model's forward pass in its own dtype (float32 here), which runs on the point's thread
    count: two thread counts order its inner products differently, each within ``gamma_K`` of
    the exact sum relative to the sum of magnitudes (Higham, Thm 3.1), so two evaluations within
    ``2 gamma_K``, ``K = 4 d`` the longest of them (GPT-2's MLP, ``n_inner = 4 n_embd``); the
    layer norm at the capture point keeps that relative. The radii are float64 row norms of
    those states (``2 gamma_{d+2}`` in float64 more). See tests/certified_records.py.
    """
    out = {}
    for name in files:
        path = Path(name)
        manifest = json.loads((root / path.parent / "manifest.json").read_text())
        sweep = manifest["sweeps"][path.stem]
        info, opts = sweep["layer_info"], sweep["options"]
        assert info["arch"] == "gpt2", "K = 4 d is GPT-2's MLP width"
        d, u = int(info["d"]), UNIT_ROUNDOFF[sweep["provenance"]["dtype"]]
        eval_rtol = 2 * gamma(4 * d, u) + 2 * gamma(d + 2, UNIT_ROUNDOFF["float64"])
        out[name] = Guarantees(tol=float(opts["tol"]), max_iter=opts["max_iter"],
                               eval_rtol=eval_rtol)  # fmt: skip
    return out


def _close(s: dict, d: dict, guarantees: dict[str, Guarantees]) -> None:
    """Same files, keys and non-float values; floats as the computation guarantees them.

    Brackets overlap, values agree to the solver's tolerance plus the evaluation margins,
    iteration counts and ``converged`` may differ, direct evaluations agree to their rounding
    (tests/certified_records.py). Only for runs whose thread counts differ: runs with the same
    ones compute the same floats and are compared for equality.
    """
    compare_runs(s, d, guarantees)


@pytest.mark.parametrize(
    "omp",
    [
        pytest.param(None, id="default-threads-capped"),
        pytest.param("2", id="explicit-omp", marks=pytest.mark.slow),
    ],
)
def test_real_data_thread_counts_on_two_workers(tmp_path: Path, omp) -> None:
    """The quick and paper presets run real_data with ``threads=None`` (the driver's count).

    Without OMP_NUM_THREADS, the local workers are capped at ``cpu_count // 2`` threads each
    (no oversubscription): where that is below the driver's count, the points run on other
    thread counts than the serial run, which is another computation (BLAS reductions in another
    order, the solver stopping a step apart): the records agree as far as the computation
    guarantees (``_close``), not bit for bit. With OMP_NUM_THREADS set, the user's choice is kept
    (no cap; the workers inherit it): the same thread counts, and the records are bit-identical.
    """
    _need_dask()
    import subprocess
    import sys

    env = {k: v for k, v in ENV.items() if not k.endswith("_NUM_THREADS")}  # torch's default
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    args = [sys.executable, "-m", "meanfield_cli", "experiment", "real_data", "--preset", "tiny"]
    args += ["--set", "threads=null", "--no-progress"]
    for out, extra in (("s", []), ("d", ["--workers", "2"])):
        subprocess.run([*args, "--out", str(tmp_path / out), *extra], env=env, check=True,
                       capture_output=True, timeout=600)  # fmt: skip
    s, d = _records(tmp_path / "s"), _records(tmp_path / "d")
    assert s and sum(len(v) for v in s.values()) >= 3
    if omp is not None:
        assert s == d  # the same thread counts: exact equality of every value, floats included
    else:
        _close(s, d, _guarantees(tmp_path / "s", s))
