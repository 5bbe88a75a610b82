"""Throwaway: time the product's own steps in a real decode against step_latency, same process, interleaved."""
import sys, time, statistics, collections
import torch
from lp_runtime import LookaheadGenerator, data, latency
from lp_runtime.config import DecodingConfig, ModelConfig, GenerationConfig, DatasetConfig
from lp_runtime.step import EagerStep

class Timed(EagerStep):
    def __init__(self, model):
        super().__init__(model); self.log = []; self.on = True
    def __call__(self, cache, inputs, *, topk=0):
        t = time.perf_counter(); out = super().__call__(cache, inputs, topk=topk)
        if self.on: self.log.append((inputs.ids.shape[1], inputs.keep.numel(), topk, cache.get_seq_length(), time.perf_counter() - t))
        return out
    def commit(self, cache, num_fed, num_keep, gather=()):
        t = time.perf_counter(); super().commit(cache, num_fed, num_keep, gather)
        if self.on: self.log.append(("commit", num_fed, num_keep, 0, time.perf_counter() - t))

torch.manual_seed(0)
gen = LookaheadGenerator.from_config(ModelConfig(dtype="float32"), DecodingConfig(), GenerationConfig(max_new_tokens=128), progress=False)
model, tok = gen.model, gen.tokenizer
step = Timed(model)
gen2 = LookaheadGenerator(model, tok, DecodingConfig(), GenerationConfig(max_new_tokens=128), step=step)
qs = data.load_questions(DatasetConfig(name="mt_bench"))
idx = [int(a) for a in sys.argv[1:]] or [0, 10, 20]
for rnd in range(2):
    step.on = False
    ref = latency.step_latency(EagerStep(model), (1, 4, 8, 12, 16), reps=5, warmup=2)
    print("curve", {q: round(v * 1e3, 1) for q, v in ref.items()}, flush=True)
    for i in idx:
        step.log.clear(); step.on = True
        t = time.perf_counter()
        out = gen2.generate(data.build_prompt(tok, qs[i], []))
        wall = time.perf_counter() - t
        fw = [r for r in step.log if r[0] != "commit"]
        cm = [r for r in step.log if r[0] == "commit"]
        byq = collections.defaultdict(list)
        for q, k, kk, past, s in fw[1:]:
            byq[q].append(s)
        print(f"q{i}: {len(out.output_ids)} tok {out.decoding_steps} steps wall {wall*1e3/out.decoding_steps:.1f} ms/step; "
              f"fwd sum {sum(r[4] for r in fw)*1e3/out.decoding_steps:.1f} ms/step commit {sum(r[4] for r in cm)*1e3/out.decoding_steps:.2f}; "
              f"past {fw[0][3]}..{fw[-1][3]} keep/topk {fw[-1][1]}/{fw[-1][2]}", flush=True)
        print("   by q:", {q: (len(v), round(statistics.median(v) * 1e3, 1)) for q, v in sorted(byq.items())}, flush=True)
