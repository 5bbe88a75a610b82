"""compiled.CapturedStep on CPU, float32, a 1-layer random Llama (issue 19, item 2): greedy through the 1-token
bucket and tree steps padded to a bucket give the eager path's tokens, no step recompiles after warm-up.

The bucket logic is tested through ``backend="aot_eager"`` (dynamo's capture, guards and static buffers without
code generation: ~15 s); one test compiles bucket 1 with inductor, the backend the runtime uses on CPU (~35 s of
CPU time with a cold inductor cache, a few seconds warm)."""
import types

import pytest
import torch
from transformers import DynamicCache

from lp_runtime.compiled import CapturedStep, bucket_for
from lp_runtime.config import DecodingConfig, SamplingConfig
from lp_runtime.decoder import Decoder
from lp_runtime.kv import commit
from lp_runtime.layout import LayoutCache, full_mask
from test_static_cache import PROMPT, greedy, tiny_llama
from fakes import lookahead

PARENTS = (-1, -1, 0, 2, 1, 4)  # a candidate tree below c: 6 nodes, 7 tokens with c -> bucket 8
TOKENS = [8, 40, 12, 77, 3, 51]


@pytest.fixture(scope="module")
def captured():
    step = CapturedStep(tiny_llama(layers=1), max_len=96, buckets=(1, 4, 8), backend="aot_eager")
    step.warm_up(log=None)
    return step


def test_bucket_for():
    assert [bucket_for(q) for q in (1, 2, 3, 4, 5, 200, 256)] == [1, 2, 4, 4, 8, 256, 256]
    with pytest.raises(ValueError, match=r"a step of 257 tokens has no bucket; buckets are \(1, 2, 4"):
        bucket_for(257)
    with pytest.raises(ValueError, match=r"a step of 0 tokens has no bucket"):
        bucket_for(0, (1, 4))


def test_greedy_equals_eager_without_recompiles(captured):
    ref = greedy(tiny_llama(layers=1), DynamicCache(), PROMPT, 16)
    with torch.compiler.set_stance("fail_on_recompile"):
        assert captured.greedy(PROMPT, 16) == ref
        assert captured.greedy(PROMPT[:3], 5) == greedy(tiny_llama(layers=1), DynamicCache(), PROMPT[:3], 5)
    i = next(i for i in range(2, 16) if ref.index(ref[i]) == i)  # a token's first occurrence ends the output
    assert captured.greedy(PROMPT, 16, eos_token_ids=[ref[i]]) == ref[: i + 1]


def tree_steps(run, commit_to, past):
    """A tree step (c + 6 nodes, a 4D tree mask), copy-KV commit of the path 0 -> 2 -> 3, then a 3-token causal
    run; returns both steps' kept logits."""
    lay, depth, inner, keep = LayoutCache(torch.device("cpu"), torch.float32).get(1, (), 0, PARENTS)
    first = run([PROMPT[-1]] + TOKENS, depth + past, inner, keep, past)
    with torch.inference_mode():  # DynamicCache's tensors are inference tensors
        commit_to(len(TOKENS) + 1, 1, [1, 3, 4])
    past += 4
    chain = torch.arange(3)
    second = run([TOKENS[3], 9, 10], chain + past, None, chain, past)
    return first, second


def test_tree_steps_equal_eager(captured):
    model = tiny_llama(layers=1)
    cache = DynamicCache()
    past = len(PROMPT) - 1
    with torch.inference_mode():
        model(input_ids=torch.tensor([PROMPT[:-1]]), past_key_values=cache, use_cache=True)

    def eager(ids, pos, inner, keep, past):
        mask = None if inner is None else full_mask(inner, past)
        with torch.inference_mode():
            return model(input_ids=torch.tensor([ids]), position_ids=pos[None], attention_mask=mask,
                         past_key_values=cache, use_cache=True, logits_to_keep=keep).logits[0]

    ref = tree_steps(eager, lambda *a: commit(cache, *a), past)
    captured.prefill(captured.new_cache(), PROMPT[:-1])
    with torch.compiler.set_stance("fail_on_recompile"):
        out = tree_steps(lambda ids, *a: captured.run(torch.tensor(ids), *a).clone(),
                         lambda *a: captured.commit(captured.cache, *a), past)
    for r, o in zip(ref, out):
        assert r.shape == o.shape
        assert torch.equal(r.argmax(-1), o.argmax(-1))
        assert (r - o).abs().max().item() < 1e-4
    assert captured.cache.get_seq_length() == cache.get_seq_length() == past + 7


SETTINGS = [DecodingConfig(method="greedy"),
            lookahead(window_size=0, ngram_size=3, guess_set_size=2, max_depth=2),
            lookahead(window_size=2, ngram_size=3, guess_set_size=1, max_depth=2),
            lookahead(window_size=4, ngram_size=4, guess_set_size=3)]  # steps past bucket 8 run eagerly


@pytest.mark.parametrize("decoding", SETTINGS, ids=["greedy", "pool", "window", "large"])
def test_decoder_through_buckets_equals_eager(captured, decoding):
    """Decoder(step=CapturedStep): the same tokens and steps as the eager step, greedy and seeded sampling."""
    prompt = PROMPT * 3  # repeats: the suffix lookup finds candidates
    eager = Decoder(tiny_llama(layers=1), decoding)
    ours = Decoder(captured.model, decoding, step=captured)
    sampling = SamplingConfig(temperature=0.8, seed=3)
    for kw in ({}, {"sampling": sampling}):
        ref = eager.generate(prompt, max_new_tokens=24, **kw)
        with torch.compiler.set_stance("fail_on_recompile"):
            out = ours.generate(prompt, max_new_tokens=24, **kw)
        assert (out.output_ids, out.decoding_steps, out.step_tokens) == (
            ref.output_ids, ref.decoding_steps, ref.step_tokens), kw
    fed = max(out.step_tokens)  # the buckets used: 1 (greedy); 4, 8; past the largest bucket (eager fallback)
    assert fed == 1 if decoding.method == "greedy" else (fed > 8) == (decoding.window_size == 4) and fed > 1


def test_prompt_rows_through_buckets_equal_eager(captured):
    """A proposer that takes the prompt's rows at prefill (the successor table, prefill=True) on the compiled path:
    the same tokens and steps as on the eager step."""
    from lp_runtime.successors import successor_proposers

    decoding = lookahead(window_size=0, ngram_size=3, guess_set_size=2, max_depth=3)
    vocab = captured.model.config.vocab_size
    runs = [Decoder(model, decoding, step=step, proposers=successor_proposers(decoding, vocab, budget=6, prefill=True))
            .generate(PROMPT * 2, max_new_tokens=16) for model, step in ((tiny_llama(layers=1), None),
                                                                        (captured.model, captured))]
    assert [(r.output_ids, r.decoding_steps) for r in runs] == [(runs[0].output_ids, runs[0].decoding_steps)] * 2


def test_refusals(captured):
    with pytest.raises(ValueError, match="a step at past=90 padded to 8 tokens needs 98 cache slots; "
                                         "this CapturedStep has max_len=96"):
        captured.run(torch.ones(5, dtype=torch.long), torch.arange(5), None, torch.arange(1), 90)
    with pytest.raises(ValueError, match=r"buckets=\(4, 1\) must be ascending, distinct and >= 1"):
        CapturedStep(tiny_llama(layers=1), max_len=64, buckets=(4, 1))
    with pytest.raises(ValueError, match="greedy needs a non-empty prompt and max_new_tokens >= 1"):
        captured.greedy([], 4)
    with pytest.raises(ValueError, match=r"backend='cudagraph' needs a CUDA model \(this one is on cpu\)"):
        CapturedStep(tiny_llama(layers=1), max_len=64, buckets=(1,), backend="cudagraph")


def test_step_latency_times_both_paths(captured):
    """One curve per path, each q once through the step's methods; the cache is left as it was."""
    from lp_runtime.compiled import step_latency
    from lp_runtime.step import EagerStep

    for step in (EagerStep(tiny_llama(layers=1)), captured):
        curve = step_latency(step, (1, 3, 8), cache_tokens=20, reps=2, warmup=1)
        assert sorted(curve) == [1, 3, 8] and all(0 < t < 5 for t in curve.values())
    assert captured.cache.get_seq_length() == 20


def test_auto_prices_the_captured_buckets(captured, tmp_path):
    """decoding=auto on a captured step (issue 19, item 2): the profile is measured on that step, per bucket, under
    its own key, so the cost policy's curve is the bucket step function (q = 2..4 cost bucket 4, 5..8 bucket 8)."""
    import json

    from lp_runtime import auto, latency

    assert captured.latency_qs() == (1, 2, 4, 5, 8)
    times = captured.measure_latency([1, 2, 3, 4, 5, 8, 9], reps=1, warmup=0)  # 9: past the buckets, eager
    assert sorted(times) == [1, 2, 3, 4, 5, 8, 9] and times[2] == times[3] == times[4] and times[5] == times[8]
    assert auto.step_timing(None) == {} and auto.step_timing(None, measure=len) == {"measure": len}
    policy = auto.auto_policy(captured.model, model_id="tiny", root=str(tmp_path), log=lambda line: None,
                              step=captured)
    device = latency.device_key(captured.model) + "+captured-aot_eager"
    saved = json.loads(open(latency.profile_path("tiny", device, "float32", str(tmp_path))).read())
    assert sorted(int(q) for q in saved["latency_s"]) == [1, 2, 4, 5, 8]
    assert saved["fingerprint"]["variant"] == "captured-aot_eager" and saved["source"] == "measured"
    curve = policy.curve
    assert curve(2) == curve(3) == curve(4) and curve(5) == curve(6) == curve(7) == curve(8)
    again = auto.auto_policy(captured.model, model_id="tiny", root=str(tmp_path), log=lambda line: None,
                             step=captured, measure=lambda qs, reps, warmup: {q: saved["latency_s"][str(q)]
                                                                             for q in qs})
    assert again.curve.points == curve.points  # the cached profile of this variant is read, not re-measured


def test_inductor_greedy_equals_eager():
    """The CPU runtime's backend: inductor-generated kernels, one bucket."""
    step = CapturedStep(tiny_llama(layers=1), max_len=32, buckets=(1,))
    step.warm_up(log=None)
    assert step.greedy(PROMPT, 12) == greedy(tiny_llama(layers=1), DynamicCache(), PROMPT, 12)


def test_captured_room_counts_the_padded_bucket():
    """A captured step pads q tokens (and q + 1 kept rows) to a bucket, so near the cache's end a step fits only if
    its bucket does; past every bucket it runs eagerly, by length. The sequence may reach max_len - the largest
    bucket (``max_positions``), where a plain step's bucket always fits."""
    step = CapturedStep(tiny_llama(layers=1), max_len=20, buckets=(1, 2, 4))
    assert step.max_positions == 16
    assert [step.fits(past, 3) for past in (16, 17)] == [True, False]  # q = 3 keeps up to 4 rows: bucket 4
    assert [step.fits(past, 1) for past in (18, 19)] == [True, False]  # bucket 2
    assert [step.fits(past, 6) for past in (14, 15)] == [True, False]  # past every bucket: 6 slots


def test_an_attention_the_split_attention_does_not_compute_is_refused(tmp_path):
    """Attention sinks (gpt-oss), logit soft-capping and sliding windows (Gemma-2) reached split_attention as keyword
    arguments it dropped: the captured path decoded other tokens without a word (a review, 2026-12-04). Now the
    capture refuses them; under model.compile=auto the model steps eagerly with its own attention."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from lp_runtime.compiled import record_verdict, step_for

    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                           max_position_embeddings=256)).eval()  # eager attention: no sdpa here
    refusal = ("the split attention of the static and compiled paths does not compute sliding_window (a sliding "
               "window), softcap (logit soft-capping), which this model's attention uses; set model.compile=false")
    with pytest.raises(ValueError) as e:
        CapturedStep(model, max_len=64, buckets=(1, 2), backend="aot_eager")
    assert str(e.value) == refusal
    model.set_attn_implementation("eager")
    record_verdict(model, {"eager": 1.0, "compiled": 2.0}, root=str(tmp_path))
    lines = []
    assert step_for(model, "auto", root=str(tmp_path), log=lines.append) is None
    assert lines[-1] == f"model.compile=auto: capturing the step failed (ValueError: {refusal}); eager steps"
    assert model.config._attn_implementation == "eager"


def test_model_compile_setting(tmp_path):
    import json

    from lp_runtime.compiled import chosen_path, default_max_len, record_verdict, step_for, verdict_path
    from lp_runtime.config import ConfigError, ModelConfig
    from lp_runtime.static_cache import SlotStep

    assert [ModelConfig(compile=v).compile for v in (True, False, "auto", "TRUE")] == ["true", "false", "auto", "true"]
    with pytest.raises(ConfigError, match="model.compile='fast' is not allowed; use one of auto, true, false"):
        ModelConfig(compile="fast")
    model, lines = tiny_llama(layers=1), []
    assert default_max_len(model) == 512 + 256  # the model's positions + the largest bucket
    assert step_for(model, "false", root=str(tmp_path)) is None
    assert chosen_path(model, "auto", str(tmp_path), lines.append) == "eager" and lines == []  # nothing measured
    assert chosen_path(model, "true", str(tmp_path), lines.append) == "compiled"
    # on CUDA, nothing recorded: the captured path (measured on an H200: 3.6x the eager step at 1 token), one line
    class OnCuda:  # what chosen_path reads of a model whose weights are on a GPU (none here)
        config, dtype = model.config, model.dtype

        def parameters(self):
            return iter([types.SimpleNamespace(device=torch.device("cuda"))])

    assert chosen_path(OnCuda(), "auto", str(tmp_path), lines.append) == "compiled"
    model.config._attn_implementation = "eager"  # an attention the user chose (model.attn_implementation): kept
    assert chosen_path(OnCuda(), "auto", str(tmp_path), lines.append) == "eager"
    model.set_attn_implementation("sdpa")
    assert lines == ["model.compile=auto: compiled steps (CUDA graphs per step bucket; nothing recorded for this model "
                     "here: scripts/compile_bench.py --record measures; model.compile=false for eager steps)"]
    record_verdict(model, {"eager": 10.0, "static": 11.0, "compiled": 12.5}, root=str(tmp_path))
    assert verdict_path(model, str(tmp_path)) == str(tmp_path / "compile" / "llama__cpu__torch.float32.json")
    assert chosen_path(model, "auto", str(tmp_path), lines.append) == "compiled"
    assert lines[-1].startswith("model.compile=auto: compiled steps (measured ")
    assert lines[-1].endswith("tokens/s: eager 10.0, static 11.0, compiled 12.5)")
    record_verdict(model, {"eager": 10.0, "static": 11.5, "compiled": 9.0}, root=str(tmp_path))  # this CPU's order
    step = step_for(model, "auto", root=str(tmp_path), log=lines.append)
    assert type(step) is SlotStep and step.cache.max_len == 768 and lines[-1].startswith("model.compile=auto: static")
    record_verdict(model, {"eager": 10.0, "compiled": 9.0}, root=str(tmp_path))
    assert step_for(model, "auto", root=str(tmp_path), log=lines.append) is None
    assert lines[-1].startswith("model.compile=auto: eager steps")
    old = {"compile": True, "eager_tokens_s": 1.0, "compiled_tokens_s": 2.0, "measured": "2026-12-01 21:00"}
    with open(verdict_path(model, str(tmp_path)), "w") as f:  # a verdict recorded before the static path
        json.dump(old, f)
    assert chosen_path(model, "auto", str(tmp_path), lines.append) == "compiled"
    with pytest.raises(ValueError, match=r"verdict paths \['fast'\] are not allowed; use some of eager, static"):
        record_verdict(model, {"fast": 1.0}, root=str(tmp_path))
    with pytest.raises(ValueError, match="model.compile='yes' is not allowed"):
        step_for(model, "yes")
    # a model of more positions than a static cache holds: one line says where answers stop
    from fakes import llama

    from lp_runtime.compiled import static_capacity

    long = llama(num_hidden_layers=1, max_position_embeddings=20000)
    assert (static_capacity(long, "static"), static_capacity(long, "compiled"), static_capacity(long, "eager")) == (
        8192, 8192, None)
    assert type(step_for(long, "auto", root=str(tmp_path), log=lines.append, path="static")) is SlotStep
    assert lines[-1] == ("model.compile=auto: the static KV cache holds 8192 tokens, fewer than the model's 20000 "
                         "context: answers stop there (finish_reason length); model.compile=false for more")
    # a model the captured path cannot run: auto says so and steps eagerly; true raises
    from transformers import LlamaForCausalLM

    class Uncapturable(LlamaForCausalLM):
        def forward(self, *a, **kw):
            raise RuntimeError("no static shapes here")

    odd = Uncapturable(model.config).eval()
    record_verdict(odd, {"eager": 1.0, "compiled": 2.0}, root=str(tmp_path))
    assert step_for(odd, "auto", root=str(tmp_path), log=lines.append) is None
    assert lines[-1] == "model.compile=auto: capturing the step failed (RuntimeError: no static shapes here); eager steps"
    assert odd.config._attn_implementation == "sdpa"  # its own attention again (the capture had set split attention)
    with pytest.raises(RuntimeError, match="no static shapes here"):
        step_for(odd, "true", root=str(tmp_path), log=lines.append)
