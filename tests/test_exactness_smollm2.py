"""Greedy decoding on the real bundled SmolLM2-135M-Instruct (float32) equals transformers' greedy generate: the
one exactness grid on a real model.

1 MT-Bench first turn (chat template) and 1 HumanEval prompt (raw), 48 new tokens, for the default setting of
conf/decoding/lookahead.yaml (copy-KV commit), a windowed one with the re-feed commit that LP uses, and
``DecodingConfig()`` (decoding=auto, the main job's default) with the cost policy on the float32 CPU curve of
docs/design.md 7b. Divergence is allowed only at a near-tie (docs/design.md 6). This is the end-to-end check on a
real model (real tokenizer and chat template, 30 layers, long prompts); the combinations of W, N, G, commit,
candidate variants, stop conditions and prompt shapes are covered on tiny random models (test_exactness_tiny.py,
test_tree_decoding.py, test_cases.py), which take seconds.
"""
import pytest

from lp_runtime.config import DecodingConfig
from lp_runtime.decoder import Decoder
from lp_runtime.policy import CostPolicy

from exactness import SMOLLM2_NEW as NEW, assert_greedy_equal
from fakes import lookahead

FLOAT32 = {1: 38.5, 2: 61.8, 3: 75.8, 4: 58.9, 8: 59.2, 16: 70.6, 32: 95.0, 64: 142.8}  # docs/design.md 7b

GRID = {  # id: (setting, commit, step policy)
    "lookahead-copy": (lookahead(), "copy", None),
    "W3N4G3-refeed": (lookahead(window_size=3, ngram_size=4, guess_set_size=3), "refeed", None),
    "auto-float32": (DecodingConfig(), "copy", FLOAT32),
}


@pytest.mark.parametrize("case", list(GRID))
def test_smollm2_equals_transformers_greedy(smollm2, smollm2_greedy, case):
    model, tok = smollm2
    eos, _, prompts, refs = smollm2_greedy  # transformers' greedy generate, SMOLLM2_NEW new tokens (conftest.py)
    setting, commit, curve = GRID[case]
    policy = CostPolicy(curve) if curve else None  # one policy and store for both prompts, as a run
    dec = Decoder(model, setting, copy_kv=commit == "copy", eos_token_ids=eos, tokenizer=tok, step_policy=policy)
    tokens = steps = 0
    for i, (prompt, ref) in enumerate(zip(prompts, refs)):
        out = dec.generate(prompt, max_new_tokens=NEW)
        assert_greedy_equal(model, prompt, out.output_ids, ref, f"prompt {i} {case}")
        tokens, steps = tokens + len(out.output_ids), steps + out.decoding_steps
    if curve is None:
        assert tokens / steps > 1.0  # the prompt pool pays on these prompts (step compression S > 1)
