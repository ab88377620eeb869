"""Progress lines of a long ``local_lipschitz`` run (logger ``meanfield.lipschitz``).

The lines are read from what the solver computes anyway, so an estimate must be the same bit for
bit with logging on or off; a quick estimate must stay silent at INFO; and the width a line
predicts must cross the target exactly where the width rule stops the run.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch

import meanfield.lipschitz._solve as solve_mod
from meanfield import MultiHeadParams, local_lipschitz
from meanfield._spectral import lanczos_svd, observe_steps, power_iteration

from ..tolerances import PRINTED_WIDTH, RITZ_PRINTED

LOGGER = "meanfield.lipschitz"
STEP = re.compile(
    r"^local_lipschitz (lanczos|power|self term): (\d+)/(\d+) products, ritz (\S+), "
    r"(width|residual) (\S+) \((?:target|tol) (\S+)\), (\S+) s$"
)
END = re.compile(
    r"^local_lipschitz done: stop=(\w+), (\d+) products, value (\S+), (width|residual) (\S+) "
    r"\((?:target|tol) (\S+)\), converged=(True|False), (\S+) s$"
)


def _layer(n: int = 64, d: int = 16, heads: int = 2, batch: tuple[int, ...] = ()):
    g = torch.Generator().manual_seed(3)
    W_Q, W_K, W_V = (torch.randn(d, d, generator=g, dtype=torch.float64) for _ in range(3))
    params = MultiHeadParams.from_qkv(W_Q, W_K, W_V, n_heads=heads)
    X = torch.randn(batch + (n, d), generator=g, dtype=torch.float64)
    return X, params


def _lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def _same(a, b) -> None:
    """Every tensor field of two estimates equal bit for bit."""
    for name in ("value", "lower", "upper", "upper_prob", "n_matvec", "n_iter", "residual"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name
    assert torch.equal(a.vector, b.vector)
    assert torch.equal(a.converged, b.converged)
    assert a.stop_rule == b.stop_rule
    if a.history is not None:
        assert torch.equal(a.history, b.history)


def test_width_run_logs_start_progress_and_end(caplog, monkeypatch):
    X, params = _layer()
    monkeypatch.setattr(solve_mod, "PROGRESS_INTERVAL", 0.0)
    caplog.set_level(logging.INFO, logger=LOGGER)
    est = local_lipschitz(X, params, method="lanczos")
    lines = _lines(caplog)
    assert all("\n" not in line for line in lines)
    assert est.stop_rule == "width"
    start = lines[0]
    for part in ("start:", "n=64", "d=16", "heads=2", "dtype=float64", "method=lanczos"):
        assert part in start, (part, start)
    assert "rule=width<=1.05" in start and "path=" in start

    steps = [STEP.match(line) for line in lines[1:-1]]
    assert steps and all(m is not None for m in steps), lines
    products = [int(m.group(2)) for m in steps]
    assert products == sorted(set(products)) and products[-1] <= int(est.n_matvec)
    assert all(int(m.group(3)) == 602 for m in steps)  # 2 * 300 steps + the final check
    # the Ritz values rise to the estimate (Lanczos from one start: monotone)
    ritz = [float(m.group(4)) for m in steps]
    assert ritz == sorted(ritz)
    assert ritz[-1] == pytest.approx(float(est.value), rel=RITZ_PRINTED)
    # the predicted width crosses the target exactly at the step where the rule stops the run
    assert all(m.group(5) == "width" for m in steps)
    widths = [float(m.group(6)) for m in steps]
    assert all(w > 1.05 for w in widths[:-1]) and widths[-1] <= 1.05, widths

    end = END.match(lines[-1])
    assert end is not None, lines[-1]
    assert end.group(1) == "width"
    assert int(end.group(2)) == int(est.n_matvec)
    assert end.group(3) == f"{float(est.value):.6g}"
    assert end.group(7) == str(bool(est.converged))
    # the predicted width is the certified bracket's (up to the 4 digits printed)
    ratio = float(est.upper_prob) / float(est.lower)
    assert float(end.group(5)) == pytest.approx(ratio, rel=PRINTED_WIDTH)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"method": "lanczos"},
        {"method": "lanczos", "tol": 1e-9, "krylov_dim": 8},  # residual rule, restarts
        {"method": "power", "max_iter": 25},
        # the width cycle, then a restarted continuation on the residual rule
        {"method": "lanczos", "prob_rtol": 0.5, "tol": 1e-15, "krylov_dim": 4, "max_iter": 24},
    ],
    ids=["width", "residual-restarts", "power", "width-continued"],
)
def test_logging_leaves_the_estimate_bit_identical(caplog, monkeypatch, kwargs):
    X, params = _layer(batch=(2,))
    calls = [0]
    flat_ops = solve_mod.flat_ops

    def counted_ops(*args, **kw):  # every Jacobian product the solver asks for
        ops = flat_ops(*args, **kw)

        def count(op):
            def f(x):
                calls[0] += 1
                return op(x)

            return f

        return tuple(count(op) for op in ops)

    monkeypatch.setattr(solve_mod, "flat_ops", counted_ops)
    assert not logging.getLogger(LOGGER).isEnabledFor(logging.INFO)  # off: nothing watched
    quiet = local_lipschitz(X, params, **kwargs)
    quiet_calls, calls[0] = calls[0], 0
    monkeypatch.setattr(solve_mod, "PROGRESS_INTERVAL", 0.0)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    loud = local_lipschitz(X, params, **kwargs)
    assert calls[0] == quiet_calls > 0  # no product added for the lines
    lines = _lines(caplog)
    assert len(lines) >= 3 and "start:" in lines[0] and "batch=2" in lines[0]
    assert lines[-1].startswith("local_lipschitz done:")
    assert sum(STEP.match(line) is not None for line in lines) >= 1
    _same(quiet, loud)


def test_continuation_reports_residual_after_the_width_cycle(caplog, monkeypatch):
    X, params = _layer()
    monkeypatch.setattr(solve_mod, "PROGRESS_INTERVAL", 0.0)
    caplog.set_level(logging.INFO, logger=LOGGER)
    # the width is met within the first cycle, a residual of 1e-15 is not (tol given: both are
    # required): the run continues, restarted, on the residual rule
    est = local_lipschitz(
        X, params, method="lanczos", prob_rtol=0.5, tol=1e-15, krylov_dim=4, max_iter=24
    )
    kinds = [m.group(5) for m in map(STEP.match, _lines(caplog)) if m is not None]
    assert "width" in kinds and "residual" in kinds
    assert kinds.index("residual") > max(i for i, k in enumerate(kinds) if k == "width")
    assert est.stop_rule == "width"


def test_split_self_term_is_reported_and_unchanged(caplog, monkeypatch):
    X, params = _layer(n=24, d=8)
    monkeypatch.setattr(solve_mod, "_EXPLICIT_SELF_FLOPS", 0)  # per-atom Lanczos self term
    quiet = local_lipschitz(X, params, geometry="split", method="lanczos")
    monkeypatch.setattr(solve_mod, "PROGRESS_INTERVAL", 0.0)
    caplog.set_level(logging.INFO, logger=LOGGER)
    loud = local_lipschitz(X, params, geometry="split", method="lanczos")
    _same(quiet, loud)
    assert torch.equal(quiet.self_value, loud.self_value)
    phases = [m.group(1) for m in map(STEP.match, _lines(caplog)) if m is not None]
    assert phases[0] == "self term" and phases[-1] == "lanczos"
    end = END.match(_lines(caplog)[-1])
    assert end is not None and end.group(3) == f"{float(loud.value):.6g}"
    assert int(end.group(2)) == int(loud.n_matvec)


def test_quick_estimate_is_silent_at_info(caplog):
    assert solve_mod.PROGRESS_INTERVAL >= 1.0
    X, params = _layer(n=16, d=8)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    est = local_lipschitz(X, params, method="lanczos")
    assert _lines(caplog, logging.INFO) == []
    debug = _lines(caplog, logging.DEBUG)
    assert len(debug) == 2, debug  # the start and end lines only
    assert debug[0].startswith("local_lipschitz start:")
    end = END.match(debug[1])
    assert end is not None and end.group(3) == f"{float(est.value):.6g}"


def test_lines_are_spaced_by_the_interval(caplog, monkeypatch):
    clock = iter(float(t) for t in range(10_000))  # one second per reading
    monkeypatch.setattr(solve_mod, "_clock", lambda: next(clock))
    monkeypatch.setattr(solve_mod, "PROGRESS_INTERVAL", 3.0)
    X, params = _layer()
    caplog.set_level(logging.INFO, logger=LOGGER)
    est = local_lipschitz(X, params, method="lanczos", tol=1e-10)
    steps = [m for m in map(STEP.match, _lines(caplog)) if m is not None]
    elapsed = [float(m.group(8)) for m in steps]
    assert len(steps) >= 2
    assert all(b - a >= 3.0 for a, b in zip(elapsed, elapsed[1:], strict=False))
    assert len(steps) < int(est.n_iter)  # fewer lines than steps
    assert _lines(caplog)[0].startswith("local_lipschitz start:")  # once, at INFO
    assert sum(line.startswith("local_lipschitz start:") for line in _lines(caplog)) == 1


@pytest.mark.parametrize("solver", [lanczos_svd, power_iteration])
def test_observe_steps_sees_each_step_and_changes_nothing(solver):
    g = torch.Generator().manual_seed(0)
    J = torch.randn(3, 40, 30, generator=g, dtype=torch.float64)
    x0 = torch.randn(3, 30, generator=g, dtype=torch.float64)

    def mv(v):
        return (J @ v.unsqueeze(-1)).squeeze(-1)

    def rmv(u):
        return (J.mT @ u.unsqueeze(-1)).squeeze(-1)

    kwargs = {"tol": 1e-10, "max_iter": 200}
    plain = solver(mv, rmv, x0, **kwargs)
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    with observe_steps(lambda s, r, done: seen.append((s.clone(), r.clone(), done.clone()))):
        watched = solver(mv, rmv, x0, **kwargs)
    with observe_steps(None):  # nested: nothing watched inside, the outer observer restored
        solver(mv, rmv, x0, **kwargs)
    assert len(seen) == plain.history.shape[0]
    for name in ("sigma", "vector", "residual", "converged", "n_iter", "n_matvec", "history"):
        assert torch.equal(getattr(plain, name), getattr(watched, name)), name
    # the observer saw the history and the stopping rule as it was met
    assert torch.equal(torch.stack([s for s, _, _ in seen]), plain.history)
    assert bool(seen[-1][2].all()) == bool(plain.converged.all())
    s, r, done = seen[-1]
    assert bool((r[done] <= kwargs["tol"] * s[done].square()).all())


def test_package_logger_has_a_null_handler():
    handlers = logging.getLogger("meanfield").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
