"""Results I/O: atomic writes, run metadata, JSON/npz/CSV readers used by ``paper_figs``.

Every file is written to a temporary sibling and renamed into place, so an interrupted run never
leaves a half-written file. No pickle anywhere: arrays go to ``.npz`` (loaded with
``allow_pickle=False``) and everything else to JSON or CSV.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import io
import json
import logging
import math
import os
import platform
import subprocess
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "NPY_READ_ERRORS",
    "SCHEMA_VERSION",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_text",
    "default_file_mode",
    "finished_config",
    "jsonable",
    "load_json",
    "load_jsonl",
    "load_npz",
    "record_float",
    "run_metadata",
    "save_npz",
    "stage_result",
    "unreadable_array_file",
    "write_csv",
    "write_json",
]

SCHEMA_VERSION = 1


def default_file_mode() -> int:
    """Mode of a new regular file under the current umask (``mkstemp`` would give 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename.

    The file gets the permissions of an ordinary new file (0o666 minus the umask), not the
    owner-only mode of the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), default_file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomic text write (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values: arrays and tensors as lists, non-finite floats as strings.

    NaN becomes ``None``, infinities ``"inf"`` / ``"-inf"``, paths strings, mapping keys strings.
    """
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None if np.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if hasattr(obj, "tolist"):  # torch tensors without importing torch here
        return jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def record_float(x: Any) -> float:
    """A float as :func:`write_json` and :func:`append_jsonl` stored it, back as a float.

    The inverse of their encoding of non-finite floats: ``None`` is NaN, ``"inf"`` and ``"-inf"``
    are infinities (any other string is NaN); numbers are converted with ``float``.
    """
    if isinstance(x, str):
        return {"inf": math.inf, "-inf": -math.inf}.get(x, math.nan)
    return math.nan if x is None else float(x)


def write_json(path: str | os.PathLike, obj: Mapping[str, Any]) -> Path:
    """Atomically write a JSON document (numpy and torch values converted)."""
    return atomic_write_text(path, json.dumps(jsonable(obj), indent=2, sort_keys=False) + "\n")


def load_json(path: str | os.PathLike) -> dict[str, Any]:
    """Read a JSON document."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def append_jsonl(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Append one record as a single line, flushed and fsynced (a crash loses at most this line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(jsonable(record), sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def load_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read records written by :func:`append_jsonl`, ignoring a torn last line."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: that record is simply not finished
    return records


def save_npz(path: str | os.PathLike, **arrays: Any) -> Path:
    """Atomically write compressed arrays (``None`` values are skipped; object arrays refused)."""
    converted = {
        k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)  # torch tensors
        for k, v in arrays.items()
        if v is not None
    }
    for k, v in converted.items():
        if v.dtype == object:
            raise ValueError(f"array {k!r} has dtype object, which would need pickle")
    buf = io.BytesIO()
    # numpy's stub is savez_compressed(file, *args, allow_pickle: bool, **kwds: ArrayLike), and mypy
    # matches a ``**dict`` against allow_pickle as well; these keys are array names, all for **kwds.
    members: dict[str, Any] = converted
    np.savez_compressed(buf, **members)
    return atomic_write_bytes(path, buf.getvalue())


#: What reading a damaged ``.npy``/``.npz`` raises (a bad zip, a truncated or corrupt member).
NPY_READ_ERRORS = (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)


def unreadable_array_file(path: str | os.PathLike, err: BaseException) -> ValueError:
    """A one-line ``ValueError`` naming ``path`` for an error ``err`` raised while reading it.

    It says what is wrong with the file (not an ``.npy``/``.npz`` file, a damaged archive, pickled
    objects, which are never loaded) and never suggests loading it with pickle.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except OSError:
        head = b""
    message = " ".join(str(err).split())
    if not head:
        why = "it is empty"
    elif head[:1] == b"\x80":
        why = "it is a pickle, which is never loaded"
    elif not (head.startswith(b"\x93NUMPY") or head.startswith(b"PK")):
        why = "it is not an .npy or .npz file"
    elif "pickle" in message.lower():
        why = "it holds pickled objects, which are never loaded"
    else:
        why = f"the file is damaged ({message or type(err).__name__})"
    return ValueError(f"cannot read {path}: {why}")


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read arrays written by :func:`save_npz` (never unpickles).

    A missing file raises ``FileNotFoundError``; a damaged one a one-line ``ValueError`` naming it.
    """
    arrays = None
    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                arrays = {k: data[k] for k in data.files}
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except NPY_READ_ERRORS as err:
        raise unreadable_array_file(path, err) from err
    if arrays is None:
        raise ValueError(f"cannot read {path}: it holds one .npy array, not an .npz archive")
    return arrays


def stage_result(results_dir: str | os.PathLike, stage: str, name: str) -> Path:
    """The path of the result ``name`` of ``stage``; ``FileNotFoundError`` naming the stage if absent.

    How a figure or a report finds what a stage wrote: ``results_dir / stage / name``.
    """
    path = Path(results_dir) / stage / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the {stage!r} experiment first")
    return path


def finished_config(json_path: str | os.PathLike) -> dict[str, Any] | None:
    """The settings recorded with a finished result: ``<stem>.json`` beside ``<stem>.npz``.

    ``None`` when either file is missing, or when one cannot be read: that is logged, and the
    caller computes the result again. Each stage decides which recorded settings must match.
    """
    json_path = Path(json_path)
    npz_path = json_path.with_suffix(".npz")
    if not (json_path.exists() and npz_path.exists()):
        return None
    try:
        recorded = load_json(json_path)["metadata"]["config"] or {}
        load_npz(npz_path)
    except (KeyError, TypeError, ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        logging.getLogger(__name__).warning(
            "%s: unreadable result (%s: %s); computing it again",
            json_path.with_suffix(""),
            type(err).__name__,
            " ".join(str(err).split()),
        )
        return None
    return dict(recorded)


def write_csv(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Atomically write long-format CSV; columns are the union of keys in order of appearance."""
    rows = [dict(r) for r in rows]
    fields: list[str] = []
    for r in rows:
        fields.extend(k for k in r if k not in fields)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(jsonable(r) for r in rows)
    return atomic_write_text(path, buf.getvalue())


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run_metadata(
    *,
    seed: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Provenance recorded in every result: versions, device, dtype, git commit, seed, time."""
    from importlib import metadata

    import torch  # local: paper_figs reads results without importing torch

    versions = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
    }
    for name in ("scipy", "sympy", "pot", "transformers"):  # installed versions, not imported
        with contextlib.suppress(metadata.PackageNotFoundError):  # absent: not recorded
            versions[name] = metadata.version({"pot": "POT"}.get(name, name))
    import meanfield

    versions["meanfield"] = meanfield.__version__
    device_name = device
    if device is not None and device.startswith("cuda") and torch.cuda.is_available():
        device_name = f"{device} ({torch.cuda.get_device_name()})"
    return {
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "versions": versions,
        "platform": platform.platform(),
        "device": device_name,
        "dtype": dtype,
        "seed": seed,
        "config": dict(config) if config is not None else None,
    }
