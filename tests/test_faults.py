"""Issue 11: ten faults, each input plus more of its kind; the reference is transformers' ``generate``.

Tiny random models (``initializer_range`` 0.3, so positions and masks move the argmax) run in seconds. Where a
case needs given tokens, ``ForcedLM`` replaces a tiny Llama's logits by a successor table.
"""
from __future__ import annotations

import json
import math
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoTokenizer, BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, GPT2Config, GPT2LMHeadModel,
    MistralConfig, MistralForCausalLM, MptConfig, MptForCausalLM, Phi3Config,
    Phi3ForCausalLM,
)

from lp_runtime import checks
from lp_runtime.api import LookaheadGenerator
from lp_runtime.config import (ConfigError, DatasetConfig, DecodingConfig, GenerationConfig, ModelConfig,
                               ModelOutputError, OutputConfig, RunConfig, SamplingConfig)
from lp_runtime.decoder import Decoder
from lp_runtime.stopping import StopChecker

from exactness import hf_greedy
from fakes import TINY, V, ForcedLM, char_tokenizer, llama, lookahead

REPO = Path(__file__).resolve().parents[1]
LOOK = lookahead(window_size=3, ngram_size=3, guess_set_size=2)
SETTINGS = [DecodingConfig(method="greedy"), lookahead(window_size=2, ngram_size=4, guess_set_size=2),
            lookahead(window_size=5, ngram_size=4, guess_set_size=3)]


# ------------------------------------------------------------------------- 1. stop strings over many tokens
@pytest.fixture(scope="module")
def smol_tokenizer(tiny_model_dir):
    """SmolLM2's tokenizer, as conftest's tiny model folder holds it (read from the GGUF at most once per run)."""
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("stop", ["😀", "日本語", "नमस्ते", "Привет"])
def test_1_stop_string_spanning_several_tokens(smol_tokenizer, stop):
    tok = smol_tokenizer
    text = f" say {stop} then more words follow here"
    seq = tok(text, add_special_tokens=False).input_ids
    assert len(set(seq)) == len(seq)  # a successor table needs distinct tokens
    assert len(tok(stop, add_special_tokens=False).input_ids) >= 2  # the stop string spans several tokens
    model = ForcedLM(len(tok), {a: b for a, b in zip(seq, seq[1:])})
    # Reference: the first output prefix whose text contains the stop string.
    out_seq = seq[1:]
    want = next(out_seq[:k] for k in range(1, len(out_seq) + 1) if stop in tok.decode(out_seq[:k]))
    prompt = seq + [seq[0]]  # the prompt pool proposes the whole run: steps accept several tokens
    for setting in SETTINGS:
        dec = Decoder(model, setting, eos_token_ids=[], tokenizer=tok)
        out = dec.generate(prompt, max_new_tokens=12, stop_strings=[stop])
        assert out.output_ids == want and out.finish_reason == "stop", setting
        if setting.method == "lookahead":  # the stop string began inside the same step's accepted run
            assert out.decoding_steps < len(want)


def test_1_stop_string_checker_token_by_token(smol_tokenizer):
    tok = smol_tokenizer
    ids = tok("ab 日本語 cd", add_special_tokens=False).input_ids
    s = StopChecker(50, stop_strings=["日本語"], tokenizer=tok)
    emitted = s.push(ids)  # one run: the stop string starts in an earlier token of the same run
    assert tok.decode(emitted).endswith("日本語") and s.finish_reason == "stop"
    s = StopChecker(50, stop_strings="日本", tokenizer=tok)  # a single string is one stop string
    for t in ids:
        s.push([t])
    assert "日本" in tok.decode(s.output) and s.finish_reason == "stop"


# ------------------------------------------------------------------------- 2. length-dependent rope
def phi3_longrope():
    torch.manual_seed(0)
    cfg = Phi3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128, original_max_position_embeddings=32,
                     initializer_range=0.3, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                     rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [24.0] * 4,
                                      "original_max_position_embeddings": 32, "rope_theta": 10000.0})
    return Phi3ForCausalLM(cfg).eval()


def llama_dynamic():
    return llama(max_position_embeddings=32, rope_parameters={"rope_type": "dynamic", "factor": 4.0,
                                                              "rope_theta": 10000.0})


@pytest.mark.parametrize("make, kind", [(phi3_longrope, "longrope"), (llama_dynamic, "dynamic")])
def test_2_length_dependent_rope(make, kind):
    model = make()
    arch = type(model).__name__
    prompt = [(7 * i + 3) % V for i in range(26)]
    for setting in SETTINGS:
        dec = Decoder(model, setting)
        with pytest.raises(ConfigError) as err:
            dec.generate(prompt, max_new_tokens=30)
        assert str(err.value) == (
            f"{arch} (model_type {model.config.model_type!r}) uses rope scaling {kind!r}, whose frequencies change "
            "once the sequence passes 32 tokens; this prompt plus max_new_tokens may reach 56 tokens. lp_runtime "
            "decodes such models exactly up to 32 tokens: shorten the prompt or lower max_new_tokens")
        # Up to the limit: exactly generate's tokens, though the window and candidates would reach past 32.
        out = dec.generate(prompt, max_new_tokens=6)
        assert out.output_ids == hf_greedy(model, prompt, 6), setting
    assert checks.position_limit(model) == 32


# ------------------------------------------------------------------------- 3. attention that ignores the tree
def _bloom():
    return BloomForCausalLM(BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4, initializer_range=0.3))


def _falcon_alibi():
    return FalconForCausalLM(FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          alibi=True, initializer_range=0.3))


def _mpt():
    return MptForCausalLM(MptConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_seq_len=128,
                                    initializer_range=0.3))


ALIBI = "it uses ALiBi attention biases, built from cache indices rather than position_ids"
PROBE = "a tree step's logits differ from plain decoding by"
SUPPORTED = ("Supported: models whose attention takes explicit position_ids and a float 4D attention mask (rotary "
             "or learned absolute positions: Llama, Mistral, Qwen2, Phi-3, Gemma, GPT-2, ...); ALiBi models (BLOOM, "
             "MPT, Falcon with alibi=True) are not")


class NoPositionIds(torch.nn.Module):
    """A tiny Llama whose forward drops ``position_ids`` (positions then follow the cache, as in BLOOM-like code)."""

    def __init__(self):
        super().__init__()
        self.inner = llama()
        self.config = self.inner.config

    @property
    def dtype(self):
        return self.inner.dtype

    def forward(self, position_ids=None, **kwargs):
        return self.inner(**kwargs)


@pytest.mark.parametrize("make, arch, problem", [
    (_bloom, "BloomForCausalLM (model_type 'bloom')", ALIBI),
    (_falcon_alibi, "FalconForCausalLM (model_type 'falcon')", ALIBI),
    (_mpt, "MptForCausalLM (model_type 'mpt')", ALIBI),
    (NoPositionIds, "NoPositionIds (model_type 'llama')", PROBE),
])
def test_3_architectures_ignoring_the_tree_refused_at_construction(make, arch, problem):
    torch.manual_seed(0)
    model = make().eval()
    with pytest.raises(ConfigError) as err:
        Decoder(model, lookahead(window_size=3, ngram_size=3, guess_set_size=2))
    msg = str(err.value)
    assert msg.startswith(f"{arch} is not supported by lp_runtime: {problem}") and msg.endswith(SUPPORTED)


def test_3_probe_alone_catches_alibi_and_crashes():
    # Without the ALiBi name list, the float32 probe still refuses them: BLOOM and Falcon crash inside their
    # attention on a 4D tree mask; MPT's bias follows cache indices, so the tree step's logits move.
    for make, problem in ((_bloom, "a tree step fails inside the model (ValueError: too many values to unpack"),
                          (_mpt, PROBE)):
        torch.manual_seed(0)
        assert checks._probe(make().eval(), alibi_types=()).startswith(problem)
    torch.manual_seed(0)
    falcon = _falcon_alibi().eval()
    falcon.config.alibi = False  # the name check reads the config; the model still builds ALiBi biases
    falcon.transformer.use_alibi = True
    assert checks._probe(falcon).startswith("a tree step fails inside the model")


def test_3_supported_architectures_pass_the_probe_and_match_generate():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      initializer_range=0.3, bos_token_id=None, eos_token_id=None)).eval()
    torch.manual_seed(0)
    falcon = FalconForCausalLM(FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            alibi=False, initializer_range=0.3, bos_token_id=None,
                                            eos_token_id=None)).eval()
    prompt = [5, 6, 7, 5, 6, 8, 9, 5, 6]
    for model in (gpt2, falcon):
        out = Decoder(model, lookahead(window_size=3, ngram_size=3, guess_set_size=2)).generate(
            prompt, max_new_tokens=20)
        assert out.output_ids == hf_greedy(model, prompt, 20)


# ------------------------------------------------------------------------- 4. ids outside the vocabulary
@pytest.mark.parametrize("prompt, bad, index", [([5, 96, 7], 96, 1), ([-1, 5, 6], -1, 0), ([5, 6, 10**12], 10**12, 2)])
def test_4_token_ids_outside_vocabulary(prompt, bad, index):
    model = ForcedLM(V, {})
    dec = Decoder(model, LOOK)
    gen = LookaheadGenerator(model, None, LOOK, GenerationConfig(max_new_tokens=4, eos_token_ids=[]))
    calls = model.calls
    message = f"prompt token id {bad} (at index {index}) is outside the model's vocabulary of 96 ids (0..95)"
    for call in (lambda: dec.generate(prompt, max_new_tokens=4), lambda: gen.generate(prompt)):
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value) == message
    assert model.calls == calls  # refused before any forward pass
    with pytest.raises(ConfigError, match=r"prompt token 1 is 2.5; token ids must be integers"):
        gen.generate([1, 2.5])
    # A real embedding: its row count is the bound (a tokenizer may know more ids than the model).
    real = llama(vocab_size=50)
    with pytest.raises(ConfigError, match=r"prompt token id 50 \(at index 0\) is outside the model's vocabulary of 50"):
        Decoder(real, LOOK).generate([50], max_new_tokens=2)


# ------------------------------------------------------------------------- 5. max_new_tokens = 0
def test_5_max_new_tokens_zero_is_refused_everywhere():
    model = ForcedLM(4096, {})
    gen = LookaheadGenerator(model, None, LOOK, GenerationConfig(max_new_tokens=16, eos_token_ids=[]))
    for n in (0, -3):
        with pytest.raises(ConfigError) as err:
            gen.generate([1, 504, 3250], max_new_tokens=n)
        assert str(err.value) == f"max_new_tokens={n} is not allowed; it must be >= 1"
        with pytest.raises(ConfigError) as err:
            Decoder(model, LOOK).generate([1, 504, 3250], max_new_tokens=n)
        assert str(err.value) == f"max_new_tokens={n} is not allowed; it must be >= 1"
        with pytest.raises(ConfigError, match=f"generation.max_new_tokens={n} is not allowed; it must be an integer"):
            GenerationConfig(max_new_tokens=n)
    with pytest.raises(ConfigError, match=r"max_new_tokens=True is not allowed; it must be an integer >= 1"):
        gen.generate([1, 504, 3250], max_new_tokens=True)
    assert gen.generate([1, 504, 3250]).output_ids == list(range(3251, 3267))  # None = the generator's 16
    assert gen.generate([1, 504, 3250], max_new_tokens=1).output_ids == [3251]


# ------------------------------------------------------------------------- 6. NaN / inf logits
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0)], ids=["greedy", "sample"])
@pytest.mark.parametrize("setting", SETTINGS[:2], ids=["plain", "lookahead"])
def test_6_nan_logits_raise_naming_step_and_position(sampling, setting):
    model = llama()
    with torch.no_grad():
        model.lm_head.weight.fill_(math.nan)
    with pytest.raises(ModelOutputError) as err:
        Decoder(model, setting, sampling=sampling).generate([3, 4, 5, 6], max_new_tokens=4)
    assert str(err.value).startswith("the model's logits are not finite (NaN or inf) at decoding step 1, sequence "
                                     "position 3 (the logits choosing new token 4)")
    # Of the same kind: NaN only after token 40, at step 4 (greedy; a forced model), and +inf.
    forced = ForcedLM(V, {}, nan_after=[40])
    for s in SETTINGS[:2]:
        with pytest.raises(ModelOutputError, match=r"at decoding step 4, sequence position 10 "):
            Decoder(forced, s, sampling=sampling).generate([30, 31, 32, 33, 34, 35, 36, 37], max_new_tokens=10)
    inf = llama()
    with torch.no_grad():
        inf.lm_head.weight[7].fill_(math.inf)
    with pytest.raises(ModelOutputError, match="at decoding step 1,"):
        Decoder(inf, setting, sampling=sampling).generate([3, 4, 5], max_new_tokens=4)


def test_6_nan_in_the_main_job_writes_no_answer(tmp_path):
    from lp_runtime.generate import run

    model_dir = _save_tiny_with_tokenizer(tmp_path, nan=True)
    cfg = RunConfig(model=ModelConfig(name="nan", path=str(model_dir)), decoding=LOOK,
                    generation=GenerationConfig(max_new_tokens=4),
                    dataset=DatasetConfig(name="jsonl", path=str(_questions(tmp_path))),
                    output=OutputConfig(path=str(tmp_path / "out" / "answers.jsonl")), progress=False)
    with pytest.raises(ModelOutputError, match=r"^question 1, turn 1: the model's logits are not finite"):
        run(cfg)
    out = tmp_path / "out" / "answers.jsonl"
    assert not out.exists() or out.read_text() == ""  # the job stops; no line for the question


# ------------------------------------------------------------------------- 7. the model's generation defaults
def _with_defaults(**gen):
    model = llama()
    for k, v in gen.items():
        setattr(model.generation_config, k, v)
    return model


PROMPT7 = [5, 6, 7, 5, 6, 7, 5, 6]


@pytest.mark.parametrize("gen", [{"repetition_penalty": 1.3}, {"suppress_tokens": [59, 94]},
                                 {"repetition_penalty": 1.5, "suppress_tokens": [3]}])
def test_7_sampling_model_applies_generation_config(gen):
    model = _with_defaults(**gen)
    # generate with no arguments applies the model's generation_config
    ids = torch.tensor([PROMPT7])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, pad_token_id=0)[0, 8:].tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sampling=model: nothing unapplied, no warning
        for setting in SETTINGS:
            out = Decoder(model, setting, sampling=SamplingConfig(from_model=True)).generate(PROMPT7, max_new_tokens=16)
            assert out.output_ids == want, setting
            assert {k: getattr(out.sampling, k) for k in gen} == gen  # the settings as applied
    plain = hf_greedy(model, PROMPT7, 16, repetition_penalty=1.0, suppress_tokens=None)
    assert plain != want  # the defaults change the output: ignoring them silently would be visible


def test_7_default_warns_once_and_unsupported_is_refused_by_name():
    model = _with_defaults(repetition_penalty=1.3, suppress_tokens=[11])
    with pytest.warns(UserWarning) as rec:
        Decoder(model, LOOK)
        Decoder(model, LOOK)  # once per model
    assert len(rec) == 1
    assert str(rec[0].message).startswith("the model's generation_config asks for repetition_penalty=1.3, "
                                          "suppress_tokens=[11], which transformers' generate would apply")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the run applies them itself: no warning
        Decoder(_with_defaults(repetition_penalty=1.3), LOOK, sampling=SamplingConfig(repetition_penalty=1.3))
    sampled = _with_defaults(do_sample=True, temperature=0.6, top_p=0.9)
    with pytest.warns(UserWarning, match=r"asks for do_sample=True \(temperature=0.6, top_p=0.9\)"):
        Decoder(sampled, LOOK)
    assert Decoder(sampled, LOOK, sampling=SamplingConfig(from_model=True)).sampler.cfg == SamplingConfig(
        temperature=0.6, top_k=50, top_p=0.9)
    bad = _with_defaults(no_repeat_ngram_size=2, bad_words_ids=[[5]])
    with pytest.raises(ConfigError) as err:
        Decoder(bad, LOOK, sampling=SamplingConfig(from_model=True))
    assert str(err.value) == (
        "sampling=model: the model's generation_config asks for no_repeat_ngram_size=2, bad_words_ids=[[5]], which "
        "lp_runtime cannot apply exactly; supported: do_sample, temperature, top_k, top_p, min_p, repetition_penalty, "
        "suppress_tokens. Use another sampling group")


# ------------------------------------------------------------------------- 8. a prompt near the context's end
@pytest.mark.parametrize("setting", SETTINGS + [lookahead(window_size=15, ngram_size=5, guess_set_size=15)])
def test_8_prompt_near_context_end_decodes_to_length(setting):
    model = llama(max_position_embeddings=40)
    prompt = [(5 * i + 1) % V for i in range(30)]
    out = Decoder(model, setting).generate(prompt, max_new_tokens=64)
    assert out.finish_reason == "length" and len(out.output_ids) == 10  # the context (40) is full
    assert out.output_ids == hf_greedy(model, prompt, 10)
    with pytest.raises(ConfigError, match=r"^the prompt \(40 tokens\) fills the model's context of 40 tokens"):
        Decoder(model, setting).generate(list(range(40)), max_new_tokens=1)
    assert Decoder(model, setting).generate(list(range(39)), max_new_tokens=5).output_ids == hf_greedy(
        model, list(range(39)), 1)


def test_8_learned_positions_and_sliding_window_count_only_what_was_asked():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=36,
                                      initializer_range=0.3, bos_token_id=None, eos_token_id=None)).eval()
    prompt = [(3 * i + 2) % V for i in range(28)]
    out = Decoder(gpt2, lookahead(window_size=6, ngram_size=4, guess_set_size=3)).generate(prompt,
                                                                                                 max_new_tokens=20)
    assert out.output_ids == hf_greedy(gpt2, prompt, 8) and out.finish_reason == "length"
    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(**{**TINY, "max_position_embeddings": 256, "sliding_window": 40})).eval()
    prompt = [(5 * i + 1) % V for i in range(30)]
    dec = Decoder(mistral, lookahead(window_size=5, ngram_size=4, guess_set_size=2))
    assert dec.generate(prompt, max_new_tokens=10).output_ids == hf_greedy(mistral, prompt, 10)  # 40 = the window
    with pytest.raises(ConfigError) as err:
        dec.generate(prompt, max_new_tokens=11)
    assert str(err.value) == ("MistralForCausalLM (model_type 'mistral') attends within windows of 40 tokens "
                              "(sliding_window=40); this prompt plus max_new_tokens may reach 41 tokens. lp_runtime "
                              "decodes such models exactly up to 40 tokens: shorten the prompt or lower max_new_tokens")


# ------------------------------------------------------------------------- 10. inputs ending in a traceback
def _save_tiny_with_tokenizer(tmp: Path, nan: bool = False) -> Path:
    d = tmp / "model"
    char_tokenizer().save_pretrained(d)
    model = llama(vocab_size=64, eos_token_id=2, bos_token_id=1)
    if nan:
        with torch.no_grad():
            model.lm_head.weight.fill_(math.nan)
    model.save_pretrained(d)
    return d


def _questions(tmp: Path) -> Path:
    p = tmp / "q.jsonl"
    p.write_text("".join(json.dumps({"question_id": i, "category": "t", "turns": [t]}) + "\n"
                         for i, t in enumerate(["abc abc", "hello"], 1)))
    return p


def _cli_batch(tmp: Path, calls: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """``python -m lp_runtime.generate`` per overrides list, all in one fresh interpreter (tests/cli_batch.py)."""
    from cli_batch import run_cli

    full = []
    for overrides in calls:
        args = [f"hydra.run.dir={tmp / 'hydra'}", "progress=false", *overrides]
        if not any(a.startswith("output.path=") for a in overrides):
            args.append(f"output.path={tmp / 'out' / 'answers.jsonl'}")
        full.append(args)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return run_cli(full, env)


def _fails_with(result: subprocess.CompletedProcess, message: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {message}"]


GPU = "cuda" if not torch.cuda.is_available() else "cuda:1"  # a device this machine lacks


@pytest.fixture(scope="module")
def cli10(tmp_path_factory):
    """The fault-10 command lines, in one interpreter: (tmp, bad dataset, old answers file, [non-UTF-8 dataset,
    non-UTF-8 answers file, missing GPU, stop string] results); the stop-string run's files are under tmp/stop."""
    tmp = tmp_path_factory.mktemp("fault10")
    bad = tmp / "bad.jsonl"
    bad.write_bytes(b'{"question_id": 1, "turns": ["hi"]}\n{"question_id": 2, "turns": ["caf\xe9"]}\n')
    answers = tmp / "old" / "answers.jsonl"
    answers.parent.mkdir()
    answers.write_bytes(b'{"question_id": 1}\n\xff\xfe{"question_id": 2}\n')
    gpu, stop = tmp / "gpu", tmp / "stop"
    gpu.mkdir(), stop.mkdir()
    model_dir = _save_tiny_with_tokenizer(stop)
    results = _cli_batch(tmp, [["dataset=jsonl", f"dataset.path={bad}", "model.path=/nonexistent"],
                               [f"output.path={answers}", "model.path=/nonexistent"],
                               [f"model.device={GPU}", "model.path=/nonexistent", "dataset.limit=1",
                                f"output.path={gpu / 'out' / 'answers.jsonl'}"],
                               # `generation.stop_strings=c` ends each answer at the first "c"
                               [f"model.path={model_dir}", "dataset=jsonl", f"dataset.path={_questions(stop)}",
                                f"output.path={stop / 'out' / 'answers.jsonl'}", "generation.stop_strings=c",
                                "generation.max_new_tokens=40", "model.dtype=float32", "decoding=lookahead",
                                "decoding.window_size=2", "decoding.ngram_size=3", "decoding.guess_set_size=2"]])
    return tmp, bad, answers, results


def test_10_non_utf8_dataset_and_answers_files_fail_in_one_line(cli10):
    tmp_path, bad, answers, (res_dataset, res_answers, *_) = cli10
    _fails_with(res_dataset,
                f"{bad}, line 2: byte 34 (b'\\xe9') is not UTF-8; save the file as UTF-8 (e.g. iconv -f latin1 "
                "-t utf-8) or remove that line")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    _fails_with(res_answers,
                f"{answers} line 2: byte 1 (b'\\xff') is not UTF-8; an answers file is written as UTF-8, so this one "
                "was changed elsewhere; move the file away or choose another output.path")
    assert answers.read_bytes() == b'{"question_id": 1}\n\xff\xfe{"question_id": 2}\n'  # untouched


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="needs a machine without a second GPU")
def test_10_missing_gpu_fails_before_loading(cli10):
    res = cli10[3][2]
    available = ", ".join(checks.available_devices())
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    line, = res.stderr.strip().splitlines()
    assert line.startswith(f"error: model.device='{GPU}' is not available: ")
    assert line.endswith(f"available devices: {available} (or model.device=auto)")
    with pytest.raises(ConfigError, match="model.device='cuda0' is not allowed"):
        ModelConfig(device="cuda0")


def test_10_single_stop_string_and_eos_id_accepted(cli10):
    from lp_runtime.generate import run

    assert GenerationConfig(stop_strings="hello").stop_strings == ["hello"]
    assert GenerationConfig(eos_token_ids=7).eos_token_ids == [7]
    with pytest.raises(ConfigError, match=r"generation.stop_strings=\[3\] is not allowed; give a list of strings"):
        GenerationConfig(stop_strings=[3])
    # Through the CLI (run in the cli10 batch): `generation.stop_strings=c` ends each answer at the first "c".
    tmp_path = cli10[0] / "stop"
    res, out = cli10[3][3], tmp_path / "out" / "answers.jsonl"
    assert res.returncode == 0, res.stderr[-2000:]
    cfg = RunConfig(model=ModelConfig(name="t", path=str(tmp_path / "model")), decoding=LOOK,
                    generation=GenerationConfig(max_new_tokens=40),
                    dataset=DatasetConfig(name="jsonl", path=str(tmp_path / "q.jsonl")),
                    output=OutputConfig(path=str(tmp_path / "ref" / "a.jsonl")), progress=False)
    run(cfg)
    ref = [json.loads(x)["choices"][0] for x in (tmp_path / "ref" / "a.jsonl").read_text().splitlines()]
    got = [json.loads(x)["choices"][0] for x in out.read_text().splitlines()]
    for r, g in zip(ref, got):
        cut = r["turns"][0].find("c")
        if cut >= 0:
            assert g["turns"][0] == r["turns"][0][: cut + 1] and g["finish_reason"] == ["stop"]
        else:
            assert g["output_ids"] == r["output_ids"]


# ------------------------------------------------------------------------- 9. teardown of torchrun jobs
# tests/test_parallel.py::test_teardown_leaves_no_gloo_thread_for_interpreter_exit (asserted on that file's lp3
# torchrun launch, whose driver imports transformers' model code after the group exists, as a run does).


# ========================================================================= issue 20: faults of other decoders
# ------------------------------------------------------------------------- 20.1 attention not causal over positions
def _gpt_neo(window: int):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    return GPTNeoForCausalLM(GPTNeoConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, window_size=window,
                                          attention_types=[[["global", "local"], 1]], max_position_embeddings=128,
                                          initializer_range=0.3, bos_token_id=None, eos_token_id=None)).eval()


def _llama4(**over):
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(0)
    cfg = Llama4TextConfig(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     max_position_embeddings=256, num_local_experts=1, moe_layers=[],
                                     attention_chunk_size=8, attn_temperature_tuning=False, initializer_range=0.3,
                                     bos_token_id=None, eos_token_id=None, pad_token_id=None), **over})
    return Llama4ForCausalLM(cfg).eval()


@pytest.mark.parametrize("make, name", [(lambda: _gpt_neo(8), "window_size=8"),
                                        (lambda: _llama4(), "attention_chunk_size=8"),
                                        (lambda: mistral_sliding(8), "sliding_window=8")])
def test_20_1_windowed_or_chunked_attention_exact_inside_refused_past_it(make, name):
    model = make()
    prompt = [5, 6, 7, 5]
    out = Decoder(model, LOOK).generate(prompt, max_new_tokens=4)  # 8 tokens: inside the first window / chunk
    assert out.output_ids == hf_greedy(model, prompt, 4)
    with pytest.raises(ConfigError) as err:
        Decoder(model, LOOK).generate(prompt, max_new_tokens=5)
    assert (f"attends within windows of 8 tokens ({name}); this prompt plus max_new_tokens may reach 9 tokens. "
            "lp_runtime decodes such models exactly up to 8 tokens") in str(err.value)


def mistral_sliding(window: int):
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(**{**TINY, "max_position_embeddings": 256, "sliding_window": window})).eval()


def test_20_1_attention_temperature_by_cache_index_refused_at_construction():
    model = _llama4(attn_temperature_tuning=True, attention_chunk_size=None)
    with pytest.raises(ConfigError, match=r"is not supported by lp_runtime: it scales attention by cache index "
                                          r"\(attn_temperature_tuning=True\)"):
        Decoder(model, LOOK)
    assert checks.attention_span(_gpt_neo(256)) == ("window_size", 256)  # of its kind: the span read at start-up
    assert checks.attention_span(_llama4(attention_chunk_size=16)) == ("attention_chunk_size", 16)


# ------------------------------------------------------------------------- 20.2 non-finite rows that decide nothing
@pytest.mark.parametrize("setting", [LOOK, lookahead(window_size=0, ngram_size=4, guess_set_size=3)],
                         ids=["window", "candidates"])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0)], ids=["greedy", "sample"])
def test_20_2_nonfinite_rejected_candidate_or_window_row_is_no_error(setting, sampling):
    forced = ForcedLM(V, {}, nan_after=[40])  # greedy: t -> t + 1; the row after 40 is NaN
    # The lookup proposes 5 -> 6 40 41 (from the prompt): 6 is accepted, 40 rejected; its NaN row decides nothing.
    # The window's row 0 is drawn from the prompt's tokens, mostly 40: their rows are discarded guesses.
    prompt = [40, 40, 40, 5, 6, 40, 41, 40, 5]
    out = Decoder(forced, setting, sampling=sampling).generate(prompt, max_new_tokens=12)
    assert out.output_ids == list(range(6, 18))
    plain = Decoder(forced, DecodingConfig(method="greedy"), sampling=sampling).generate(prompt, max_new_tokens=12)
    assert plain.output_ids == out.output_ids
    # Of the same kind: +inf instead of NaN (a logits row with +inf has no finite maximum)
    inf = ForcedLM(V, {}, nan_after=[40], bad=math.inf)
    assert Decoder(inf, setting, sampling=sampling).generate(prompt, max_new_tokens=12).output_ids == list(range(6, 18))


# ------------------------------------------------------------------------- 20.3 the streamer always ends
class _Streamer:
    def __init__(self):
        self.puts, self.ended = 0, 0

    def put(self, value):
        self.puts += 1

    def end(self):
        self.ended += 1


class _Exploding(torch.nn.Module):
    """A tiny Llama whose ``after``-th forward call raises ``error`` (an OOM, a bug in the model's code)."""

    def __init__(self, error: Exception, after: int):
        super().__init__()
        self.inner, self.error, self.after, self.calls = llama(), error, after, 0
        self.config = self.inner.config

    @property
    def dtype(self):
        return self.inner.dtype

    def forward(self, **kwargs):
        self.calls += 1
        if self.calls == self.after:
            raise self.error
        return self.inner(**kwargs)


@pytest.mark.parametrize("fail", ["nan", "oom", "forward", "request"])
def test_20_3_streamer_end_called_on_every_way_out(fail):
    streamer = _Streamer()
    if fail == "nan":
        model, error = ForcedLM(V, {}, nan_after=[8]), ModelOutputError
    elif fail == "request":
        model, error = llama(), ConfigError
    else:
        exc = torch.OutOfMemoryError("CUDA out of memory") if fail == "oom" else RuntimeError("bug in forward")
        model, error = _Exploding(exc, after=8), type(exc)  # calls 1-4: the start-up probe (3 steps, 3 prefills)
    dec = Decoder(model, LOOK)
    with pytest.raises(error):
        dec.generate([5, 6, 7] if fail != "request" else [], max_new_tokens=10, streamer=streamer)
    assert streamer.ended == 1
    # the same decoder still works afterwards (its lock was released) and ends its streamer once
    if fail != "oom" and fail != "forward":
        ok = _Streamer()
        dec.generate([1, 2, 3], max_new_tokens=3, streamer=ok)
        assert ok.ended == 1 and ok.puts == 1 + 3


# ------------------------------------------------------------------------- 20.6 one decoder, several threads
@pytest.mark.parametrize("policy", ["fixed", "cost"])
def test_20_6_one_decoder_four_threads_four_calls_each_equal_solo(policy):
    from concurrent.futures import ThreadPoolExecutor

    from lp_runtime.policy import CostPolicy

    model = llama()
    prompts = [[3 + i, 4, 5 + i, 3 + i, 4, 9, 5 + i, 3 + i] for i in range(16)]

    def make():
        if policy == "fixed":
            return Decoder(model, lookahead(window_size=3, ngram_size=4, guess_set_size=3))
        return Decoder(model, DecodingConfig(method="auto", ngram_size=6, guess_set_size=4, max_depth=24),
                       step_policy=CostPolicy({1: 0.02, 8: 0.024, 32: 0.055}))

    solo = [make().generate(p, max_new_tokens=24).output_ids for p in prompts]
    shared = make()
    with ThreadPoolExecutor(max_workers=4) as pool:
        outs = list(pool.map(lambda p: shared.generate(p, max_new_tokens=24).output_ids, prompts))
    assert outs == solo


def test_20_6_one_generator_four_threads_equal_solo(tiny_model_dir):
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    setting = lookahead(window_size=3, ngram_size=4, guess_set_size=3)
    prompts = [f"Count {i} {i} {i} and say {i} again" for i in range(16)]
    solo = [LookaheadGenerator(model, tok, setting).generate(p, max_new_tokens=16).output_ids for p in prompts]
    gen = LookaheadGenerator(model, tok, setting)
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda p: gen.generate(p, max_new_tokens=16).output_ids, prompts)) == solo
