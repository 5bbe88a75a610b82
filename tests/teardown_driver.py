"""Rank script for tests/test_faults.py::test_9 (issue 11, fault 9): after a run's teardown no gloo thread is left.

Joins the process group like a run does, imports transformers' model code afterwards (as ``generate.run`` does:
it captured the default group in ``torch.distributed.nn.functional``'s default arguments), does one collective,
tears down, drops the context, and prints this process's thread count before the group and after the teardown.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime import distributed  # noqa: E402
from lp_runtime.config import ParallelConfig  # noqa: E402
from lp_runtime.parallel import setup_parallel  # noqa: E402


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main() -> None:
    import torch

    torch.set_num_threads(1)
    before = threads()
    ctx = setup_parallel(ParallelConfig(lp=2, backend="gloo", timeout_s=30))
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401  (imported after the group exists)

    distributed.all_gather_fixed(torch.zeros(2, dtype=torch.int64), ctx.lp_group.group)
    ctx.teardown()
    del ctx
    print(f"rank {os.environ['RANK']} threads before {before} after {threads()}", flush=True)


if __name__ == "__main__":
    main()
