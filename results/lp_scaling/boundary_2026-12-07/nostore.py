"""Diagnostic (not kept; from the repository root: OMP_NUM_THREADS=1 .venv/bin/python results/lp_scaling/boundary_2026-12-07/nostore.py 8): K ranks, the 24-prompt file, the suffix proposer without the answer store."""
import sys, time
from argparse import Namespace
import torch
sys.path.insert(0, "scripts")
import lp_scaling as L
from lp_runtime.config import DatasetConfig, ModelConfig
from lp_runtime.data import load_questions, build_prompt
from lp_runtime.models import load_model
from lp_runtime.checks import eos_token_ids
from lp_runtime.decoder import Decoder
k = int(sys.argv[1])
torch.set_num_threads(1)
args = Namespace(window=0, ngram=5, guess=15, context=None, topk=None, width=None, max_depth=None, rank_cap=None,
                 levers={}, budget=80, max_new_tokens=64, trees=False, stops=False)
model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"), weight_bars=False)
eos = eos_token_ids(model, tok, None)
qs = load_questions(DatasetConfig(name="jsonl", path="results/lp_scaling/prompts.jsonl", first_turn_only=True))
decoding, prop = L.proposer_for(model, k, args)
prop.suffix.store = None
dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, lp=L.RankProbe(k), proposers=[prop], copy_kv=False)
steps = []
t = time.time()
for i, q in enumerate(qs):
    steps.append(dec.generate(build_prompt(tok, q, []), max_new_tokens=64).decoding_steps)
    if i == 15:
        print("MT", k, sum(steps), steps, f"{time.time()-t:.0f}s", flush=True)
print("HE", k, sum(steps[16:]), steps[16:], f"{time.time()-t:.0f}s", flush=True)
