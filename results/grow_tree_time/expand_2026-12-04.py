import argparse, sys, time
sys.path[:0] = ["/work/main", "/work/main/scripts"]
import torch
from lp_runtime import successors as S
from lp_runtime.config import DatasetConfig, ModelConfig
from lp_runtime.data import build_prompt, load_questions
from lp_runtime.decoder import Decoder
from lp_runtime.models import eos_token_ids, load_model
from lp_runtime.parallel import LocalGroup
from lp_runtime.step import EagerStep
from lp_scaling import proposer_for
torch.set_num_threads(1)
K = int(sys.argv[1])
model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"), progress=False)
eos = eos_token_ids(model, tok, None)
qs = load_questions(DatasetConfig(name="jsonl", path="/work/main/results/lp_scaling/prompts_he.jsonl", first_turn_only=True))
flags = argparse.Namespace(budget=80, window=0, ngram=5, guess=15, levers={}, context=None, topk=None, width=None, max_depth=None, rank_cap=None)
decoding, prop = proposer_for(model, K, flags)
dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, lp=LocalGroup(), proposers=[prop], copy_kv=False, step=EagerStep(model))
cases = []
orig = prop.propose
def propose():
    suffix = prop.suffix.propose()
    cases.append((prop._root, suffix, prop._table, prop.budget, prop.suffix_cal, prop.succ_cal, prop.max_depth, prop.width, prop._pair, prop._prev))
    return orig()
prop.propose = propose
dec.generate(build_prompt(tok, qs[1], []), max_new_tokens=16)  # NB: tables/calibrations are live objects: replay only the last step exactly
root, suffix, table, budget, sc, rc, md, width, pair, prev = cases[-1]
res = {}
for e in (16, 32, 64, 128, 256, 512):
    S.EXPAND = e
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        g = S.grow_tree(root, suffix, table, budget, suffix_cal=sc, succ_cal=rc, max_depth=md, width=width, pair=pair, root_prev=prev)
        ts.append(time.perf_counter() - t)
    res[e] = (g.tree.tokens, g.tree.parents)
    print(f"EXPAND={e}: {1e3*sorted(ts)[7]:.2f} ms, nodes {len(g.tree)}, same as 64: {res.get(64, res[e]) == res[e]}", flush=True)
