"""Compare two ``results/`` directories of ``meanfield reproduce`` field by field.

Used to check that a refactoring keeps every result: run ``make demo`` (or ``meanfield reproduce
--preset quick --out A``) before and after, then::

    python benchmarks/compare_runs.py A/results B/results

Every file under the two directories is matched by its relative path:

- ``.jsonl`` records are matched by their ``key`` (the hash of a point's parameters) and, where
  the keys differ (a change of the settings' hashing), by the point's parameters: the record
  without its result fields;
- ``.json`` documents and every record are compared key by key, recursively;
- ``.npz`` archives array by array, dtype and shape included;
- ``.csv`` files row by row.

Numbers must be equal (bit-identical, NaN equal to NaN) unless ``--rtol`` is given. Fields that
describe the run rather than its results are skipped: times (any key containing ``seconds`` or
``time``), dates, hosts, versions, commits, paths, the ``metadata``/``execution`` blocks, and
the hashes ``key``/``config_hash`` (once records are matched, their parameters are compared);
the paths of installed packages are compared from ``site-packages/`` on (two clones have two
virtual environments).
Prints one line per difference (at most ``--max-lines``) and a summary; exit status 1 when
anything differs or is missing on one side.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: Keys skipped at any depth: they describe the run, not its results.
SKIPPED_KEYS = frozenset(
    "metadata execution created started finished host hostname versions git_commit git_dirty "
    "python platform path paths records history pid".split()
    # hashes of a point's or a sweep's settings: the issue allows them to change with the
    # settings' hashing; the parameters they hash are compared themselves
    + ["key", "config_hash"]
)


def _skipped(key: str) -> bool:
    return key in SKIPPED_KEYS or "seconds" in key or "time" in key


_SITE = re.compile(r"\S*[/\\]site-packages[/\\]")


def _installed(text: str) -> str:
    """``text`` with the paths of installed packages cut to what follows ``site-packages/``."""
    return _SITE.sub("<site-packages>/", text)


def _same_number(a: float, b: float, rtol: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))


def diff(a: Any, b: Any, where: str, rtol: float) -> Iterator[str]:
    """Lines naming every difference between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if _skipped(str(k)):
                continue
            if k not in a or k not in b:
                yield f"{where}.{k}: only in {'B' if k not in a else 'A'}"
                continue
            yield from diff(a[k], b[k], f"{where}.{k}", rtol)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{where}: length {len(a)} != {len(b)}"
            return
        for i, (x, y) in enumerate(zip(a, b)):
            yield from diff(x, y, f"{where}[{i}]", rtol)
    elif isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        if a != b:
            yield f"{where}: {a!r} != {b!r}"
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if not _same_number(float(a), float(b), rtol):
            yield f"{where}: {a!r} != {b!r}"
    elif isinstance(a, str) and isinstance(b, str):
        if _installed(a) != _installed(b):
            yield f"{where}: {a!r} != {b!r}"
    elif a != b:
        yield f"{where}: {a!r} != {b!r}"


#: Result fields of a record, left out of the identity used to match records across keys.
_RESULT_HINTS = ("value", "lower", "upper", "bound", "residual", "converged", "n_matvec", "n_iter")


def _identity(rec: dict[str, Any]) -> str:
    ident = {
        k: v
        for k, v in rec.items()
        if not _skipped(k) and not k.startswith(_RESULT_HINTS) and not isinstance(v, list)
    }
    return json.dumps(ident, sort_keys=True, default=str)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_jsonl(a: Path, b: Path, name: str, rtol: float) -> Iterator[str]:
    ra, rb = _jsonl(a), _jsonl(b)
    by_key_b = {r.get("key"): r for r in rb}
    by_id_b = {_identity(r): r for r in rb}
    matched: set[int] = set()
    for r in ra:
        other = by_key_b.get(r.get("key")) if r.get("key") is not None else None
        if other is None:
            other = by_id_b.get(_identity(r))
        if other is None:
            yield f"{name}: record {r.get('key')} only in A"
            continue
        matched.add(id(other))
        yield from diff(r, other, f"{name}[{r.get('key')}]", rtol)
    for r in rb:
        if id(r) not in matched:
            yield f"{name}: record {r.get('key')} only in B"


def compare_npz(a: Path, b: Path, name: str, rtol: float) -> Iterator[str]:
    with np.load(a, allow_pickle=False) as za, np.load(b, allow_pickle=False) as zb:
        for k in sorted(set(za.files) | set(zb.files)):
            if k not in za.files or k not in zb.files:
                yield f"{name}:{k}: only in {'B' if k not in za.files else 'A'}"
                continue
            x, y = za[k], zb[k]
            if x.dtype != y.dtype or x.shape != y.shape:
                yield f"{name}:{k}: {x.dtype}{x.shape} != {y.dtype}{y.shape}"
            elif x.dtype.kind in "fc":
                same = np.isclose(x, y, rtol=rtol, atol=0.0, equal_nan=True)
                if not np.all(same):
                    yield f"{name}:{k}: {int((~same).sum())} of {x.size} entries differ"
            elif not np.array_equal(x, y):
                yield f"{name}:{k}: arrays differ"


def compare_csv(a: Path, b: Path, name: str, rtol: float) -> Iterator[str]:
    def rows(p: Path) -> list[dict[str, str]]:
        with p.open(newline="") as fh:
            return list(csv.DictReader(fh))

    ra, rb = rows(a), rows(b)
    if len(ra) != len(rb):
        yield f"{name}: {len(ra)} rows != {len(rb)}"
        return
    for i, (x, y) in enumerate(zip(ra, rb)):
        for k in sorted(set(x) | set(y)):
            if _skipped(k):
                continue
            u, v = x.get(k), y.get(k)
            try:
                same = _same_number(float(u), float(v), rtol)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                same = u == v
            if not same:
                yield f"{name}[row {i}].{k}: {u!r} != {v!r}"


def compare(a_dir: Path, b_dir: Path, rtol: float = 0.0) -> Iterator[str]:
    """Every difference between two results directories (see the module docstring)."""
    files_a = {p.relative_to(a_dir) for p in a_dir.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b_dir) for p in b_dir.rglob("*") if p.is_file()}
    for rel in sorted(files_a | files_b):
        name = str(rel)
        if rel.name.startswith(".") or rel.suffix not in (".json", ".jsonl", ".npz", ".csv"):
            continue
        if rel not in files_a or rel not in files_b:
            yield f"{name}: only in {'B' if rel not in files_a else 'A'}"
            continue
        a, b = a_dir / rel, b_dir / rel
        if rel.suffix == ".jsonl":
            yield from compare_jsonl(a, b, name, rtol)
        elif rel.suffix == ".json":
            yield from diff(json.loads(a.read_text()), json.loads(b.read_text()), name, rtol)
        elif rel.suffix == ".npz":
            yield from compare_npz(a, b, name, rtol)
        else:
            yield from compare_csv(a, b, name, rtol)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="the results directory before the change")
    parser.add_argument("b", type=Path, help="the results directory after it")
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0)")
    parser.add_argument("--max-lines", type=int, default=40, help="differences printed at most")
    args = parser.parse_args(argv)
    for d in (args.a, args.b):
        if not d.is_dir():
            parser.error(f"{d} is not a directory")
    n = 0
    for line in compare(args.a, args.b, args.rtol):
        if n < args.max_lines:
            print(line)
        n += 1
    files = sum(1 for p in args.a.rglob("*") if p.is_file())
    print(f"{n} difference(s) between {args.a} and {args.b} ({files} files in A)")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
