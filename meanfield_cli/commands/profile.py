r"""The ``meanfield profile`` subcommand: a whole model, layer by layer (docs/profile.md).

``meanfield profile MODEL --text FILE_OR_CORPUS --n 32 64 128`` loads ``MODEL`` (``minilm``,
``smollm2``, ``gpt2-random``, ``bert-random``, a local checkpoint directory or a cached hub name;
:func:`meanfield.models.load_model`, nothing downloaded), tokenizes the text once (``kjv``,
``pydoc`` or a text file; :func:`experiments.corpora.corpus_token_ids`) and calls
:func:`meanfield.profile.profile_model` on the window of ``n`` tokens from ``--start`` for each
``n``. For each layer it reports the attention sublayer's certified bracket (and one per head),
the whole block's Jacobian norm, the certified norms of the block's weight matrices, and the
chain-rule product across layers against the measured end-to-end constant.

It writes ``profile.json`` (atomically, with run metadata) and the heatmaps ``profile.png`` /
``profile.pdf`` (:mod:`paper_figs.fig_profile`, drawn from the saved JSON) under ``--out``, and
shows a cost-weighted progress bar on stderr (:class:`experiments.engine.CostProgress`). Bad
input (an unknown model, ``n`` beyond the text or the model's positions) is a one-line error with
exit status 2.

A vision encoder (ViT, DeiT: a checkpoint directory) is profiled on one image instead of a
window of text: ``--images FILE.npy`` with ``--image-index`` (as ``meanfield lipschitz``: float
pixel values already normalised, or ``uint8`` raw pixels with the checkpoint's
``preprocessor_config.json``), or one synthetic image of seeded standard Gaussian pixel values
(``--seed``) without it. Its hidden states entering the first profiled layer
(:func:`meanfield.models.image_hidden_states`, ``block=True``) go to
:func:`meanfield.profile.profile_model`, at the one length ``n = prefix + patches``; the record
names the images in ``images``. ``--text``, ``--n`` and ``--start`` are an error there.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from ..options import (
    UsageError,
    add_common,
    add_device,
    check_device,
    check_out_dir,
    print_written,
    write_record,
)
from .lipschitz import (
    BUILT_IN_MODELS,
    add_image_options,
    capture_images,
    check_model_name,
    refuse_image_options,
    refuse_text_options,
)

__all__ = ["handle", "register", "show"]


def parse_layers(specs: list[str] | None) -> list[int] | None:
    """``["0", "3-5"]`` -> ``[0, 3, 4, 5]`` (``None`` stays ``None``: every layer)."""
    if specs is None:
        return None
    out: list[int] = []
    for spec in specs:
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "-" in part[1:]:
                    a, b = part.split("-", 1)
                    lo, hi = int(a), int(b)
                    if hi < lo:
                        raise ValueError
                    out.extend(range(lo, hi + 1))
                else:
                    out.append(int(part))
            except ValueError:
                raise UsageError(
                    f"--layers: expected integers or ranges like 3-7, got {part!r}"
                ) from None
    if not out:
        raise UsageError("--layers is empty")
    return out


def _load(args: argparse.Namespace) -> Any:
    from meanfield.models import load_model, random_gpt2

    if args.n_layer is not None:
        if args.model != "gpt2-random":
            raise UsageError("--n-layer only applies to gpt2-random")
        if args.n_layer < 1:
            raise UsageError(f"--n-layer must be a positive integer, got {args.n_layer}")
        return random_gpt2(args.seed, n_layer=args.n_layer)
    check_model_name(args.model)
    try:
        return load_model(args.model, seed=args.seed)
    except OSError as err:
        raise UsageError(
            " ".join(str(err).split()) + f"; built-in models: {', '.join(BUILT_IN_MODELS)}"
        ) from err


#: Shapes of the built-in models before they load: layers, d and the MLP width (for the first ETA).
_BUILT_IN_SHAPES = {
    "smollm2": (30, 576, 1536),
    "minilm": (6, 384, 1536),
    "gpt2-random": (12, 768, 3072),
    "bert-random": (12, 768, 3072),
}


def _config_shapes(cfg: Any) -> tuple[int, int, int] | None:
    """``(layers, d, d_ff)`` of a Hugging Face config (object or ``config.json`` dict)."""
    get = cfg.get if isinstance(cfg, dict) else lambda k, default=None: getattr(cfg, k, default)
    layers = get("num_hidden_layers") or get("n_layer")
    d = get("hidden_size") or get("n_embd")
    if not layers or not d:
        return None
    d_ff = get("intermediate_size") or get("n_inner") or 4 * int(d)
    return int(layers), int(d), int(d_ff)


def _shapes_before_loading(args: argparse.Namespace) -> tuple[int, int, int] | None:
    """The model's shapes without loading it: built-in, or a checkpoint's config.json."""
    if args.model in _BUILT_IN_SHAPES:
        layers, d, d_ff = _BUILT_IN_SHAPES[args.model]
        if args.model == "gpt2-random" and args.n_layer is not None:
            layers = int(args.n_layer)
        return layers, d, d_ff
    cfg = Path(args.model).expanduser() / "config.json"
    try:
        return _config_shapes(json.loads(cfg.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _load_seconds(args: argparse.Namespace) -> float:
    """Predicted seconds to load the model (:data:`experiments.engine.LOAD_SECONDS`)."""
    from experiments.engine import LOAD_BYTES_PER_SECOND, LOAD_SECONDS, LOAD_SECONDS_BASE

    if args.model in LOAD_SECONDS:
        return LOAD_SECONDS[args.model]
    path = Path(args.model).expanduser()
    size = sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else 0
    return LOAD_SECONDS_BASE + size / LOAD_BYTES_PER_SECOND


#: The window lengths when ``--n`` is not given (text models).
_DEFAULT_NS = [128]

#: The text options, refused for a vision encoder.
_TEXT_OPTIONS = ("--text", "--n", "--start")


def _predict(
    args: argparse.Namespace, shapes: tuple[int, int, int], layers: Any, ns: list[int]
) -> Any:
    from experiments.engine import predict_profile

    n_layers, d, d_ff = shapes
    chosen = [x for x in (layers if layers is not None else range(n_layers)) if 0 <= x < n_layers]
    return predict_profile(
        layers=chosen or [0],
        ns=ns,
        d=d,
        d_ff=d_ff,
        heads=not args.no_heads,
        end_to_end=not args.no_end_to_end,
        krylov=args.krylov,
    )


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """``meanfield profile``: profile every layer and write the JSON record and the heatmaps."""
    import torch

    from experiments.corpora import corpus_token_ids
    from experiments.engine import CostProgress
    from meanfield.models import reads_images
    from meanfield.profile import profile_model

    check_device(args.device)
    if args.n is not None and any(n < 1 for n in args.n):
        raise UsageError(f"--n must be positive integers, got {args.n}")
    if args.start is not None and args.start < 0:
        raise UsageError(f"--start must be >= 0, got {args.start}")
    if args.model in BUILT_IN_MODELS:
        refuse_image_options(args, args.model)
    ns = list(args.n) if args.n is not None else list(_DEFAULT_NS)
    if not (math.isfinite(args.tol) and args.tol > 0):
        raise UsageError(f"--tol must be a positive number, got {args.tol}")
    layers = parse_layers(args.layers)
    check_out_dir(args.out)  # before the model loads and the minutes of work
    # The first ETA: the cost model's seconds of the load and of every step, from the model's
    # shapes (known before loading for the built-in models and checkpoint directories); the
    # run's measured pace takes over as it goes (experiments.engine.CostProgress).
    tracker = CostProgress(desc="profile", enabled=not args.no_progress)
    shapes = _shapes_before_loading(args)
    t_load = time.perf_counter()
    if shapes is not None:
        tracker.plan(
            {"load": _load_seconds(args), "profile": _predict(args, shapes, layers, ns).total}
        )
        tracker.begin("load")
    try:
        loaded = _load(args)
        model, tok = loaded.model, loaded.tokenizer
        dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
        images = None
        if reads_images(model):
            refuse_text_options(args, loaded.label, _TEXT_OPTIONS)
            first = min(layers) if layers else 0
            images = capture_images(args, loaded, first, 1, block=True, dtype=dtype)
            source: Any = images.X[0]
            ns = [images.n]
            start = 0
        else:
            refuse_image_options(args, loaded.label)
            if tok is None:
                from meanfield.models.standins import no_tokenizer_message

                raise UsageError(no_tokenizer_message(loaded.label))
            start = 0 if args.start is None else args.start
            text = "kjv" if args.text is None else args.text
            ids, corp = corpus_token_ids(text, tok, min_tokens=start + max(ns))
            source = ids
        shapes = _config_shapes(model.config) or shapes
        pred = _predict(args, shapes, layers, ns) if shapes is not None else None
        seconds = pred.total if pred is not None else 0.0
        if "load" in tracker.phases:
            tracker.plan({"profile": seconds})  # the loaded model's own shapes
        else:  # shapes unknown until now: the load counts for what it measured
            tracker.plan({"load": time.perf_counter() - t_load, "profile": seconds})
            tracker.begin("load")
        tracker.end("load")
        tracker.begin("profile")
        scale: list[float] = []

        def progress(ev: Any) -> None:
            # the progress counts each step for its predicted seconds; the setup (the blocks in
            # float64, the weights' norms) happens before the first step ends: it counts there
            if not scale:
                steps = sum(pred.steps.values()) if pred is not None else 0.0
                scale.append(steps / ev.total_cost if steps > 0 and ev.total_cost > 0 else 1.0)
                total = pred.total if pred is not None else ev.total_cost
                tracker.add("profile", cost=total, points=ev.total, seconds=seconds or None)
                tracker.start_stage("profile")
            if ev.step > 0:
                c = pred.steps.get(ev.label) if pred is not None else None
                c = ev.cost * scale[0] if c is None else c
                if ev.step == 1 and pred is not None:
                    c += pred.setup
                tracker.advance("profile", cost=c)

        prof = profile_model(
            model,
            source,
            n=ns,
            layers=layers,
            heads=not args.no_heads,
            end_to_end=not args.no_end_to_end,
            start=start,
            dtype=dtype,
            device=args.device,
            tol=args.tol,
            krylov=args.krylov,
            seed=args.seed,
            label=loaded.label,
            progress=progress,
        )
        tracker.end("profile")
    except BaseException:
        tracker.enabled = False  # the error is the one line to show
        raise
    finally:
        tracker.close()
    doc: dict[str, Any] = {
        **prof.to_dict(),
        "model_arg": args.model,
        "provenance": dict(loaded.provenance),
    }
    if images is not None:
        doc.update(
            text=None,
            images=images.images,
            image_indices=list(images.indices),
            n_prefix=images.n_prefix,
            capture_point=images.capture_point,
        )
    else:
        doc.update(text=corp.label, n_text_tokens=int(ids.numel()))
    out = Path(args.out)
    files = [str(write_record(out / "profile.json", doc, args))]
    if not args.no_figure:
        from paper_figs import fig_profile

        files += [str(p) for p in fig_profile.draw(out, out)]
    doc["files"] = files
    return doc


def _fmt(x: Any) -> str:
    return "inf" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.4g}"


#: Marks an attention upper end that is ``upper_prob`` (the deterministic ``upper`` is inf).
_PROB_MARK = "*"


def _attention_upper(a: dict[str, Any]) -> str:
    """The attention's upper end for the table: ``upper`` if finite, else ``upper_prob`` marked.

    The rule of :attr:`meanfield.profile.AttentionRecord.bound`; the mark says that the end
    holds with probability ``1 - delta`` over the solver's random start (docs/profile.md §3).
    """
    upper = a["upper"]
    if isinstance(upper, (int, float)) and math.isfinite(upper):
        return _fmt(upper)
    prob = a.get("upper_prob")
    if isinstance(prob, (int, float)) and math.isfinite(prob):
        return _fmt(prob) + _PROB_MARK
    return _fmt(upper)


def _input_label(doc: dict[str, Any]) -> str:
    """``text LABEL``, or the images of a vision encoder and their sequence length."""
    if doc.get("images") is None:
        return f"text {doc.get('text')}"
    idx = ", ".join(str(i) for i in doc.get("image_indices", []))
    return (
        f"{doc['images']} (image {idx}; n = {doc['n_prefix']} prefix token(s) + patches "
        f"= {doc['ns'][0]})"
    )


def show(doc: dict[str, Any]) -> None:
    """Human-readable summary of ``meanfield profile``."""
    print(
        f"profile of {doc['model']} ({doc['arch']}, {doc['n_layers']} layers, d = {doc['d']}, "
        f"{doc['n_heads']} heads, {'causal' if doc['causal'] else 'bidirectional'}), "
        f"{doc['dtype']} on {doc['device']}, {_input_label(doc)}; {doc['seconds']:.1f} s"
    )
    maxw = {e["layer"]: max(e["maps"], key=lambda m: m["upper"]) for e in doc.get("linear", [])}
    marked = False
    for n in doc["ns"]:
        print(f"n = {n}")
        print(
            f"  {'layer':>5} {'R':>8} {'attention [lower, upper]':>32} {'block':>10} "
            f"{'block up':>10} {'max ||W||':>12}"
        )
        for r in (r for r in doc["records"] if r["n"] == n):
            a, b = r["attention"], r["block"]
            up = _attention_upper(a)
            marked = marked or up.endswith(_PROB_MARK)
            w = maxw.get(r["layer"])
            ws = f"{w['upper']:.4g} ({w['name']})" if w else ""
            print(
                f"  {r['layer']:>5} {r['radius']:>8.3g} {a['value']:>10.4g} "
                f"[{_fmt(a['lower']):>9}, {up:>9}] {b['value']:>10.4g} "
                f"{_fmt(b['upper_prob']):>10} {ws:>12}"
            )
        for c in (c for c in doc["chains"] if c["n"] == n):
            e = c["end_to_end"]
            print(
                f"  chain rule, layers {c['layers'][0]}-{c['layers'][-1]}: product of block norms "
                f"{_fmt(c['product_value'])} (upper {_fmt(c['product_bound'])}, {c['bound_kind']})"
                f" >= end-to-end {_fmt(e['value'])}: {'holds' if c['holds'] else 'VIOLATED'}, "
                f"slack x{_fmt(c['slack'])}"
            )
    if marked:
        delta = doc.get("settings", {}).get("delta")
        conf = f"1 - {delta:g}" if isinstance(delta, (int, float)) else "1 - delta"
        print(
            f"  {_PROB_MARK} upper_prob: the upper end holds with probability >= {conf} over the "
            "solver's random start (no deterministic upper end on this path)"
        )
    print_written(doc)


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``profile``."""
    p = sub.add_parser(
        "profile",
        help="whole-model profile: per-layer attention bracket, block norm, weights, chain rule",
        description=(
            "Profile every layer of a model on a window of text: the attention sublayer's "
            "certified bracket (per head too), the whole block's Jacobian norm, the certified "
            "norms of its weight matrices, and the chain-rule product against the end-to-end "
            "constant (docs/profile.md). Writes profile.json and a heatmap figure. "
            "What a run costs on 2 CPU cores: `meanfield profile smollm2 --n 16 32` (30 layers, "
            "two window lengths) took 4.5 to 9 min (4 min 34 s and 6 min 16 s here, 8 min 42 s "
            "for a user on a busier machine; 17 s of it loading and de-quantizing SmolLM2): 2.5 to 5 s per layer and window length, "
            "plus one end-to-end run per window length that takes about a third of its layers' "
            "time. The time grows with the layers (--layers), the window lengths (--n) and "
            "--krylov; --no-end-to-end saves the end-to-end runs. The progress shows the predicted time "
            "from the start, then corrects it with the measured pace."
        ),
    )
    add_common(
        p,
        seed="seed of gpt2-random and bert-random and of the solvers' start vectors (default 0)",
        progress=True,
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help=f"{', '.join(BUILT_IN_MODELS)}, or a local checkpoint directory",
    )
    p.add_argument(
        "--text", metavar="FILE_OR_CORPUS", help="kjv, pydoc or a text file (default kjv)"
    )
    p.add_argument(
        "--n",
        type=int,
        nargs="+",
        help="window lengths (default 128; not for vision encoders, whose n is 1 + patches)",
    )
    p.add_argument(
        "--layers",
        nargs="+",
        metavar="L",
        help="layers to profile, e.g. 0 1 2 or 0-5 (default all; the chain rule needs a range)",
    )
    p.add_argument("--start", type=int, help="token offset of the window (default 0)")
    add_image_options(p, "one synthetic image", "the image of --images to profile (default 0)")
    p.add_argument("--out", default="profile_out", help="output directory (default profile_out)")
    p.add_argument(
        "--dtype",
        choices=("float64", "float32"),
        default="float64",
        help="precision of the blocks and every estimate (default float64)",
    )
    p.add_argument(
        "--tol", type=float, default=1e-4, help="solver residual tolerance (default 1e-4)"
    )
    p.add_argument(
        "--krylov",
        type=int,
        default=24,
        help="Lanczos steps of each block and end-to-end run (default 24; fewer is faster, "
        "but the probabilistic upper end needs about 16 or more)",
    )
    p.add_argument("--no-heads", action="store_true", help="skip the per-head brackets")
    p.add_argument(
        "--no-end-to-end",
        action="store_true",
        help="skip the end-to-end Jacobian and the chain-rule check",
    )
    p.add_argument("--no-figure", action="store_true", help="write profile.json only")
    p.add_argument(
        "--n-layer", type=int, help="layers of gpt2-random (fewer is faster; default 12)"
    )
    add_device(p)
    p.set_defaults(handler=handle, printer=show)
    return p
