r"""Parallel efficiency of ``reproduce --workers W`` against a serial run of the same stages.

Reads two finished runs of ``meanfield reproduce`` (their ``reproduce.json`` and the records of
their sweeps) and prints, for the stages named by ``--only``:

* the serial wall time of those stages (the sum of their ``seconds`` in the serial run's
  ``reproduce.json``; the serial run may have run more stages, e.g. the whole paper preset) and
  the sum of its point times;
* the W-worker run's wall time, its warm-up (``execution.warmup_seconds``: the start of the
  cluster, the slowest worker's imports and the mean worker's model and text loads), the time
  spent in the queues and in the driver's own passes between them, and each worker's busy time;
* the speed-up and the parallel efficiency, with and without the warm-up:
  :math:`E = T_1 / (W\,(T_W - T_{\mathrm{warm}}))`, with :math:`T_1` the serial time without its
  own loads (the ``loaded ... in`` lines are not in the records, so ``--serial-loads`` gives
  them when known; default 0, which understates E);
* the cost model's prediction (docs/cluster.md, "Cost model"): the queue simulated by
  :func:`experiments.engine.predict_wall_time` on the point times of either run (each
  point's seconds as its cost, rate 1), plus the measured warm-up and driver time.

The records of both runs are also compared, timings aside: the speed-up means nothing unless
they are identical.

Usage::

    .venv/bin/python benchmarks/workers_efficiency.py SERIAL_OUT PARALLEL_OUT \
        --only adversarial,synthetic,verify_bounds,attacks,kim_tightness [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.engine import load_json, load_jsonl, predict_wall_time  # noqa: E402


def _records(results: Path, stages: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``file -> key -> record`` for every JSONL file of ``stages``."""
    out = {}
    for stage in stages:
        for path in sorted((results / stage).rglob("*.jsonl")):
            out[str(path.relative_to(results))] = {r["key"]: r for r in load_jsonl(path)}
    return out


def _results(r: dict[str, Any]) -> dict[str, Any]:
    """The record ``r`` without its times (the keys that start with ``seconds``)."""
    return {k: v for k, v in r.items() if not k.startswith("seconds")}


def analyse(serial: Path, parallel: Path, stages: list[str], serial_loads: float) -> dict:
    """The measurement of one serial and one W-worker run (see the module docstring)."""
    s_doc, p_doc = load_json(serial / "reproduce.json"), load_json(parallel / "reproduce.json")
    ex = p_doc.get("execution") or {}
    workers = int(ex.get("workers") or 1)
    t1 = sum(float(s_doc["stages"][s]["seconds"]) for s in stages)
    tw = float(p_doc["experiments_seconds"])
    warm = float(ex.get("warmup_seconds", 0.0))
    queue = float(ex.get("queue_seconds", tw))
    s_rec = _records(serial / "results", stages)
    p_rec = _records(parallel / "results", stages)
    identical = s_rec.keys() == p_rec.keys() and all(
        s_rec[f].keys() == p_rec[f].keys()
        and all(_results(s_rec[f][k]) == _results(p_rec[f][k]) for k in s_rec[f])
        for f in s_rec
    )
    s_points = [float(r["seconds"]) for f in s_rec.values() for r in f.values()]
    p_points = [float(r["seconds"]) for f in p_rec.values() for r in f.values()]
    driver = tw - queue  # the stages' own passes in the driver, between and after the queues
    per_worker = ex.get("per_worker", {})
    loads = [float(w["load_seconds"]) for w in per_worker.values()]
    mean_load = sum(loads) / len(loads) if loads else 0.0
    pred = {}
    # the workers' loads are part of their own point times already: count them once
    for name, pts, inside in (
        ("serial_points", s_points, 0.0),
        ("own_points", p_points, mean_load),
    ):
        sim = predict_wall_time(pts, workers, 1.0, warmup=warm + driver - inside)
        pred[name] = {k: sim[k] for k in ("wall", "work", "tail")}
    t1_net = t1 - serial_loads
    return {
        "stages": stages,
        "workers": workers,
        "records_identical": identical,
        "points": len(s_points),
        "serial": {
            "wall": t1,
            "point_seconds": sum(s_points),
            "loads": serial_loads,
            "per_stage": {s: float(s_doc["stages"][s]["seconds"]) for s in stages},
        },
        "parallel": {
            "wall": tw,
            "warmup": warm,
            "start": float(ex.get("start_seconds", 0.0)),
            "imports": ex.get("import_seconds", {}),
            "queue": queue,
            "driver": driver,
            "rounds": ex.get("rounds"),
            "point_seconds": sum(p_points),
            "per_worker": per_worker,
        },
        "speedup": t1 / tw,
        "efficiency_with_warmup": t1 / (workers * tw),
        "efficiency_without_warmup": t1_net / (workers * (tw - warm)),
        "prediction": pred,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("serial", type=Path, help="output directory of the serial reproduce run")
    ap.add_argument("parallel", type=Path, help="output directory of the --workers run")
    ap.add_argument("--only", required=True, help="comma-separated stages of the comparison")
    ap.add_argument("--serial-loads", type=float, default=0.0, help="serial model loads, s")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    doc = analyse(args.serial, args.parallel, args.only.split(","), args.serial_loads)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    s, p = doc["serial"], doc["parallel"]
    print(
        f"stages: {', '.join(doc['stages'])}; {doc['points']} points; "
        f"records identical: {doc['records_identical']}"
    )
    print(f"serial: {s['wall']:.0f} s wall ({s['point_seconds']:.0f} s in points)")
    print(
        f"{doc['workers']} workers: {p['wall']:.0f} s wall = warm-up {p['warmup']:.1f} s "
        f"(start {p['start']:.1f} s) ... queues {p['queue']:.0f} s in {p['rounds']} round(s), "
        f"driver {p['driver']:.1f} s; {p['point_seconds']:.0f} s in points"
    )
    for w, v in p["per_worker"].items():
        print(
            f"  {w}: {v['tasks']} tasks, {v['seconds']:.0f} s busy, {v['load_seconds']:.1f} s loading"
        )
    print(
        f"speed-up {doc['speedup']:.2f}; efficiency {doc['efficiency_with_warmup']:.2f} "
        f"with the warm-up, {doc['efficiency_without_warmup']:.2f} without"
    )
    for name, v in doc["prediction"].items():
        print(
            f"predicted from the {name.replace('_', ' ')}: {v['wall']:.0f} s "
            f"(work {v['work']:.0f} s, tail {v['tail']:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
