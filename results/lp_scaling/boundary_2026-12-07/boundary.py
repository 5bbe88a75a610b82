"""Diagnostic (not kept; run from the repository root: OMP_NUM_THREADS=1 .venv/bin/python results/lp_scaling/boundary_2026-12-07/boundary.py 8 none,cal,tab,store): which state carried from the 16 MT-Bench prompts costs K = 8 steps on HumanEval 0-7.
Runs the 24-prompt file's first 16 at K, snapshots the decoder, then HumanEval 17-24 under variants."""
import copy, json, os, sys, time
from argparse import Namespace
from pathlib import Path
import torch
sys.path.insert(0, "scripts")
import lp_scaling as L
from lp_runtime.config import DatasetConfig, ModelConfig
from lp_runtime.data import load_questions, build_prompt
from lp_runtime.models import load_model
from lp_runtime.checks import eos_token_ids
from lp_runtime.decoder import Decoder
from lp_runtime.successors import AcceptanceCalibration, RankCalibration

k = int(sys.argv[1]); variants = sys.argv[2].split(",")
torch.set_num_threads(1)
args = Namespace(window=0, ngram=5, guess=15, context=None, topk=None, width=None, max_depth=None, rank_cap=None,
                 levers={}, budget=80, max_new_tokens=64, trees=False, stops=False)
model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"), weight_bars=False)
eos = eos_token_ids(model, tok, None)
qs = load_questions(DatasetConfig(name="jsonl", path="results/lp_scaling/prompts.jsonl", first_turn_only=True))
decoding, prop = L.proposer_for(model, k, args)
probe = L.RankProbe(k)
dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, lp=probe, proposers=[prop], copy_kv=False)
def run(d, questions):
    steps = []
    for q in questions:
        out = d.generate(build_prompt(tok, q, []), max_new_tokens=64)
        steps.append(out.decoding_steps)
    return steps
t = time.time()
mt = run(dec, qs[:16]); print("MT", k, sum(mt), mt, f"{time.time()-t:.0f}s", flush=True)
for v in variants:
    import threading; d = copy.deepcopy(dec, memo={id(model): model, id(dec._lock): threading.Lock()})
    p = d.proposers[0] if hasattr(d, "proposers") else None
    p = next(x for x in vars(d).values() if x.__class__.__name__ == "SuccessorProposer") if p is None else p
    if "cal" in v:
        p.suffix_cal, p.succ_cal = AcceptanceCalibration(), RankCalibration()
    if "tab" in v:
        p.table, p.pair = p._new_tables()
    if "store" in v:
        p.suffix.store = type(p.suffix.store)(p.suffix.store.max_key) if p.suffix.store is not None else None
    t = time.time()
    he = run(d, qs[16:]); print("HE", k, v, sum(he), he, f"{time.time()-t:.0f}s", flush=True)
