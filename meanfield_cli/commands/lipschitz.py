r"""The ``meanfield lipschitz`` subcommand: local Lipschitz constants with certified brackets.

Three sources of inputs, one per mode:

``--model NAME|PATH``
    A real layer on text windows: ``minilm``, ``smollm2``, ``gpt2-random``, ``bert-random`` or a
    local checkpoint (:func:`meanfield.models.load_model`), layer ``--layer``, ``--windows``
    consecutive windows of ``--n`` tokens of ``--corpus`` (``kjv``, ``pydoc`` or a text file)
    from token ``--start``, captured at the layer's input (:func:`meanfield.models.hidden_states`,
    docs/experiments.md, "Models and texts"). ``--map`` chooses the differentiated map (defect
    D2 of docs/experiments.md); the mask defaults to the model's own (``--masked``/``--unmasked``
    override it). Long windows: ``gpt2-random`` extends its position table beyond 1024 rows to
    ``--n`` (:func:`meanfield.models.random_gpt2`); every other model's position limit is a hard
    limit. Windows longer than 1024 tokens are captured with SDPA attention, which holds no
    ``n x n`` scores (``attention="auto"`` of :func:`meanfield.models.hidden_states`;
    docs/experiments.md, "Long contexts").

    A vision encoder (ViT, DeiT: a checkpoint directory) reads images instead:
    ``--images FILE.npy`` (shape (N, C, H, W), (N, H, W, C) or one image; float pixel values
    already normalised as the model's image processor gives them, or ``uint8`` raw pixels
    normalised with the ``image_mean`` / ``image_std`` of the checkpoint's
    ``preprocessor_config.json``), ``--windows`` images from ``--image-index``; without
    ``--images``, ``--windows`` synthetic images of seeded standard Gaussian pixel values
    (``--seed``). The sequence is the prefix tokens (CLS; DeiT also its distillation token) and
    the patch embeddings, unmasked (:func:`meanfield.models.image_hidden_states`); the result
    states the images used and ``n``. The text options (``--corpus``, ``--n``, ``--start``) are
    an error for such a model.
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
docs/experiments.md: *not* a Lipschitz constant). ``--path`` chooses the Jacobian products
(``stored``, ``streaming`` in memory linear in :math:`n`, or ``auto``) where the library's
:func:`meanfield.local_lipschitz` takes ``path=``; each row reports the path used.

Progress: the library logs the progress of long estimates to the ``logging`` logger
``meanfield.lipschitz`` at INFO level, and this command its own steps (loading, capture, each
input) to ``meanfield_cli.lipschitz``. Their lines go to stderr when stderr is a terminal or
``-v`` is given, unless ``--no-progress`` (their warnings always do); ``--log FILE`` also
appends them, with timestamps, to FILE (whatever ``--no-progress`` says).

The handler returns a JSON-serialisable dict; bad input raises a one-line ``ValueError``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import logging
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from experiments.inputs import load_inputs, load_params_npz, random_layer, random_tokens

from ..options import (
    UsageError,
    add_common,
    add_device,
    check_device,
    check_out_file,
    print_written,
    write_record,
)

__all__ = ["handle", "register", "show"]

#: The models ``--model`` knows by name (anything else is a directory or a cached hub name).
BUILT_IN_MODELS = ("minilm", "smollm2", "gpt2-random", "bert-random")

#: The Jacobian products ``--path`` chooses (``path=`` of :func:`meanfield.local_lipschitz`).
_PATHS = ("auto", "stored", "streaming")

#: The library's progress logger and this command's own.
_LOGGERS = ("meanfield.lipschitz", "meanfield_cli.lipschitz")

log = logging.getLogger("meanfield_cli.lipschitz")


# --------------------------------------------------------------------------- handler
def _check_common(args: argparse.Namespace) -> None:
    for option, value in (("--tol", args.tol), ("--prob-rtol", args.prob_rtol)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{option} must be a positive number, got {value}")
    check_device(args.device)
    if args.out:
        check_out_file(args.out)
    if args.log:
        check_out_file(args.log, "--log")
    if args.model is not None and args.map == "block" and args.path != "auto":
        raise UsageError(
            f"--path {args.path} applies to the attention maps (--map heads, heads+WO); --map "
            "block differentiates the model's module by autograd"
        )


class _TerminalFormat(logging.Formatter):
    """The terminal's progress lines; warnings and errors as the root logger shows them.

    The library's lines name ``local_lipschitz`` themselves; the command's own follow
    ``lipschitz:``.
    """

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            return f"{record.levelname} {record.name}: {record.getMessage()}"
        if record.name.startswith("meanfield_cli"):
            return f"lipschitz: {record.getMessage()}"
        return record.getMessage()


@contextlib.contextmanager
def _progress_logging(args: argparse.Namespace) -> Iterator[None]:
    """Route the progress loggers (:data:`_LOGGERS`) while the command runs; restore them after.

    Their INFO lines go to stderr when it is a terminal or ``-v`` was given, unless
    ``--no-progress``; warnings always do. ``--log FILE`` gets every line (appended, with
    timestamps) in any case. The loggers stop propagating to the root logger meanwhile, so
    ``-v`` does not print each line twice.
    """
    isatty = getattr(sys.stderr, "isatty", None)
    tty = bool(isatty()) if callable(isatty) else False
    show = bool(tty or args.verbose) and not args.no_progress
    level = logging.DEBUG if args.verbose >= 2 else logging.INFO
    term = logging.StreamHandler(sys.stderr)
    term.setFormatter(_TerminalFormat())
    term.addFilter(lambda record: show or record.levelno >= logging.WARNING)
    handlers: list[logging.Handler] = [term]
    if args.log:
        file = logging.FileHandler(Path(args.log).expanduser(), mode="a", encoding="utf-8")
        file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handlers.append(file)
    # INFO records only where something shows them: the library watches its run only then
    wanted = level if show or args.log else logging.WARNING
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        for h in handlers:
            h.setLevel(level)
            lg.addHandler(h)
        lg.setLevel(wanted)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, (lvl, prop) in zip(loggers, saved, strict=True):
            for h in handlers:
                lg.removeHandler(h)
            lg.setLevel(lvl)
            lg.propagate = prop
        for h in handlers:
            h.close()


def _path_kwargs(local_lipschitz: Any, path: str) -> dict[str, Any]:
    """``{"path": path}`` when ``local_lipschitz`` takes ``path=``; a one-line error otherwise.

    Without the option the library has one path, its stored products: ``--path auto`` (the
    default) then passes nothing, an explicit ``stored`` or ``streaming`` is refused.
    """
    try:
        takes = "path" in inspect.signature(local_lipschitz).parameters
    except (TypeError, ValueError):
        takes = False
    if takes:
        return {"path": path}
    if path != "auto":
        raise UsageError(
            f"--path {path}: this meanfield's local_lipschitz has no path= option (it always "
            "stores its n x n attention matrices); leave --path at auto"
        )
    return {}


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


def _check_text_options(args: argparse.Namespace) -> None:
    if args.n is None or args.n < 1:
        raise ValueError(f"--n must be a positive integer, got {args.n}")
    if args.start is not None and args.start < 0:
        raise ValueError(f"--start must be >= 0, got {args.start}")


#: The options of text windows, refused for a vision encoder.
_TEXT_OPTIONS = ("--corpus", "--n", "--start")


def _given(args: argparse.Namespace, options: Any) -> list[str]:
    """The ``options`` (``--image-index``, ...) given on the command line, i.e. not ``None``."""
    return [opt for opt in options if getattr(args, opt[2:].replace("-", "_"), None) is not None]


def refuse_text_options(args: argparse.Namespace, label: str, options: Any) -> None:
    """A one-line error when a text option was given for a vision encoder ``label``."""
    given = _given(args, options)
    if given:
        raise UsageError(
            f"{' '.join(given)}: {label} is a vision encoder and reads images, not text; give "
            "--images FILE.npy or nothing (synthetic images); n is fixed by the image size"
        )


def refuse_image_options(args: argparse.Namespace, label: str) -> None:
    """A one-line error when an image option was given for a model that reads token ids."""
    given = _given(args, ("--images", "--image-index"))
    if given:
        raise UsageError(
            f"{' '.join(given)}: {label} reads token ids; the image options apply to vision "
            "encoders (ViT, DeiT)"
        )


def load_images(args: argparse.Namespace, model_dir: str) -> tuple[Any, dict[str, Any]]:
    """``(array or None, normalisation)`` of ``--images`` (``None``: synthetic images).

    A ``uint8`` array is normalised with the ``image_mean`` / ``image_std`` of the checkpoint's
    ``preprocessor_config.json`` (:func:`meanfield.models.pixel_values`); the file is read with
    ``allow_pickle=False``.
    """
    import json

    import numpy as np

    if args.images is None:
        if args.image_index is not None:
            raise UsageError(
                "--image-index applies to --images FILE.npy (synthetic images: --seed)"
            )
        return None, {}
    path = Path(args.images).expanduser()
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise UsageError(f"--images {args.images}: cannot read a .npy array ({err})") from err
    if not isinstance(arr, np.ndarray):
        raise UsageError(f"--images {args.images}: expected one .npy array, not an .npz archive")
    norm: dict[str, Any] = {}
    if arr.dtype == np.uint8:
        cfg = Path(model_dir).expanduser() / "preprocessor_config.json"
        with contextlib.suppress(OSError, ValueError, TypeError):
            pre = json.loads(cfg.read_text())
            if pre.get("image_mean") is not None and pre.get("image_std") is not None:
                norm = {"image_mean": pre["image_mean"], "image_std": pre["image_std"]}
    return arr, norm


def capture_images(
    args: argparse.Namespace,
    loaded: Any,
    layer: int,
    n_images: int,
    *,
    block: bool,
    dtype: Any,
) -> Any:
    """:func:`meanfield.models.image_hidden_states` for ``--images`` / ``--image-index``."""
    from meanfield.models import image_hidden_states, pixel_values

    arr, norm = load_images(args, args.model)
    images = None
    if arr is not None:
        try:
            images = pixel_values(arr, loaded.model, name=f"--images {args.images}", **norm)
        except ValueError as err:
            raise UsageError(str(err)) from err
    index = 0 if args.image_index is None else args.image_index
    if index < 0:
        raise UsageError(f"--image-index must be >= 0, got {index}")
    log.info(
        "capturing layer %d: %d image(s) of %s",
        layer,
        n_images,
        f"--images {args.images}" if images is not None else "synthetic images",
    )
    try:
        return image_hidden_states(
            loaded.model,
            layer,
            images,
            n_images=n_images,
            index=index,
            seed=args.seed,
            label=None if args.images is None else Path(args.images).name,
            block=block,
            dtype=dtype,
            device=args.device,
        )
    except ValueError as err:
        if "holds" in str(err):
            raise UsageError(f"--image-index {index}: {err}") from err
        raise


def _layer_map(
    args: argparse.Namespace, loaded: Any, info: Any, hs: Any, t0: float, dtype: Any
) -> tuple[Any, bool, dict[str, Any]]:
    """The layer's map, its mask and the source fields shared by text and image inputs."""
    from meanfield.models import hf_attention

    log.info("captured in %.1f s (%s attention)", time.perf_counter() - t0, hs.attention)
    att = hf_attention(loaded.model, args.layer, map=args.map, dtype=dtype).to(device=args.device)
    masked = info.causal if args.masked is None else args.masked
    source = {
        "model": loaded.label,
        "model_arg": args.model,
        "layer": info.layer,
        "map": args.map,
        "module": info.module,
        "model_causal": info.causal,
    }
    return att, masked, source


def _vision_inputs(
    args: argparse.Namespace, loaded: Any, dtype: Any
) -> tuple[Any, Any, dict[str, Any], Any]:
    """(X, params or None, source, fn or None) for ``--model`` on a vision encoder."""
    from meanfield.models import layer_info

    refuse_text_options(args, loaded.label, _TEXT_OPTIONS)
    model = loaded.model
    info = layer_info(model, args.layer, map=args.map)
    t0 = time.perf_counter()
    hs = capture_images(args, loaded, info.layer, args.windows, block=False, dtype=dtype)
    att, masked, source = _layer_map(args, loaded, info, hs, t0, dtype)
    source = {
        **source,
        "images": hs.images,
        "image_indices": list(hs.indices),
        "n_prefix": hs.n_prefix,
        "capture_point": hs.capture_point,
        "rope": info.has_rope,
        "capture_attention": hs.attention,
        "positions": None,
        "masked": masked,
    }
    return hs.X, att.params, source, None


def _model_inputs(args: argparse.Namespace, dtype: Any) -> tuple[Any, Any, dict[str, Any], Any]:
    """(X, params or None, source, fn or None) for ``--model``."""
    from experiments.corpora import corpus_token_ids
    from meanfield.models import (
        hidden_states,
        layer_info,
        load_model,
        random_gpt2,
        reads_images,
    )
    from meanfield.models.standins import GPT2_POSITIONS

    if args.windows < 1:
        raise ValueError(f"--windows must be a positive integer, got {args.windows}")
    if args.model in BUILT_IN_MODELS:  # text models: the text options before loading
        refuse_image_options(args, args.model)
        _check_text_options(args)
    if args.n_layer is not None:
        if args.model != "gpt2-random":
            raise ValueError("--n-layer only applies to --model gpt2-random")
        if args.n_layer < 1:
            raise ValueError(f"--n-layer must be a positive integer, got {args.n_layer}")
        # gpt2-random grows its position table to --n beyond GPT-2's 1024 rows
        rows = args.n if args.n > GPT2_POSITIONS else None
        log.info("building gpt2-random (%d layers, seed %d)", args.n_layer, args.seed)
        loaded = random_gpt2(args.seed, n_layer=args.n_layer, n_positions=rows)
    else:
        check_model_name(args.model)
        log.info("loading %s", args.model)
        try:
            # n_positions: gpt2-random extends its table; any other model's limit is hard
            loaded = load_model(args.model, seed=args.seed, n_positions=args.n)
        except OSError as err:
            raise UsageError(
                " ".join(str(err).split()) + f"; built-in models: {', '.join(BUILT_IN_MODELS)}"
            ) from err
    model, tok = loaded.model, loaded.tokenizer
    if reads_images(model):
        return _vision_inputs(args, loaded, dtype)
    refuse_image_options(args, loaded.label)
    _check_text_options(args)
    args.corpus = "kjv" if args.corpus is None else args.corpus
    args.start = 0 if args.start is None else args.start
    info = layer_info(model, args.layer, map=args.map)
    if tok is None:
        from meanfield.models.standins import no_tokenizer_message

        raise UsageError(no_tokenizer_message(loaded.label))
    need = args.start + args.windows * args.n
    ids, corp = corpus_token_ids(args.corpus, tok, min_tokens=need)
    if ids.numel() < need:
        raise UsageError(
            f"--corpus {args.corpus} has {ids.numel()} tokens ({corp.label}); --start "
            f"{args.start} + --windows {args.windows} x --n {args.n} needs {need}"
        )
    log.info(
        "capturing layer %d: %d window(s) of %d tokens of %s",
        info.layer,
        args.windows,
        args.n,
        corp.label,
    )
    t0 = time.perf_counter()
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
    att, masked, source = _layer_map(args, loaded, info, hs, t0, dtype)
    source = {
        **source,
        "corpus": corp.label,
        "capture_point": hs.capture_point,
        "window_starts": list(hs.starts),
        "rope": info.has_rope,
        "capture_attention": hs.attention,
        "positions": loaded.provenance.get("max_positions"),
    }
    if "positions" in loaded.provenance:  # gpt2-random's extended position table
        source["position_extension"] = loaded.provenance["positions"]
    source["masked"] = masked
    if args.map == "block":
        return hs.X, None, source, functools.partial(att, masked=masked)
    return hs.X, att.params, source, None


def handle(args: argparse.Namespace) -> dict[str, Any]:
    """``meanfield lipschitz``: estimate the local constant of each input (module docstring)."""
    _check_common(args)
    with _progress_logging(args):
        return _handle(args)


def _handle(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from meanfield import local_lipschitz, local_lipschitz_fn, released_metric, self_attention

    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    path_kw = _path_kwargs(local_lipschitz, args.path)
    fn = None
    masked = bool(args.masked)
    if args.model is not None:
        X, params, source, fn = _model_inputs(args, dtype)
        mode = "model"
        masked = source.pop("masked")
    elif args.random_d is not None:
        if args.n is None or args.n < 1:
            raise ValueError(f"--n must be a positive integer, got {args.n}")
        if not (math.isfinite(args.R) and args.R > 0):
            raise ValueError(f"--R must be a positive number, got {args.R}")
        for option, count in (("--random-d", args.random_d), ("--heads", args.heads)):
            if count < 1:
                raise UsageError(f"{option} must be a positive integer, got {count}")
        params, source = random_layer(args.random_d, args.heads, args.seed, dtype, args.device)
        X = torch.tensor(
            random_tokens(args.n, args.random_d, args.R, args.seed), dtype=dtype, device=args.device
        )
        source = {**source, "tokens": "Gaussian, rescaled to max norm R", "R": args.R}
        mode = "random"
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
    batch = X.reshape(-1, X.shape[-2], X.shape[-1])
    if fn is not None and args.geometry != "euclidean":
        raise ValueError(
            "--map block supports --geometry euclidean only (the map is not attention on a measure)"
        )
    if fn is None:
        fn = functools.partial(self_attention, params=params, masked=masked)
    rows = []
    for i in range(batch.shape[0]):
        Xi = batch[i]
        log.info("input %d/%d: estimating (n = %d, d = %d)", i + 1, batch.shape[0], *Xi.shape[-2:])
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
                **path_kw,
            )
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        path = getattr(est, "path", None)
        log.info(
            "input %d/%d: %.6g in %.1f s%s",
            i + 1,
            batch.shape[0],
            float(est.value),
            seconds,
            "" if path is None else f" ({path} products)",
        )
        lower, upper = float(est.lower), float(est.upper)
        up = None if est.upper_prob is None else float(est.upper_prob)
        row = {
            "index": i,
            "value": float(est.value),
            "lower": lower,
            "upper": upper,
            "ratio": upper / lower if lower > 0 else math.inf,
            "upper_prob": up,
            "ratio_prob": None if up is None else (up / lower if lower > 0 else math.inf),
            "confidence": est.confidence,
            "stop_rule": getattr(est, "stop_rule", "residual"),
            "converged": bool(est.converged),
            "n_matvec": int(est.n_matvec),
            "n_iter": int(est.n_iter),
            "residual": float(est.residual),
            "method": est.method,
            "upper_method": est.upper_method,
            "path": None if path is None else str(path),
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
        "path": args.path,
        "dtype": args.dtype,
        "device": args.device,
        "inputs": rows,
        "all_converged": all(r["converged"] for r in rows),
    }
    if args.out:
        doc["files"] = [str(write_record(args.out, doc, args))]
    return doc


def _image_word(indices: list[int]) -> str:
    """``image 3`` or ``images 0, 1``."""
    return f"image{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"


def show(doc: dict[str, Any]) -> None:
    """Human-readable summary of ``meanfield lipschitz``."""
    src = doc["source"]
    if doc["mode"] == "model":
        what = f"{src['model']}, layer {src['layer']}, map {src['map']}"
        if "images" in src:
            what += f", {src['images']} ({_image_word(src['image_indices'])})"
    elif doc["mode"] == "random":
        what = f"random layer d = {src['random_d']}, {src['heads']} head(s), R = {src['R']}"
    else:
        what = f"{src['input']} with {src['params']}"
    print(
        f"local Lipschitz constant ({doc['geometry']}, {'masked' if doc['masked'] else 'unmasked'}), "
        f"{what}, n = {doc['n']}, d = {doc['d']}"
    )
    released = any("released_metric" in r for r in doc["inputs"])
    prob = any(r.get("upper_prob") is not None for r in doc["inputs"])
    paths = any(r.get("path") is not None for r in doc["inputs"])
    head = f"  {'#':>3} {'value':>12} {'certified bracket':>27} {'up/low':>7}"
    if prob:
        head += f" {'upper_prob':>11} {'/low':>6}"
    head += f" {'conv':>5} {'matvec':>6} {'sec':>7}"
    if paths:
        head += f" {'path':>9}"
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
        if paths:
            line += f" {r.get('path') or '':>9}"
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
def add_image_options(p: Any, synthetic: str, index_help: str) -> None:
    """Add ``--images`` (default: ``synthetic``) and ``--image-index`` (``index_help``)."""
    p.add_argument(
        "--images",
        metavar="FILE.npy",
        help="vision encoders (ViT, DeiT): images (N, C, H, W) or (N, H, W, C), float pixel "
        "values already normalised, or uint8 raw pixels normalised with the checkpoint's "
        f"preprocessor_config.json (default: {synthetic}, seeded Gaussian pixels)",
    )
    p.add_argument("--image-index", type=int, help=index_help)


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
    src.add_argument("--random-d", type=int, metavar="D", help="random synthetic layer of width D")
    src.add_argument("--input", metavar="X.npy", help="tokens (n, d) or (B, n, d) from a .npy file")
    m = p.add_argument_group("model mode")
    m.add_argument("--layer", type=int, default=0, help="layer index (default 0)")
    m.add_argument("--corpus", help="kjv, pydoc or a text file (default kjv)")
    m.add_argument(
        "--windows",
        type=int,
        default=1,
        help="number of windows (vision encoders: of images; default 1)",
    )
    m.add_argument("--start", type=int, help="token offset of the first window (default 0)")
    add_image_options(m, "synthetic images", "first image of --images (default 0)")
    m.add_argument(
        "--map",
        choices=("heads", "heads+WO", "block"),
        default="heads+WO",
        help="differentiated map (default heads+WO; block: BERT residual + LayerNorm)",
    )
    m.add_argument(
        "--n-layer", type=int, help="layers of gpt2-random (fewer is faster; default 12)"
    )
    r = p.add_argument_group("random mode")
    r.add_argument("--heads", type=int, default=1, help="number of heads (default 1)")
    r.add_argument("--R", type=float, default=1.0, help="largest token norm (default 1)")
    f = p.add_argument_group("input-file mode")
    f.add_argument("--params", metavar="P.npz", help="layer arrays A, V, W_O, b_O, c, b (.npz)")
    p.add_argument(
        "--n",
        type=int,
        help="tokens per window / sequence (not for vision encoders: 1 + patches there)",
    )
    mask = p.add_mutually_exclusive_group()
    mask.add_argument(
        "--masked",
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
        help="stop on the residual rule ||J^T J v - s^2 v|| <= tol s^2 instead (default: stop "
        "once the probabilistic bracket is within --prob-rtol; 1e-6 where there is none)",
    )
    p.add_argument(
        "--prob-rtol",
        type=float,
        help="stop once upper_prob <= (1 + prob-rtol) * lower, the bracket that holds with "
        "probability 1 - 1e-6 over the random start (default 0.05 where the estimate has one)",
    )
    p.add_argument(
        "--dtype",
        choices=("float64", "float32"),
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
        "--path",
        choices=_PATHS,
        default="auto",
        help="Jacobian products: stored (n x n attention matrices), streaming (memory linear in "
        "n) or auto (streaming when the stored ones would exceed the library's memory budget; "
        "default)",
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
    p.add_argument("--out", metavar="FILE.json", help="write the result with run metadata")
    p.add_argument(
        "--log", metavar="FILE", help="also append the progress lines, with timestamps, to FILE"
    )
    p.set_defaults(handler=handle, printer=show)
    return p
