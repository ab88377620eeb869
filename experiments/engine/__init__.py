"""The run engine of the experiments: resumable sweeps, executors, the cost model, results I/O.

This package is the engine's one door: the stages (``experiments/<stage>``), ``paper_figs``,
``meanfield_cli``, the benchmarks and the examples import from ``experiments.engine`` only. It
exports the names they use, with the types of those functions' arguments and results. Its
modules are private; from the bottom up, each imports only modules above it in this list
(``tests/project/test_layering.py`` checks it, imports inside functions included):

- ``_results``: atomic writes, JSON / JSONL / npz / CSV readers and writers, run metadata;
  ``_threads``: the torch and BLAS thread counts of a point, the cap of a worker;
  ``_progress``: :class:`CostProgress`, one progress tracker for a run;
  ``_lock``: the lock on an output directory. None imports another module of the engine.
- ``_keys``: :func:`config_hash` and :func:`point_key` (canonical JSON of ``_results``).
- ``_tasks``: the leaf types of a run, :class:`Task`, :class:`Outcome`, :class:`SweepJob`, and the
  default cost of a point.
- ``_cost_model``: what a point is expected to cost and where a run's time went (``_tasks``).
- ``_execution``: the executors (serial, Dask), the per-process cache of the workers and the
  driver of a queue, :func:`run_jobs` (``_tasks``, ``_cost_model``, ``_keys``, ``_results``,
  ``_threads``).
- ``_runner``: :class:`Sweep`, resumable, and a stage's rounds: :class:`Rounds`, the serial
  driver :func:`drive`, :func:`remote` (``_execution``, ``_progress``, ``_threads``,
  ``_keys``, ``_results``, ``_tasks``).
- ``_stage``: the contract of a stage (:class:`Stage`, :class:`StageRun`, :class:`ModuleStage`,
  :class:`Claims`), typed presets and :func:`preset_settings` (``_runner``).

The engine imports nothing else from ``experiments``: the stages are above it.
"""

from __future__ import annotations

from ._cost_model import (
    LOAD_BYTES_PER_SECOND,
    LOAD_SECONDS,
    LOAD_SECONDS_BASE,
    ExecutionTimes,
    loading,
    measured_rate,
    predict_figures_seconds,
    predict_profile,
    predict_stage_seconds,
    predict_wall_time,
)
from ._execution import (
    DaskExecutor,
    Executor,
    PointError,
    RunSummary,
    SerialExecutor,
    forget_worker_cache,
    make_executor,
    require_dask,
    run_jobs,
    worker_cache,
)
from ._keys import config_hash, point_key
from ._lock import LockHeldError, exclusive_run
from ._progress import CostProgress
from ._results import (
    NPY_READ_ERRORS,
    atomic_write_text,
    default_file_mode,
    finished_config,
    jsonable,
    load_json,
    load_jsonl,
    load_npz,
    record_float,
    run_metadata,
    save_npz,
    stage_result,
    unreadable_array_file,
    write_csv,
    write_json,
)
from ._runner import (
    Round,
    Rounds,
    Steps,
    Sweep,
    drive,
    joint_rounds,
    remote,
    reporting,
    threaded_rounds,
)
from ._stage import (
    Claim,
    Claims,
    ModuleStage,
    Names,
    Stage,
    StageConfig,
    StageRun,
    preset_settings,
)
from ._tasks import Outcome, SweepJob, Task
from ._threads import torch_threads

__all__ = [
    "LOAD_BYTES_PER_SECOND",
    "LOAD_SECONDS",
    "LOAD_SECONDS_BASE",
    "NPY_READ_ERRORS",
    "Claim",
    "Claims",
    "CostProgress",
    "DaskExecutor",
    "ExecutionTimes",
    "Executor",
    "LockHeldError",
    "ModuleStage",
    "Names",
    "Outcome",
    "PointError",
    "Round",
    "Rounds",
    "RunSummary",
    "SerialExecutor",
    "Stage",
    "Steps",
    "StageConfig",
    "StageRun",
    "Sweep",
    "SweepJob",
    "Task",
    "atomic_write_text",
    "config_hash",
    "default_file_mode",
    "drive",
    "exclusive_run",
    "finished_config",
    "forget_worker_cache",
    "joint_rounds",
    "jsonable",
    "load_json",
    "load_jsonl",
    "load_npz",
    "loading",
    "make_executor",
    "measured_rate",
    "point_key",
    "predict_figures_seconds",
    "predict_profile",
    "predict_stage_seconds",
    "predict_wall_time",
    "preset_settings",
    "record_float",
    "remote",
    "reporting",
    "require_dask",
    "run_jobs",
    "run_metadata",
    "save_npz",
    "stage_result",
    "threaded_rounds",
    "torch_threads",
    "unreadable_array_file",
    "worker_cache",
    "write_csv",
    "write_json",
]
