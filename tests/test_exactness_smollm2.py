"""Greedy lookahead on the real bundled SmolLM2-135M-Instruct (float32) equals transformers' greedy generate.

1 MT-Bench first turn (chat template) and 1 HumanEval prompt (raw), 64 new tokens, the default setting of
conf/decoding/lookahead.yaml (copy-KV commit) and a windowed one with the re-feed commit that LP uses. Divergence
is allowed only at a near-tie (docs/design.md 6). This is the end-to-end check on a real model (real tokenizer and chat
template, 30 layers, long prompts); the combinations of W, N, G, commit, candidate variants, stop conditions and
prompt shapes are covered on tiny random models (test_exactness_tiny.py, test_tree_decoding.py, test_cases.py),
which take seconds. decoding=auto on SmolLM2: test_auto_decoding.py.
"""
import pytest

from lp_runtime.decoder import Decoder

from exactness import SMOLLM2_NEW as NEW, assert_greedy_equal
from fakes import lookahead


@pytest.mark.parametrize("W,N,G,commit", [(0, 4, 2, "copy"), (3, 4, 3, "refeed")])
def test_smollm2_lookahead_equals_generate(smollm2, smollm2_greedy, W, N, G, commit):
    model, tok = smollm2
    eos, _, prompts, refs = smollm2_greedy  # transformers' greedy generate, 64 new tokens (conftest.py)
    dec = Decoder(model, lookahead(window_size=W, ngram_size=N, guess_set_size=G), copy_kv=commit == "copy",
                  eos_token_ids=eos, tokenizer=tok)
    tokens = steps = 0
    for i, (prompt, ref) in enumerate(zip(prompts, refs)):
        out = dec.generate(prompt, max_new_tokens=NEW)
        assert_greedy_equal(model, prompt, out.output_ids, ref, f"prompt {i} W={W} N={N} G={G}")
        tokens, steps = tokens + len(out.output_ids), steps + out.decoding_steps
    assert tokens / steps > 1.0  # the prompt pool pays on these prompts (step compression S > 1)
