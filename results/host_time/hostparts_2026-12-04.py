"""Throwaway: host ms per step by decoder part at K ranks in one process (the step's own time excluded)."""
import argparse, collections, sys, time
sys.path[:0] = ["/work/main", "/work/main/scripts"]
import torch
from lp_runtime.config import DatasetConfig, ModelConfig
from lp_runtime.data import build_prompt, load_questions
from lp_runtime.checks import eos_token_ids
from lp_runtime.models import load_model
from lp_runtime.parallel import LocalGroup
from lp_runtime.step import EagerStep
from host_time import TimedStep, parts_decoder
from lp_scaling import proposer_for
torch.set_num_threads(1)
K, NP, NT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"), progress=False)
eos = eos_token_ids(model, tok, None)
qs = load_questions(DatasetConfig(name="jsonl", path="/work/main/results/lp_scaling/prompts_he.jsonl", first_turn_only=True))
flags = argparse.Namespace(budget=80, window=0, ngram=5, guess=15, levers={}, context=None, topk=None, width=None, max_depth=None, rank_cap=None)
decoding, prop = proposer_for(model, K, flags)
times = collections.defaultdict(float)
step = TimedStep(EagerStep(model))
D = parts_decoder(step, times)
dec = D(model, decoding, eos_token_ids=eos, tokenizer=tok, lp=LocalGroup(), proposers=[prop], copy_kv=False, step=step)
dec.generate(build_prompt(tok, qs[0], []), max_new_tokens=16)
times.clear(); steps = 0
for i in range(1, 1 + NP):
    out = dec.generate(build_prompt(tok, qs[i], []), max_new_tokens=NT); steps += out.decoding_steps
print(f"K={K} {steps} steps; host ms per step by part:", {k: round(1e3 * v / steps, 2) for k, v in times.items()},
      "total", round(1e3 * sum(times.values()) / steps, 2))
