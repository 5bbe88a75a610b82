"""Lookahead parallelism through compiled.CapturedStep (issue 19): every rank decodes the same prompts with the same
tiny random Llama, each through its own captured bucket (aot_eager; every step padded to 8), LP group of 2; rank 0 writes the tokens and
step counts of the greedy and the seeded sampling runs (tests/test_compiled.py compares them with one eager process)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 tests/compiled_lp_driver.py OUT.json
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime.config import ParallelConfig  # noqa: E402
from lp_runtime.parallel import setup_parallel  # noqa: E402
from fakes import lookahead  # noqa: E402

DECODING = dict(window_size=2, ngram_size=3, guess_set_size=1, max_depth=2)  # steps of at most 8 tokens a rank
SAMPLING = dict(temperature=0.8, seed=3)


def decode(lp=None, step=None) -> list:
    """[(output_ids, decoding_steps) greedy, the same sampled], on test_compiled's prompt."""
    from lp_runtime.config import SamplingConfig
    from lp_runtime.decoder import Decoder
    from test_static_cache import PROMPT, tiny_llama

    model = step.model if step is not None else tiny_llama(layers=1)
    dec = Decoder(model, lookahead(**DECODING), lp=lp, step=step)
    outs = [dec.generate(PROMPT * 3, max_new_tokens=24),
            dec.generate(PROMPT * 3, max_new_tokens=24, sampling=SamplingConfig(**SAMPLING))]
    return [[o.output_ids, o.decoding_steps] for o in outs]


def main() -> None:
    torch.set_num_threads(1)
    ctx = setup_parallel(ParallelConfig(lp=2, backend="gloo", timeout_s=120, debug_check=True))
    from lp_runtime.compiled import CapturedStep
    from test_static_cache import tiny_llama

    step = CapturedStep(tiny_llama(layers=1), max_len=96, buckets=(8,), backend="aot_eager")  # one trace a rank
    step.warm_up(log=None)
    result = decode(ctx.lp_group, step)
    if ctx.is_writer:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    ctx.teardown()


if __name__ == "__main__":
    main()
