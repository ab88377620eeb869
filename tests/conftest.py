"""Shared fixtures: seeded generators, float64 reference, devices, headless plotting."""

from __future__ import annotations

import os

# Before torch loads; see meanfield_cli/main.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Hypothesis profiles. "ci" replays the same examples on every run (derandomize, no example
# database), so a red CI is reproducible and a green one stays green; it is loaded when the CI
# environment variable is set (as .ci/run's caller does). "dev", the local default, draws fresh
# examples each run and remembers failures in .hypothesis/, so local runs keep exploring.
# Per-test @settings (max_examples, deadline) override the profile field by field.
settings.register_profile(
    "ci",
    parent=settings.get_profile("default"),
    derandomize=True,
    deadline=None,  # timing on shared CI cores is no test result
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# "dev" is Hypothesis' own default, named; its parent is explicit because recent Hypothesis
# versions switch the default to a built-in "ci" profile when they detect CI themselves.
settings.register_profile("dev", parent=settings.get_profile("default"))
_ON_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _ON_CI else "dev"))

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded numpy generator (fresh per test)."""
    return np.random.default_rng(20240613)


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded torch CPU generator (fresh per test)."""
    return torch.Generator().manual_seed(20240613)


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for the test, restored afterwards.

    Tiny dense problems run much faster on one thread; modules of such tests use it with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def run_tiny(tmp_path_factory: pytest.TempPathFactory):
    """``run_tiny(stage, name, **options)``: an experiment stage's tiny preset, run once.

    The stage (``experiments.real_data``, ``experiments.synthetic``, ...) writes into a fresh
    results root named after ``name``; returns the root and the files ``stage.run`` returned.
    Module fixtures call it so that a test module runs its stage once.
    """

    def run(stage, name: str, **options):
        root = tmp_path_factory.mktemp(name)
        return root, stage.run(root, "tiny", progress=False, **options)

    return run


@pytest.fixture
def cli_json(capsys: pytest.CaptureFixture[str]):
    """``cli_json(*argv)``: ``meanfield *argv --json`` run in-process, exit 0 asserted, its JSON."""
    import json

    from meanfield_cli.main import main

    def run(*argv: str) -> dict:
        assert main([*argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    return run


@pytest.fixture(scope="module")
def dask_by_value(request: pytest.FixtureRequest):
    """Skip without Dask; otherwise Dask workers get the test module's functions by value.

    Test modules are imported by path (``--import-mode=importlib``), so a worker could not
    import a task function defined in one by name. Registered for the rest of the module.
    """
    from experiments.engine import require_dask

    try:
        require_dask()
    except ImportError:
        pytest.skip("Dask is not installed (the optional extra meanfield[dist])")
    import cloudpickle

    cloudpickle.register_pickle_by_value(request.module)
    yield
    cloudpickle.unregister_pickle_by_value(request.module)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """CPU always; CUDA too when present."""
    return torch.device(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests when no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
