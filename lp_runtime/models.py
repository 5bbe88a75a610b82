"""Model and tokenizer loading (HuggingFace id or folder, GGUF file, bundled SmolLM2), the model's identity
(``model_id``), whether its weights fit the device (``fit_problem``) and ``model.dtype=auto``."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
from typing import TYPE_CHECKING, Callable, Optional

import torch

from lp_runtime.bundled import (  # noqa: F401  (ModelLoadError, cache_root: re-exported)
    BUNDLED_PREFIX, ModelLoadError, bundled_cache, bundled_gguf, cache_root, convert_quietly,
)
from lp_runtime.config import ConfigError, ModelConfig
from lp_runtime import distributed, latency
from lp_runtime.checks import check_device

if TYPE_CHECKING:  # imported where a model loads: a run that refuses, or has nothing to do, never pays ~5 s for it
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda:$LOCAL_RANK`` (default 0) when CUDA is available, else ``cpu``; other values as given."""
    if device == "auto":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a named ``model.dtype``; ``ConfigError`` for ``auto`` or an unknown name."""
    if dtype == "auto" or not isinstance(getattr(torch, str(dtype), None), torch.dtype):
        raise ConfigError(f"model.dtype={dtype!r} has no torch dtype here; use float32, bfloat16 or float16")
    return getattr(torch, dtype)


def load_model(cfg: ModelConfig, *, step_seconds: Optional[Callable[[PreTrainedModel], float]] = None,
               free_bytes: Optional[int] = None,
               progress: bool = True,
               weight_bars: Optional[bool] = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) named by ``cfg``, in ``cfg.dtype`` on ``cfg.device``, in eval mode, with
    ``model.lp_model_id = model_id(cfg)``. ``model.dtype=auto``: ``_auto_dtype``, timing a step with
    ``step_seconds(model)``. ``free_bytes``: the device's free memory (default: asked). ``progress=False``: no
    progress bar (the bundled model's one-time conversion, downloads, and transformers' "Loading weights" unless
    ``weight_bars`` (default ``progress``) says otherwise); the switches are as they were afterwards.

    Raises ``ConfigError`` for an unknown device, ``ModelLoadError`` naming the path when it cannot be loaded or
    its weights do not fit the device's free memory (checked before anything loads)."""
    check_model_config(cfg)
    device = resolve_device(cfg.device)
    if cfg.dtype == "auto":
        cfg = dataclasses.replace(cfg, dtype=_auto_dtype(cfg, device, step_seconds, free_bytes, progress,
                                                         weight_bars))
    problem = fit_problem(cfg, device, cfg.dtype, free_bytes)
    if problem:
        raise ModelLoadError(problem)

    kwargs = dict(dtype=resolve_dtype(cfg.dtype), attn_implementation=cfg.attn_implementation,
                  trust_remote_code=cfg.trust_remote_code)
    try:
        with _progress_bars(weights=progress if weight_bars is None else weight_bars, downloads=progress):
            if cfg.path.startswith(BUNDLED_PREFIX):
                tokenizer, model = _load_bundled(cfg.path[len(BUNDLED_PREFIX):], kwargs, progress)
            else:
                tokenizer, model = _load_hf(cfg.path, cfg.gguf_file, kwargs)
    except ImportError as e:  # flash_attention_2 or a hub kernel whose package is not installed here
        if cfg.attn_implementation in ("sdpa", "eager"):
            raise
        raise ModelLoadError(f"model.attn_implementation={cfg.attn_implementation!r} cannot be loaded here: "
                             f"{_first_line(e)}; use sdpa (the default) or eager") from e
    model.to(device)
    model.eval()
    model.lp_model_id = model_id(cfg)
    return model, tokenizer


@contextlib.contextmanager
def _progress_bars(weights: bool, downloads: bool):
    """transformers' per-tensor "Loading weights" bars and the hub's download bars off inside where False (on where
    True, as far as the environment allows), then as they were."""
    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    was_on, hub_off = hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()
    if not weights:
        hf_logging.disable_progress_bar()  # the hub's too
    if downloads and not hub_off:
        hub.enable_progress_bars()
    elif not downloads:
        hub.disable_progress_bars()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()  # the hub's too
        (hub.disable_progress_bars if hub_off else hub.enable_progress_bars)()


def check_model_config(cfg: ModelConfig, *, device: bool = True) -> None:
    """What can be checked of ``cfg`` without loading the model (``ConfigError`` / ``ModelLoadError``): the device
    (unless ``device`` is False: a sweep's jobs may run on other machines, e.g. Slurm's GPU nodes), the attention
    implementation, a local ``model.path`` that is no folder, the model's files. A run checks it before it compares
    a resumed file's settings, so a bad value is named as bad, not as another setting."""
    if device:
        check_device(cfg.device)
    check_attn_implementation(cfg.attn_implementation)
    check_local_path(cfg.path)
    check_model_files(cfg)


def check_attn_implementation(name: str) -> None:
    """``ConfigError`` unless ``name`` is "eager", in transformers' ``AttentionInterface`` or a hub kernel
    ("org/repo")."""
    if name in ("sdpa", "eager"):  # the usual ones: no transformers import (a refused resume stays fast)
        return
    from transformers import AttentionInterface

    known = ["eager", *AttentionInterface().valid_keys()]
    if name not in known and "/" not in name:
        raise ConfigError(f"model.attn_implementation={name!r} is not allowed; use one of {', '.join(known)} "
                          "(or a hub kernel 'org/repo')")


DTYPE_ROUNDS = 3  # model.dtype=auto: float32 and bfloat16 timed in turn this many times


def _auto_dtype(cfg: ModelConfig, device: torch.device, step_seconds: Optional[Callable],
                free_bytes: Optional[int], progress: bool = True, weight_bars: Optional[bool] = None) -> str:
    """``latency.choose_dtype`` from float32 and bfloat16 greedy step times (default ``latency.measure_latency`` at
    q = 1), or bfloat16 unmeasured when float32 does not fit. Under torchrun rank 0 decides for every rank."""
    if fit_problem(cfg, device, "float32", free_bytes):
        print("model.dtype=auto: bfloat16, since the float32 weights would not fit", flush=True)
        return "bfloat16"

    def timings():  # interleaved rounds, the fastest of each dtype: a burst of load decides nothing alone
        timer = step_seconds or (lambda m: latency.measure_latency(m, (1,), reps=5, warmup=2)[1])
        model, _ = load_model(dataclasses.replace(cfg, dtype="float32"), free_bytes=free_bytes, progress=progress,
                              weight_bars=weight_bars)
        out: dict[str, float] = {}
        for _ in range(DTYPE_ROUNDS):  # this copy is only timed: bfloat16 -> float32 and back loses nothing needed
            for name in latency.DTYPES_TIMED:
                out[name] = min(out.get(name, math.inf), timer(model.to(getattr(torch, name))))
        return out

    return distributed.from_rank0(lambda: latency.choose_dtype(model_id(cfg), latency.device_key(device), timings,
                                                               method=f"interleaved-{DTYPE_ROUNDS}"),
                                  timeout_s=1800.0)


_GB = 1e9
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def weight_bytes(cfg: ModelConfig, dtype: str) -> Optional[tuple[int, int]]:
    """(parameters, bytes of the weights in ``dtype``), counted on the meta device; None for the bundled model, a
    GGUF file, or a config that cannot be read."""
    if cfg.path.startswith(BUNDLED_PREFIX) or cfg.gguf_file:
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(cfg.path), trust_remote_code=cfg.trust_remote_code)
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
    except Exception:  # no config to count from: the load itself reports what is wrong
        return None
    params = sum(p.numel() for p in meta.parameters())
    return params, params * _BYTES[dtype]


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device``: ``torch.cuda.mem_get_info`` on a GPU, available RAM on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fit_problem(cfg: ModelConfig, device: torch.device, dtype: str, free_bytes: Optional[int] = None,
                ranks: Optional[int] = None) -> Optional[str]:
    """None when ``ranks`` replicas (default: ``LOCAL_WORLD_SIZE`` on a CPU, 1 on a GPU) of the weights in ``dtype``
    fit the device's free memory (``free_bytes``, default ``free_memory``), else one line naming both and what
    would fit. Counts weights only."""
    counted = weight_bytes(cfg, dtype)
    if counted is None:
        return None
    params, need = counted
    if ranks is None:
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1
    free = free_memory(device) if free_bytes is None else int(free_bytes)
    if need * ranks <= free:
        return None
    each = f" per rank x {ranks} ranks on this node" if ranks > 1 else ""
    fits = [f"model.dtype={d} ({params * b / _GB:.1f} GB{each})" for d, b in _BYTES.items()
            if b < _BYTES[dtype] and params * b * ranks <= free and d != "float16"]
    if ranks > 1 and need <= free:
        fits.append(f"at most {free // need} ranks on this node (torchrun --nproc-per-node={free // need})")
    hint = ("what would fit: " + " or ".join(fits)) if fits else (
        "no replica fits one device in any dtype; a model this size needs its layers split over devices, and "
        "lookahead parallelism over tensor-parallel groups is future work")
    return (f"model.path={cfg.path!r} needs {need / _GB:.1f} GB for its weights in {dtype} ({params / 1e9:.2f} B "
            f"parameters){each}, but {device} has {free / _GB:.1f} GB free; {hint}")


_CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_EDGE_BYTES = 1 << 20  # bytes read from each end of a weight file


def model_fingerprint(cfg: ModelConfig) -> str:
    """16 hex digits of what ``cfg`` loads, from its files without loading them: config and tokenizer files whole,
    each weight file's name, size and first and last MiB. The bundled model by its GGUF, a HuggingFace id by its
    cached snapshot (an uncached id by the id alone); not dtype nor device."""
    h = hashlib.sha256()
    if cfg.path.startswith(BUNDLED_PREFIX):
        try:
            folder, gguf_file, _ = bundled_gguf(cfg.path[len(BUNDLED_PREFIX):])
            _hash_file(h, os.path.join(folder, gguf_file), whole=False)
        except ModelLoadError:
            h.update(cfg.path.encode())
        return h.hexdigest()[:16]
    folder = os.path.expanduser(cfg.path)
    folder = folder if os.path.isdir(folder) else _hf_snapshot(cfg.path)
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
    """Label of the loaded model in answers and reports: ``model.name`` when set, else ``model_id(cfg)``."""
    return f"{cfg.name}-{fingerprint[:8]}" if cfg.name else model_id(cfg, fingerprint)


def model_id(cfg: ModelConfig, fingerprint: Optional[str] = None) -> str:
    """The model's identity, e.g. ``smollm2-1a2b3c4d``: the last part of ``model.path`` plus 8 digits of
    ``model_fingerprint``. The latency profile is keyed by it and the answers record it."""
    stem = cfg.path.rstrip("/").replace(BUNDLED_PREFIX, "").split("/")[-1] or "model"
    return f"{stem}-{(fingerprint or model_fingerprint(cfg))[:8]}"


def model_id_of(model: PreTrainedModel) -> str:
    """``model.lp_model_id``, else ``model_id`` of ``config._name_or_path``, else (built in memory) the model
    type plus 8 digits of a hash of its config."""
    if getattr(model, "lp_model_id", None):
        return model.lp_model_id
    path = str(getattr(model.config, "_name_or_path", "") or "")
    if path:
        return model_id(ModelConfig(path=path))
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("dtype", "torch_dtype")}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    return f"{model.config.model_type}-{digest[:8]}"


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


def check_model_files(cfg: ModelConfig) -> None:
    """``ModelLoadError`` naming the key, value and the folder's .gguf files, for a folder with neither
    ``config.json`` nor the GGUF file asked for, a ``model.gguf_file`` missing from the folder (or the cached
    snapshot), a ``model.gguf_file`` with the bundled model, or a HuggingFace id neither cached nor reachable
    (``hub_unreachable``; not asked when ``HF_HUB_OFFLINE`` is set)."""
    gguf = cfg.gguf_file
    if cfg.path.startswith(BUNDLED_PREFIX):
        if gguf:
            raise ModelLoadError(
                f"model.gguf_file={gguf!r} is not used with model.path={cfg.path!r} (the bundled model is its own "
                "GGUF); leave model.gguf_file unset, or set model.path to the folder that holds that file")
        return
    folder = os.path.expanduser(cfg.path)
    if not os.path.isdir(folder):
        cached = _hf_snapshot(cfg.path)
        down = None if cached or _hub_offline() or _looks_local(cfg.path) else hub_unreachable(cfg.path)
        if down:  # one request, not the download's ~100 s of retries
            raise ModelLoadError(f"model.path={cfg.path!r} is neither a local folder nor a model in the HuggingFace "
                                 f"cache, and the HuggingFace hub cannot be reached ({down}); download the model "
                                 "where there is a network, or use a local folder or bundled:smollm2")
        folder = cached if gguf else None  # an id not in the cache is checked by its download
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


def _looks_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or (os.sep != "/" and os.sep in path)


def check_local_path(path: str) -> None:
    """``ModelLoadError`` for a ``model.path`` that can only be a local folder (a HuggingFace id is "name" or
    "namespace/name") and is not one; a sweep checks every job's with it before job 0 runs."""
    if _looks_local(path) and not os.path.isdir(os.path.expanduser(path)):
        what = "is a file, not a model folder" if os.path.exists(os.path.expanduser(path)) else \
            "is not an existing folder"
        raise ModelLoadError(f"model.path={path!r} {what}. Use a local folder, a HuggingFace id, or bundled:smollm2"
                             + (" (a .gguf file: its folder as model.path, its name as model.gguf_file)"
                                if path.endswith(".gguf") else ""))


def _load_bundled(name: str, kwargs: dict, progress: bool = True):
    """(tokenizer, model) from ``bundled.bundled_cache(name)`` (converted quietly unless ``progress``). A copy
    damaged after its check (same sizes, other bytes) raises ``ModelLoadError`` naming the folder to delete; an
    ``ImportError`` (an attention package) passes through."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = bundled_cache(name) if progress else bundled_cache(name, convert=convert_quietly)
    try:
        return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - damaged files fail in many ways (SafetensorError, JSONDecodeError)
        raise ModelLoadError(f"the cached copy of bundled:{name} in {folder} could not be loaded ({_first_line(e)}); "
                             "delete that folder and run again: it is converted again from the bundled GGUF") from e


def _first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type's name when empty), without a final full stop."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no")


def hub_unreachable(repo_id: str) -> Optional[str]:
    """Why the HuggingFace hub (``HF_ENDPOINT``) cannot be reached for ``repo_id``, from ONE request of at most
    10 s, or None when it answered (found or not; the download then says which). Without this, an unreachable hub
    cost ~100 s of retries and two dozen warnings before the load failed (a new user, 2026-12-03)."""
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(repo_id, timeout=10)
    except Exception as e:  # noqa: BLE001 - the hub's client raises its HTTP library's own transport errors
        names = {c.__name__ for c in type(e).__mro__}
        if names & {"TransportError", "ConnectionError", "Timeout", "TimeoutException", "ConnectError"}:
            return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def _load_hf(path: str, gguf_file: Optional[str], kwargs: dict):
    check_local_path(path)
    local = os.path.expanduser(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, trust_remote_code=kwargs["trust_remote_code"], **extra)
        model = AutoModelForCausalLM.from_pretrained(local, **kwargs, **extra)
    except Exception as e:  # noqa: BLE001 - a local folder's files fail in many ways (ValueError, SafetensorError)
        if isinstance(e, ImportError) or not (isinstance(e, OSError) or os.path.isdir(local)):
            raise  # ImportError: a missing attention package, named by load_model
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        reason = (" ".join(lines)[:400] if lines[0].endswith(":") else lines[0]).rstrip(".")  # "one of:" + a list
        what = f"model.path={path!r}" + (f" with model.gguf_file={gguf_file!r}" if gguf_file else "")
        if os.path.isdir(local):
            bad_json = None if gguf_file else _unparsable_json(local)  # a GGUF load reads no JSON file of the folder
            if bad_json:
                name, error = bad_json
                raise ModelLoadError(f"{what} is a local folder whose {name} is not valid JSON ({error}); replace "
                                     "that file with the model's own (download or save_pretrained the model "
                                     "again)") from e
            raise ModelLoadError(f"{what} is a local folder but could not be loaded: {reason}; check that its files "
                                 "are complete (download or save_pretrained the model again)") from e
        hint = ("HF_HUB_OFFLINE is set, so nothing is downloaded: download the model where there is a network, or"
                if _hub_offline() else "Without a network, download the model where there is one, or")
        raise ModelLoadError(
            f"{what} is neither a local folder nor a model in the HuggingFace cache, and it could not be "
            f"downloaded: {reason}. {hint} use a local folder or bundled:smollm2"
        ) from e
    return tokenizer, model


def _unparsable_json(folder: str) -> Optional[tuple[str, str]]:
    """(name, parser error) of the first ``*.json`` file in ``folder`` that is not valid UTF-8 JSON (config and
    tokenizer files first), or None. Asked after a load failed: transformers' error may name no file."""
    names = sorted((n for n in os.listdir(folder) if n.endswith(".json")), key=lambda n: (n not in _CONFIG_FILES, n))
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                json.load(f)
        except OSError:  # unreadable, or not a file: not the JSON this looks for
            continue
        except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
            return name, str(e)
    return None
