# Experiment record (not a project script): needs fill.diff applied (it defines successors.FILL); "fill" then
# keeps the table off at nodes where the suffix lookup has children.
import sys, time
import torch
from lp_runtime.config import ModelConfig, DecodingConfig, DatasetConfig
from lp_runtime.models import load_model, eos_token_ids
from lp_runtime.decoder import Decoder
from lp_runtime.auto import auto_policy
from lp_runtime.data import load_questions, build_prompt
from lp_runtime.successors import successor_proposers
from lp_runtime import checks, successors
torch.set_num_threads(2)
model, tok = load_model(ModelConfig(dtype="float32"))
qs = load_questions(DatasetConfig(name="mt_bench", first_turn_only=True))
seen = {}; pick = []
for q in qs:
    if seen.get(q.category, 0) < 1: pick.append(q); seen[q.category] = seen.get(q.category, 0) + 1
prompts = [build_prompt(tok, q, []) for q in pick]
dec_cfg = DecodingConfig(method="auto")
decs = {}
for table in ("none", "table", "fill"):
    pol = auto_policy(model, log=lambda s: None)
    props = successor_proposers(dec_cfg, checks.vocab_size(model), table=(table != "none"))
    decs[table] = Decoder(model, dec_cfg, eos_token_ids=eos_token_ids(model, tok, None), step_policy=pol, proposers=props)
tot = {k: [0, 0, 0, 0.0] for k in ("none", "table", "fill")}
for q, p in zip(pick, prompts):
    row = []
    for table in ("none", "table", "fill"):
        successors.FILL[0] = table == "fill"
        t = time.perf_counter(); out = decs[table].generate(p, max_new_tokens=128); dt = time.perf_counter() - t
        a = tot[table]; a[0] += len(out.output_ids); a[1] += out.decoding_steps; a[2] += sum(out.step_tokens); a[3] += dt
        row.append(f"S {len(out.output_ids)/out.decoding_steps:.3f} fed {sum(out.step_tokens)/out.decoding_steps:.2f} {dt:.1f}s")
    print(q.category, " | ".join(row), flush=True)
for table, a in tot.items():
    print(f"table={table}: S {a[0]/a[1]:.3f} fed/step {a[2]/a[1]:.2f} tok/s {a[0]/a[3]:.2f} ms/step {1000*a[3]/a[1]:.1f}")
