"""Host ms per step by decoder part, K ranks in one process, a 1-layer model of SmolLM2's vocabulary with every
token table filled with random rows (device_check part f's worst case); the step's own time excluded."""
import collections, sys, time
sys.path[:0] = [sys.argv[2] if len(sys.argv) > 2 else ".", "scripts"]
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from lp_runtime.config import DecodingConfig
from lp_runtime.parallel import LocalGroup
from lp_runtime.step import EagerStep
from lp_runtime.successors import successor_proposers
from device_check import fill_table, prompts_for
from host_time import TimedStep, parts_decoder
torch.set_num_threads(1)
K = int(sys.argv[1])
cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None, attn_implementation="sdpa")
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
prompts = prompts_for(49152, 3)
decoding = DecodingConfig(method="lookahead", window_size=0, ngram_size=5, guess_set_size=15 * K, max_depth=10,
                          successors="true")
(prop,) = successor_proposers(decoding, 49152, lp_size=K, budget=79)
fill_table(prop.table, 49152)
step = TimedStep(EagerStep(model))
times = collections.defaultdict(float)
D = parts_decoder(step, times)
dec = D(model, decoding, lp=LocalGroup(), proposers=[prop], copy_kv=False, step=step)
dec.generate(prompts[2], max_new_tokens=32)
times.clear(); step.seconds = 0.0; start = time.perf_counter()
outs = [dec.generate(p, max_new_tokens=64) for p in prompts[:2]]
wall = time.perf_counter() - start
steps = sum(o.decoding_steps for o in outs)
print(f"K={K} {steps} steps, host {1e3 * (wall - step.seconds) / steps:.2f} ms/step;",
      {k: round(1e3 * v / steps, 2) for k, v in times.items()}, "fed/step", sum(sum(o.step_tokens) for o in outs) / steps)
