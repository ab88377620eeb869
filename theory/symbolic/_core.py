"""The :class:`Derivation` record and the sympy helpers shared by the derivations.

A private module of :mod:`theory.symbolic`: the helpers the derivation modules import have no
underscore; :class:`Derivation` is exported by the package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import sympy as sp

from theory import _symbols as S


@dataclass(frozen=True)
class Derivation:
    """Result of a symbolic derivation.

    Attributes
    ----------
    name : str
        What was derived.
    expr : sympy.Expr
        The derived closed form.
    latex : str
        LaTeX of ``expr`` in the notation of docs/theory.md.
    func : callable
        Numeric version of ``expr`` (numpy/scipy, broadcasting, real part), taking ``args``.
    args : tuple of sympy.Symbol
        Argument order of ``func``.
    steps : tuple of str
        The derivation, one step per entry.
    extras : Mapping[str, sympy.Expr]
        Named intermediate or companion expressions (read-only).
    """

    name: str
    expr: sp.Expr
    latex: str
    func: Callable[..., Any]
    args: tuple[sp.Symbol, ...]
    steps: tuple[str, ...]
    extras: Mapping[str, sp.Expr] = field(default_factory=lambda: MappingProxyType({}))

    def lambdify(self, name: str, args: Sequence[sp.Symbol]) -> Callable[..., Any]:
        """Numeric callable of ``extras[name]`` with the given argument symbols.

        Parameters
        ----------
        name : str
            Key of :attr:`extras`.
        args : sequence of sympy.Symbol
            Argument order.

        Returns
        -------
        callable
            numpy/scipy function returning the real part.
        """
        return _numeric(self.extras[name], tuple(args))


def _numeric(expr: sp.Expr, args: tuple[sp.Symbol, ...]) -> Callable[..., Any]:
    raw = sp.lambdify(args, expr, modules=["scipy", "numpy"])

    def func(*values: Any) -> Any:
        return np.real(raw(*values))

    return func


def make_derivation(
    name: str,
    expr: sp.Expr,
    args: Sequence[sp.Symbol],
    steps: Sequence[str],
    extras: Mapping[str, sp.Expr] | None = None,
) -> Derivation:
    return Derivation(
        name=name,
        expr=expr,
        latex=sp.latex(expr, symbol_names=S.LATEX_NAMES),
        func=_numeric(expr, tuple(args)),
        args=tuple(args),
        steps=tuple(steps),
        extras=MappingProxyType(dict(extras or {})),
    )


def check_equal(derived: sp.Expr, stated: sp.Expr, what: str) -> None:
    """Raise if the derived expression differs from the stated closed form."""
    if sp.simplify(derived - stated) != 0:
        raise RuntimeError(f"{what}: derived {derived} differs from stated {stated}")


def exp_lambertw(expr: sp.Expr) -> sp.Expr:
    """Rewrite ``exp(c*W(z) + r)`` as ``exp(r) * (z / W(z))**c`` (from ``W e^W = z``)."""

    def has_w_term(e: sp.Basic) -> bool:
        return isinstance(e, sp.exp) and e.has(sp.LambertW)

    def repl(e: sp.exp) -> sp.Expr:
        arg = sp.expand(e.args[0])
        for term in sp.Add.make_args(arg):
            coeff, rest = term.as_coeff_Mul()
            if isinstance(rest, sp.LambertW) and len(rest.args) == 1 and coeff.is_Integer:
                z = rest.args[0]
                return sp.exp(arg - term) * (z / rest) ** coeff
        return e

    return expr.replace(has_w_term, repl)


def unique_solution(equation: sp.Expr, var: sp.Symbol, what: str) -> sp.Expr:
    """The one solution of ``equation = 0`` for ``var`` (raise, naming ``what``, if not one)."""
    sols = sp.solve(equation, var)
    if len(sols) != 1:
        raise RuntimeError(f"{what}: {sols}")
    return sols[0]


def stationary_points(expr: sp.Expr, var: sp.Symbol) -> tuple[sp.Expr, list[sp.Expr]]:
    """Numerator of d expr / d var (factored) and its solutions."""
    num = sp.factor(sp.numer(sp.together(sp.diff(expr, var))))
    return num, sp.solve(num, var)


def solve_or_numeric(
    equation: sp.Expr, var: sp.Symbol, params: Sequence[sp.Symbol], bracket: tuple[float, float]
) -> tuple[sp.Expr | None, Callable[..., Any], str]:
    """Solve ``equation = 0`` for ``var``: closed form if sympy finds one, numeric root otherwise.

    Returns ``(expr or None, callable of params, "closed form" | "numeric root")``. The numeric
    path uses :func:`scipy.optimize.brentq` on ``bracket`` element by element.
    """
    try:
        sols = sp.solve(equation, var)
    except NotImplementedError:
        sols = []
    real_sols = [sol for sol in sols if sol.is_real is not False]
    if len(real_sols) == 1:
        return real_sols[0], _numeric(real_sols[0], tuple(params)), "closed form"
    from scipy.optimize import brentq

    f = sp.lambdify((var, *params), equation, modules=["scipy", "numpy"])

    def residual(z: float, *vals: Any) -> float:
        return float(np.real(f(z, *vals)))

    def root(*values: Any) -> Any:
        arrays = np.broadcast_arrays(*[np.asarray(v, dtype=float) for v in values])
        shape = arrays[0].shape if arrays else ()
        out = np.empty(shape)
        for idx in np.ndindex(shape):
            out[idx] = brentq(residual, *bracket, args=tuple(a[idx] for a in arrays), xtol=1e-14)
        return out[()]

    return None, root, "numeric root"
