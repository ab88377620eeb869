"""Inputs of the commands: parameter and token files, random heads and tokens.

Files are read with ``allow_pickle=False`` and checked (real numeric dtype, shape, finite values)
before anything reaches torch; every array is converted to float64 here, once. Bad input raises
a one-line ``ValueError`` (a missing file ``FileNotFoundError``). Random layers are drawn from a
``torch.Generator`` seeded with the given seed, so a seed names one layer on every machine.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .engine import NPY_READ_ERRORS, unreadable_array_file

__all__ = [
    "load_inputs",
    "load_matrices",
    "load_params_npz",
    "random_layer",
    "random_tokens",
]


def _array(z: Any, key: str, source: str, ndims: tuple[int, ...]) -> np.ndarray:
    try:
        a = np.asarray(z[key])
    except NPY_READ_ERRORS as err:  # members of an .npz are read (and may fail) only here
        if "pickle" in str(err).lower():
            raise ValueError(
                f"{key} in {source} holds pickled objects, which are never loaded"
            ) from err
        raise ValueError(
            f"cannot read {key} in {source}: the file is damaged ({' '.join(str(err).split())})"
        ) from err
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{key} in {source} must be a real numeric array, got dtype {a.dtype}")
    if a.ndim not in ndims:
        want = " or ".join(f"{k}-d" for k in ndims)
        raise ValueError(f"{key} in {source} must be {want}, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{key} in {source} is empty (shape {a.shape})")
    a = np.asarray(a, dtype=np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{key} in {source} contains NaN or infinite values")
    return a


def _np_load(path: Path) -> Any:
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a {path.suffix or 'data'} file")
    try:
        data = np.load(path, allow_pickle=False)
    except NPY_READ_ERRORS as err:
        raise unreadable_array_file(path, err) from err
    if path.suffix == ".npz" and not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"cannot read {path}: it holds one .npy array, not an .npz archive")
    if path.suffix != ".npz" and isinstance(data, np.lib.npyio.NpzFile):
        data.close()
        raise ValueError(f"cannot read {path}: it is an .npz archive, not an .npy array")
    return data


def load_inputs(path: str | Path) -> np.ndarray:
    """Tokens from a ``.npy`` file: shape (n, d) or (B, n, d), finite, never unpickled."""
    path = Path(path)
    if path.suffix != ".npy":
        raise ValueError(f"tokens must be a .npy file, got {path.name}")
    return _array({"X": _np_load(path)}, "X", path.name, (2, 3))


def load_matrices(path: str | Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a score matrix ``A`` (and optionally ``V``) from ``.npy`` or ``.npz``, never unpickling.

    A ``.npy`` file holds ``A`` itself; a ``.npz`` file holds an array ``A`` and optionally ``V``.
    ``A`` follows the toolkit's score convention ``x_i^T A x_j`` (query i, key j).
    """
    path = Path(path)
    if path.suffix not in (".npy", ".npz"):
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        raise ValueError(f"weights must be a .npy or .npz file, got {path.name}")
    if path.suffix == ".npy":
        A, V = _array({"A": _np_load(path)}, "A", path.name, (2,)), None
    else:
        with _np_load(path) as z:
            if "A" not in z.files:
                raise ValueError(f"{path} has no array 'A' (found: {', '.join(z.files) or 'none'})")
            A = _array(z, "A", path.name, (2,))
            V = _array(z, "V", path.name, (2,)) if "V" in z.files else None
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"A in {path.name} must be square, got shape {A.shape}")
    if V is not None and V.shape[1] != A.shape[0]:
        raise ValueError(f"V in {path.name} must have {A.shape[0]} columns, got shape {V.shape}")
    return A, V


def load_params_npz(path: str | Path, dtype: Any, device: str) -> tuple[Any, dict[str, Any]]:
    """A layer from a ``.npz`` of ``A``, optional ``V``, ``W_O``, ``b_O``, ``c``, ``b``.

    ``A`` of shape (d, d) is one head (an :class:`~meanfield.AttentionParams`, unless ``W_O`` is
    given); (H, d, d) is ``H`` heads (:class:`~meanfield.MultiHeadParams`, concatenated without
    ``W_O``). ``V`` defaults to the identity.
    """
    import torch

    from meanfield import AttentionParams, MultiHeadParams

    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"parameters must be a .npz file, got {path.name}")
    with _np_load(path) as z:
        if "A" not in z.files:
            raise ValueError(
                f"{path.name} has no array 'A' (found: {', '.join(z.files) or 'none'})"
            )
        unknown = sorted(set(z.files) - {"A", "V", "W_O", "b_O", "c", "b"})
        if unknown:
            raise ValueError(
                f"{path.name} has unknown arrays {unknown}; expected A, V, W_O, b_O, c, b"
            )
        A = _array(z, "A", path.name, (2, 3))
        single = A.ndim == 2
        A3 = A[None] if single else A
        H, d = A3.shape[0], A3.shape[-1]
        if A3.shape[1] != d:
            raise ValueError(f"A in {path.name} must be square per head, got shape {A.shape}")
        arrs = {
            k: _array(z, k, path.name, (1, 2, 3))
            for k in ("V", "W_O", "b_O", "c", "b")
            if k in z.files
        }
    V = arrs.get("V")
    V3 = np.broadcast_to(np.eye(d), (H, d, d)) if V is None else (V[None] if V.ndim == 2 else V)
    if V3.ndim != 3 or V3.shape[0] != H or V3.shape[2] != d:
        assert V is not None  # the default V3, identities of shape (H, d, d), always fits
        raise ValueError(
            f"V in {path.name} must have shape (d_v, {d}) or ({H}, d_v, {d}), got {V.shape}"
        )
    biases = {}  # c and b, one row per head
    for key, width in (("c", d), ("b", V3.shape[1])):
        if key in arrs:
            bias = arrs[key].reshape(1, -1) if arrs[key].ndim == 1 else arrs[key]
            if bias.shape != (H, width):
                raise ValueError(
                    f"{key} in {path.name} must have shape ({H}, {width}), got {arrs[key].shape}"
                )
            biases[key] = bias

    def t(a: np.ndarray | None) -> Any:
        return (
            None if a is None else torch.tensor(np.ascontiguousarray(a), dtype=dtype, device=device)
        )

    heads = [
        AttentionParams(t(A3[h]), t(V3[h]), **{k: t(v[h]) for k, v in biases.items()})
        for h in range(H)
    ]
    W_O, b_O = arrs.get("W_O"), arrs.get("b_O")
    if b_O is not None and W_O is None:
        raise ValueError(f"b_O in {path.name} needs W_O")
    if W_O is not None and W_O.ndim != 2:
        raise ValueError(f"W_O in {path.name} must be a matrix, got shape {W_O.shape}")
    if single and W_O is None:
        params: Any = heads[0]
    else:
        params = MultiHeadParams(tuple(heads), W_O=t(W_O), b_O=t(b_O))
    source = {
        "params": str(path),
        "n_heads": H,
        "d": d,
        "d_v": int(V3.shape[1]),
        "V": "identity" if V is None else "file",
        "W_O": W_O is not None,
    }
    return params, source


def random_layer(
    d: int, heads: int, seed: int, dtype: Any, device: str
) -> tuple[Any, dict[str, Any]]:
    """A random layer of width ``d`` drawn from ``seed`` (the one generator of random heads).

    One head: ``A`` with i.i.d. N(0, 1/d) entries (non-symmetric) and ``V = I``. Several heads:
    ``A_h`` and ``V_h`` with N(0, 1/d) entries and an output projection with N(0, 1/(H d))
    entries. Returns the parameters (in ``dtype`` on ``device``) and a description.
    """
    import torch

    from meanfield import AttentionParams, MultiHeadParams

    if d < 1:
        raise ValueError(f"the width d must be a positive integer, got {d}")
    if heads < 1:
        raise ValueError(f"the number of heads must be a positive integer, got {heads}")
    g = torch.Generator().manual_seed(int(seed))

    def randn(*shape: int) -> Any:
        return torch.randn(shape, generator=g, dtype=torch.float64)

    if heads == 1:
        A = randn(d, d) / math.sqrt(d)
        params: Any = AttentionParams(A, torch.eye(d, dtype=torch.float64))
        desc = {"A": "N(0, 1/d), non-symmetric", "V": "identity"}
    else:
        hs = [
            AttentionParams(randn(d, d) / math.sqrt(d), randn(d, d) / math.sqrt(d))
            for _ in range(heads)
        ]
        W_O = randn(d, heads * d) / math.sqrt(heads * d)
        params = MultiHeadParams(tuple(hs), W_O=W_O)
        desc = {"A": "N(0, 1/d), non-symmetric", "V": "N(0, 1/d)", "W_O": "N(0, 1/(H d))"}
    info = {"random_d": d, "heads": heads, "seed": seed, **desc}
    return params.to(dtype=dtype, device=device), info


def random_tokens(n: int, d: int, R: float, seed: int) -> np.ndarray:
    """``n`` Gaussian tokens rescaled so that the largest norm is ``R`` (seed ``seed + 1``)."""
    rng = np.random.default_rng(int(seed) + 1)
    Z = rng.standard_normal((n, d))
    return R * Z / np.linalg.norm(Z, axis=-1).max()
