"""Throwaway: a step's time keeping the last ceil(q/2) logits rows (latency.step_latency) vs all q rows vs all + top-8."""
import statistics, sys, time, torch
from lp_runtime.config import ModelConfig
from lp_runtime.models import load_model
from lp_runtime.latency import random_step
from lp_runtime.layout import MaskBuffer
from lp_runtime.step import EagerStep, StepInputs
torch.set_num_threads(2)
model, _ = load_model(ModelConfig(dtype=sys.argv[1] if len(sys.argv) > 1 else "float32"), progress=False)
step = EagerStep(model); vocab = model.config.vocab_size
gen = torch.Generator().manual_seed(0)
cache, buf = step.new_cache(), MaskBuffer(model.dtype, step.device)
step.prefill(cache, torch.randint(0, vocab, (200,), generator=gen).tolist())
print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ms per step, median of 9 interleaved; 200-token cache")
with torch.inference_mode():
    for q in (1, 4, 8, 12, 16, 24, 32):
        ids, pos, inner, keep_half = random_step(vocab, q, 200, model.dtype, step.device, gen)
        keep_all = torch.arange(q)
        kinds = {"half": (keep_half, 0), "all": (keep_all, 0), "all+top8": (keep_all, 8)}
        t = {k: [] for k in kinds}
        for rep in range(11):
            for name, (keep, topk) in kinds.items():
                s = time.perf_counter()
                mask = buf.view(inner, 200) if q > 1 else None
                out = step(cache, StepInputs(ids, pos, mask, keep), topk=topk)
                out.argmax.tolist()
                if rep >= 2:
                    t[name].append(time.perf_counter() - s)
                step.commit(cache, q, 0)
        m = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        print(f"q={q:3d} rows {len(keep_half):2d}/{q:2d}: half {m['half']:6.1f}  all {m['all']:6.1f} ({m['all']/m['half']:.3f}x)  "
              f"all+top8 {m['all+top8']:6.1f} ({m['all+top8']/m['half']:.3f}x)", flush=True)
