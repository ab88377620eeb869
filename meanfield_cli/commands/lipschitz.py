r"""The ``meanfield lipschitz`` subcommand: local Lipschitz constants with certified brackets.

Three sources of inputs, one per mode:

``--model NAME|PATH``
    A real layer on text windows: ``minilm``, ``smollm2``, ``gpt2-random``, ``bert-random`` or a
    local checkpoint (:func:`meanfield.models.load_model`), layer ``--layer``, ``--windows``
    consecutive windows of ``--n`` tokens of ``--corpus`` (``kjv``, ``pydoc`` or a text file)
    from token ``--start``, captured at the layer's input (:func:`meanfield.models.hidden_states`,
    docs/experiments.md, "Models and texts"). ``--map`` chooses the differentiated map (defect
    D2 of docs/experiments.md); the mask defaults to the model's own (``--masked``/``--unmasked``
    override it).
``--random-d D``
    A random synthetic layer: ``--heads`` heads with :math:`A_h` of i.i.d. :math:`\mathcal N(0,
    1/d)` entries (non-symmetric); one head has :math:`V = I` (as ``meanfield attack``), several
    heads have :math:`V_h` of :math:`\mathcal N(0, 1/d)` entries and an output projection of
    :math:`\mathcal N(0, 1/(Hd))` entries. ``--n`` Gaussian tokens are rescaled so that the largest
    norm is ``--R`` (the radius of docs/theory.md).
``--input X.npy --params P.npz``
    Tokens from a ``.npy`` array of shape (n, d) or (B, n, d); the layer from a ``.npz`` holding
    ``A`` ((d, d) or (H, d, d)) and optionally ``V`` ((d_v, d) or (H, d_v, d); default
    :math:`I`), ``W_O`` ((d_out, H d_v)), ``b_O``, ``c`` ((H, d), key-logit term) and ``b``
    ((H, d_v), value bias), in the toolkit's score convention :math:`x_i^\top A x_j` (query
    :math:`i`, key :math:`j`). Files are read with ``allow_pickle=False``.

Every input is estimated by one call of :func:`meanfield.local_lipschitz` (``--map block``:
:func:`meanfield.local_lipschitz_fn` on the ``BertAttention`` map, whose matrix-free estimates
carry no upper certificate). Each row reports the value, the certified bracket ``[lower,
upper]``, ``upper / lower``, convergence, the number of products with :math:`J` or
:math:`J^\top` and the wall time; ``--released`` adds the released estimator's quantity
:math:`\sqrt{\|J^\top f(X)\|}` (:func:`meanfield.released_metric`, defect D1 of
docs/experiments.md: *not* a Lipschitz constant). The handler returns a JSON-serialisable dict;
bad input raises a one-line ``ValueError``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from experiments.engine import run_metadata, write_json
from experiments.inputs import load_inputs, load_params_npz, random_layer, random_tokens

from ..options import (
    UsageError,
    add_common,
    add_device,
    check_device,
    check_out_file,
    print_written,
)

__all__ = ["handle", "register", "show"]

#: The models ``--model`` knows by name (anything else is a directory or a cached hub name).
BUILT_IN_MODELS = ("minilm", "smollm2", "gpt2-random", "bert-random")

_DTYPES = ("float64", "float32")


# --------------------------------------------------------------------------- handler
def _check_common(args: argparse.Namespace) -> None:
    if args.tol is not None and not (math.isfinite(args.tol) and args.tol > 0):
        raise UsageError(f"--tol must be a positive number, got {args.tol}")
    if args.prob_rtol is not None and not (math.isfinite(args.prob_rtol) and args.prob_rtol > 0):
        raise UsageError(f"--prob-rtol must be a positive number, got {args.prob_rtol}")
    check_device(args.device)
    if args.out:
        check_out_file(args.out)


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "~", "/")) or "\\" in name or name.count("/") > 1


def check_model_name(name: str, option: str = "--model") -> None:
    """A one-line error for a model that is neither built in nor an existing directory.

    A name that looks like a path (``/x``, ``./x``, ``~/x``, ``a/b/c``) must be a directory; it is
    never looked up as a hub name. ``option`` is how the message names the setting.
    """
    if name in BUILT_IN_MODELS:
        return
    given = f"{option}{name}" if option.endswith("=") else f"{option} {name}"
    path = Path(name).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(
            f"{given}: a checkpoint is a directory (config.json and safetensors weights), "
            f"not a file; built-in models: {', '.join(BUILT_IN_MODELS)}"
        )
    if not path.exists() and _looks_like_path(name):
        raise UsageError(
            f"{given}: no such directory; built-in models: {', '.join(BUILT_IN_MODELS)}"
        )


def _model_inputs(args: argparse.Namespace, dtype: Any) -> tuple[Any, Any, dict[str, Any], Any]:
    """(X, params or None, source, fn or None) for ``--model``."""
    from experiments.corpora import corpus_token_ids
    from meanfield.models import hf_attention, hidden_states, layer_info, load_model, random_gpt2

    if args.n is None or args.n < 1:
        raise ValueError(f"--n must be a positive integer, got {args.n}")
    if args.windows < 1:
        raise ValueError(f"--windows must be a positive integer, got {args.windows}")
    if args.start < 0:
        raise ValueError(f"--start must be >= 0, got {args.start}")
    if args.n_layer is not None:
        if args.model != "gpt2-random":
            raise ValueError("--n-layer only applies to --model gpt2-random")
        if args.n_layer < 1:
            raise ValueError(f"--n-layer must be a positive integer, got {args.n_layer}")
        loaded = random_gpt2(args.seed, n_layer=args.n_layer)
    else:
        check_model_name(args.model)
        try:
            loaded = load_model(args.model, seed=args.seed)
        except OSError as err:
            raise UsageError(
                " ".join(str(err).split()) + f"; built-in models: {', '.join(BUILT_IN_MODELS)}"
            ) from err
    model, tok = loaded.model, loaded.tokenizer
    info = layer_info(model, args.layer, map=args.map)
    if tok is None:
        from meanfield.models.standins import no_tokenizer_message

        raise UsageError(no_tokenizer_message(loaded.label))
    need = args.start + args.windows * args.n
    ids, corp = corpus_token_ids(args.corpus, tok, min_tokens=need)
    hs = hidden_states(
        model,
        None,
        ids,
        args.layer,
        args.n,
        n_windows=args.windows,
        start=args.start,
        dtype=dtype,
        device=args.device,
    )
    att = hf_attention(model, args.layer, map=args.map, dtype=dtype).to(device=args.device)
    masked = info.causal if args.masked is None else args.masked
    source = {
        "model": loaded.label,
        "model_arg": args.model,
        "layer": info.layer,
        "map": args.map,
        "module": info.module,
        "model_causal": info.causal,
        "corpus": corp.label,
        "capture_point": hs.capture_point,
        "window_starts": list(hs.starts),
        "rope": info.has_rope,
    }
    if args.map == "block":

        def fn(X: Any) -> Any:
            return att(X, masked=masked)

        return hs.X, None, {**source, "masked": masked}, fn
    return hs.X, att.params, {**source, "masked": masked}, None


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """``meanfield lipschitz``: estimate the local constant of each input (module docstring)."""
    import torch

    from meanfield import local_lipschitz, local_lipschitz_fn, released_metric, self_attention

    _check_common(args)
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    fn = None
    if args.model is not None:
        X, params, source, fn = _model_inputs(args, dtype)
        mode = "model"
        masked = source.pop("masked")
    elif args.random_d is not None:
        if args.n is None or args.n < 1:
            raise ValueError(f"--n must be a positive integer, got {args.n}")
        if not (math.isfinite(args.R) and args.R > 0):
            raise ValueError(f"--R must be a positive number, got {args.R}")
        if args.random_d < 1:
            raise UsageError(f"--random-d must be a positive integer, got {args.random_d}")
        if args.heads < 1:
            raise UsageError(f"--heads must be a positive integer, got {args.heads}")
        params, source = random_layer(args.random_d, args.heads, args.seed, dtype, args.device)
        X = torch.tensor(
            random_tokens(args.n, args.random_d, args.R, args.seed), dtype=dtype, device=args.device
        )
        source = {**source, "tokens": "Gaussian, rescaled to max norm R", "R": args.R}
        mode = "random"
        masked = bool(args.masked)
    else:
        if args.params is None:
            raise ValueError(
                "--input needs the layer: --params P.npz (arrays A, optional V, W_O, ...)"
            )
        params, source = load_params_npz(args.params, dtype, args.device)
        Xn = load_inputs(args.input)
        if Xn.shape[-1] != params.d:
            raise ValueError(
                f"--input tokens have dimension {Xn.shape[-1]}, the layer expects {params.d}"
            )
        X = torch.tensor(Xn, dtype=dtype, device=args.device)
        source = {**source, "input": str(args.input)}
        mode = "input"
        masked = bool(args.masked)
    batch = X.reshape(-1, X.shape[-2], X.shape[-1])
    if fn is not None and args.geometry != "euclidean":
        raise ValueError(
            "--map block supports --geometry euclidean only (the map is not attention on a measure)"
        )
    if fn is None:

        def fn(Y: Any) -> Any:
            return self_attention(Y, params, masked=masked)

    rows = []
    for i in range(batch.shape[0]):
        Xi = batch[i]
        t0 = time.perf_counter()
        if params is None:
            tol = 1e-6 if args.tol is None else args.tol
            est = local_lipschitz_fn(fn, Xi, method=args.method, tol=tol, seed=args.seed)
        else:
            est = local_lipschitz(
                Xi,
                params,
                geometry=args.geometry,
                masked=masked,
                method=args.method,
                tol=args.tol,
                seed=args.seed,
                certify=args.certify,
                prob_rtol="auto" if args.prob_rtol is None else args.prob_rtol,
                start="kronecker" if args.kronecker_start else None,
            )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        lower, upper = float(est.lower), float(est.upper)
        row = {
            "index": i,
            "value": float(est.value),
            "lower": lower,
            "upper": upper,
            "ratio": upper / lower if lower > 0 else math.inf,
            "upper_prob": None if est.upper_prob is None else float(est.upper_prob),
            "ratio_prob": (
                None
                if est.upper_prob is None
                else (float(est.upper_prob) / lower if lower > 0 else math.inf)
            ),
            "confidence": est.confidence,
            "stop_rule": getattr(est, "stop_rule", "residual"),
            "converged": bool(est.converged),
            "n_matvec": int(est.n_matvec),
            "n_iter": int(est.n_iter),
            "residual": float(est.residual),
            "method": est.method,
            "upper_method": est.upper_method,
            "certified": params is None or args.certify,
            "seconds": seconds,
            "max_radius": float(Xi.norm(dim=-1).max()),
        }
        if args.released:
            row["released_metric"] = float(released_metric(fn, Xi))
        rows.append(row)
    doc: dict[str, Any] = {
        "kind": "lipschitz",
        "mode": mode,
        "source": source,
        "n": int(X.shape[-2]),
        "d": int(X.shape[-1]),
        "masked": masked,
        "geometry": args.geometry,
        "method": args.method,
        "tol": args.tol,
        "prob_rtol": args.prob_rtol,
        "start": "kronecker" if args.kronecker_start else "random",
        "dtype": args.dtype,
        "device": args.device,
        "inputs": rows,
        "all_converged": all(r["converged"] for r in rows),
    }
    if args.out:
        config = {k: v for k, v in vars(args).items() if k not in ("handler", "printer")}
        meta = run_metadata(seed=args.seed, device=args.device, dtype=args.dtype, config=config)
        path = write_json(args.out, {**doc, "metadata": meta})
        doc["files"] = [str(path)]
    return doc


def show(doc: dict[str, Any]) -> None:
    """Human-readable summary of ``meanfield lipschitz``."""
    src = doc["source"]
    what = {
        "model": lambda: f"{src['model']}, layer {src['layer']}, map {src['map']}",
        "random": lambda: (
            f"random layer d = {src['random_d']}, {src['heads']} head(s), R = {src['R']}"
        ),
        "input": lambda: f"{src['input']} with {src['params']}",
    }[doc["mode"]]()
    print(
        f"local Lipschitz constant ({doc['geometry']}, {'masked' if doc['masked'] else 'unmasked'}), "
        f"{what}, n = {doc['n']}, d = {doc['d']}"
    )
    released = any("released_metric" in r for r in doc["inputs"])
    prob = any(r.get("upper_prob") is not None for r in doc["inputs"])
    head = f"  {'#':>3} {'value':>12} {'certified bracket':>27} {'up/low':>7}"
    if prob:
        head += f" {'upper_prob':>11} {'/low':>6}"
    head += f" {'conv':>5} {'matvec':>6} {'sec':>7}"
    print(head + ("  released" if released else ""))
    for r in doc["inputs"]:
        if r.get("certified", True):
            bracket = f"[{r['lower']:>11.6g}, {r['upper']:>11.6g}] {r['ratio']:>7.3g}"
        else:
            bracket = f"{'(not certified)':>27} {'':>7}"
        line = f"  {r['index']:>3} {r['value']:>12.6g} {bracket}"
        if prob:
            up = r.get("upper_prob")
            line += (
                f" {up:>11.6g} {r['ratio_prob']:>6.4g}" if up is not None else f" {'':>11} {'':>6}"
            )
        line += f" {'yes' if r['converged'] else 'NO':>5} {r['n_matvec']:>6} {r['seconds']:>7.2f}"
        if released:
            line += f"  {r['released_metric']:.6g}"
        print(line)
    if prob:
        conf = next(r["confidence"] for r in doc["inputs"] if r.get("upper_prob") is not None)
        rules = sorted({r.get("stop_rule", "residual") for r in doc["inputs"]})
        print(
            f"  (upper always holds; upper_prob holds with probability >= {conf:.6g} over the "
            f"random start; stopped on the {' / '.join(rules)} rule)"
        )
    if released:
        print(
            "  (released = sqrt(||J^T f(X)||), the released estimator's quantity; not a Lipschitz constant)"
        )
    print_written(doc)


# --------------------------------------------------------------------------- parser
def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``lipschitz``."""
    p = sub.add_parser(
        "lipschitz",
        help="local Lipschitz constant of attention at inputs, with a certified bracket",
        description=(
            "Local Lipschitz constant ||Df(X)|| (or its Wasserstein/splitting variants) of an "
            "attention layer at inputs from a model on text, a random layer, or files."
        ),
    )
    add_common(
        p,
        seed="seed of the random layer and tokens, of gpt2-random and bert-random, and of "
        "the estimator's start vector (default 0)",
        progress=True,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        metavar="NAME|PATH",
        help="minilm, smollm2, gpt2-random, bert-random, or a local checkpoint",
    )
    src.add_argument(
        "--random-d",
        dest="random_d",
        type=int,
        metavar="D",
        help="random synthetic layer of width D",
    )
    src.add_argument("--input", metavar="X.npy", help="tokens (n, d) or (B, n, d) from a .npy file")
    m = p.add_argument_group("model mode")
    m.add_argument("--layer", type=int, default=0, help="layer index (default 0)")
    m.add_argument("--corpus", default="kjv", help="kjv, pydoc or a text file (default kjv)")
    m.add_argument("--windows", type=int, default=1, help="number of windows (default 1)")
    m.add_argument("--start", type=int, default=0, help="token offset of the first window")
    m.add_argument(
        "--map",
        choices=("heads", "heads+WO", "block"),
        default="heads+WO",
        help="differentiated map (default heads+WO; block: BERT residual + LayerNorm)",
    )
    m.add_argument(
        "--n-layer",
        dest="n_layer",
        type=int,
        default=None,
        help="layers of gpt2-random (fewer is faster; default 12)",
    )
    r = p.add_argument_group("random mode")
    r.add_argument("--heads", type=int, default=1, help="number of heads (default 1)")
    r.add_argument("--R", type=float, default=1.0, help="largest token norm (default 1)")
    f = p.add_argument_group("input-file mode")
    f.add_argument("--params", metavar="P.npz", help="layer arrays A, V, W_O, b_O, c, b (.npz)")
    p.add_argument("--n", type=int, default=None, help="tokens per window / sequence")
    mask = p.add_mutually_exclusive_group()
    mask.add_argument(
        "--masked",
        dest="masked",
        action="store_true",
        default=None,
        help="causal attention (default: the model's own mask; unmasked otherwise)",
    )
    mask.add_argument(
        "--unmasked",
        dest="masked",
        action="store_false",
        help="bidirectional attention, also for a causal model",
    )
    p.add_argument(
        "--geometry",
        choices=("euclidean", "wasserstein", "split"),
        default="euclidean",
        help="euclidean: ||Df(X)||_2 on sequences; wasserstein: the mean-field constant on the "
        "measure of the tokens; split: its mass-splitting variant (default euclidean)",
    )
    p.add_argument(
        "--method",
        choices=("auto", "dense", "lanczos", "power"),
        default="auto",
        help="dense Jacobian, or the matrix-free Lanczos or power iteration (default auto: "
        "dense when it is small)",
    )
    p.add_argument(
        "--tol",
        type=float,
        default=None,
        help="stop on the residual rule ||J^T J v - s^2 v|| <= tol s^2 instead (default: stop "
        "once the probabilistic bracket is within --prob-rtol; 1e-6 where there is none)",
    )
    p.add_argument(
        "--prob-rtol",
        type=float,
        default=None,
        help="stop once upper_prob <= (1 + prob-rtol) * lower, the bracket that holds with "
        "probability 1 - 1e-6 over the random start (default 0.05 where the estimate has one)",
    )
    p.add_argument(
        "--dtype",
        choices=_DTYPES,
        default="float64",
        help="precision of the layer, the tokens and the estimate (default float64)",
    )
    p.add_argument(
        "--kronecker-start",
        action="store_true",
        help="start the matrix-free methods from the layer's Kronecker start instead of a seeded "
        "random vector: fewer products, but no probabilistic upper end",
    )
    p.add_argument(
        "--no-certify",
        dest="certify",
        action="store_false",
        help="the estimate alone, without the certified bracket (faster, above all in float32)",
    )
    add_device(p)
    p.add_argument(
        "--released",
        action="store_true",
        help="also print the released estimator's quantity sqrt(||J^T f(X)||)",
    )
    p.add_argument(
        "--out", default=None, metavar="FILE.json", help="write the result with run metadata"
    )
    p.set_defaults(handler=handle, printer=show)
    return p
