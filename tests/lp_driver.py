"""Multi-rank driver for tests/test_parallel.py: greedy grid, sampling seeds and teardown under LP, one launch.

Run under torchrun (gloo on CPU, one thread per rank), or as ranks forked from one preloaded process
(``fork_ranks``)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 tests/lp_driver.py --lp 2 \\
        --spec spec.json --out result.json
    OMP_NUM_THREADS=1 python tests/lp_driver.py --ranks 3 --lp 3 --spec spec.json --out result.json
    OMP_NUM_THREADS=1 python tests/lp_driver.py --ranks-preloaded 4 --lp 2 --spec spec.json --out result.json

``spec.json``: {"configs": [{"W": 2, "N": 3, "G": 1}, ...] (optionally with "curve" for decoding=auto, "succ": a node
budget for the successor-table proposer, "context": its table context, 1 or 2, "prefill": its prefill rows,
"rank_cap": [lp_size, nodes], "rank_tables": a table per rank of lp_size), "prompts": [[3, 4, ...], ...], "max_new_tokens": 32,
"sampling": [optional sampling specs, see ``decode_seeds``], "compiled": optional true}. Every rank builds the same tiny random Llama (fixed
seed), joins LP groups of ``--lp`` (world = dp x lp), and decodes its data-parallel share of the prompts (and of
each sampling spec's seeds, on the vocab-8 model of ``build_tiny8``) with the debug consistency check on; global
rank 0 writes {"results": {"<config>/<prompt>": {output_ids, decoding_steps, accept_lengths}},
"sampling": [{"<seed>": {output_ids, accept_lengths, collectives}}, ...], "stats": ..., "compiled": ...}; with
"compiled" the first LP group also decodes ``decode_compiled`` through ``compiled.CapturedStep`` (issue 19).
After the teardown every rank prints "rank R threads before B after A" (issue 11 fault 9: no gloo thread may be
left for interpreter exit). Like a run of ``generate``, transformers' model code is imported only after the process
group exists (that order once left the default group alive past the teardown).
``--fail`` injects a failure on ``--fail-rank`` after ``--fail-after`` merges: raise, exit (os._exit),
kill (SIGKILL on itself), hang (sleep forever, never entering the collective) or corrupt (a wrong x1); the ranks
then step a fixed plan without a model (``_failing_steps``) instead of decoding the grid.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict
import json
import os
import signal
import socket
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime import distributed  # noqa: E402
from lp_runtime.config import ParallelConfig  # noqa: E402
from lp_runtime.parallel import setup_parallel, shard_questions, state_hash  # noqa: E402

from fakes import build_tiny8, lookahead, tiny_model  # noqa: E402  (the suite's models, defined once)


def free_port() -> int:
    """A TCP port free on this machine now (tests run in parallel: a fixed port could be taken)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_slurm(script: str, args: list, cwd, run_dir, env: dict, nproc: int = 2) -> subprocess.CompletedProcess:
    """Run launch/``script`` as sbatch would on one local node of ``nproc`` ranks (srun left out; the c10d
    rendezvous on a port free on this machine now: tests run in parallel, a fixed port could be taken), in ``cwd``
    with ``env``, torchrun's per-rank logs under ``run_dir``."""
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(env, SLURM_JOB_ID="4242", SLURM_NNODES="1", SLURM_JOB_NODELIST="localhost", HEAD_NODE="127.0.0.1",
               MASTER_PORT=str(port), NPROC_PER_NODE=str(nproc), LP_RUNTIME_TORCHRUN=os.path.join(
                   root, ".venv", "bin", "torchrun"), LP_RUNTIME_SRUN="", LP_RUNTIME_ROOT=root, RUN_DIR=str(run_dir),
               HF_HUB_OFFLINE="1")
    return subprocess.run(["bash", os.path.join(root, "launch", script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def decode_grid(model, configs, prompts, max_new_tokens, lp=None, prompt_ids=None):
    """{"<ci>/<pi>": {output_ids, decoding_steps, accept_lengths}} for every config and the given prompts.

    Re-feed commit everywhere: LP always re-feeds, and K ranks must equal one process in that mode.
    One ``Decoder`` per config answers the prompts in order, as a run does: its cross-question store and (with
    ``"curve": {q: seconds}``, decoding.method=auto) its ``CostPolicy``'s calibration carry over, so a data-parallel
    group's steps (never its tokens) depend on its share of the prompts. Without ``lp`` it prices steps as ``"price_lp"`` ranks would."""
    from lp_runtime.config import DecodingConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.policy import CostPolicy

    out = {}
    for ci, c in enumerate(configs):
        policy = None
        if "curve" in c:
            policy = CostPolicy({int(q): float(t) for q, t in c["curve"].items()})
            if lp is None:
                policy.price_lp(c.get("price_lp", 1), c["W"])
        dec = Decoder(model, DecodingConfig(method="auto" if policy else "lookahead", window_size=c["W"],
                                            ngram_size=c["N"], guess_set_size=c["G"], max_depth=10,
                                            successors="false"),  # the grid: no table unless "succ" gives one
                      lp=lp, step_policy=policy, copy_kv=False, proposers=_succ(model, c))
        for pi in (prompt_ids if prompt_ids is not None else range(len(prompts))):
            g = dec.generate(prompts[pi], max_new_tokens=max_new_tokens)
            out[f"{ci}/{pi}"] = {"output_ids": g.output_ids, "decoding_steps": g.decoding_steps,
                                 "accept_lengths": g.accept_lengths}
    return out


def _succ(model, c):
    """``"succ": budget`` in a config: the successor-table proposer (issue 18) over the suffix proposer; with
    ``"rank_cap": [lp_size, nodes]`` its tree is cut so no rank of ``lp_size`` feeds more than ``nodes`` nodes (None:
    no cut), and with ``"rank_tables": true`` its token table is one table per rank of ``lp_size``."""
    if "succ" not in c:
        return None
    from lp_runtime.checks import vocab_size
    from lp_runtime.proposers import AnswerStore, SuffixProposer
    from lp_runtime.successors import SuccessorProposer

    suffix = SuffixProposer(c["N"], c["G"], store=AnswerStore())
    lp_size, cap = c.get("rank_cap", (1, None))
    return [SuccessorProposer(vocab_size(model), c["succ"], suffix=suffix, context=c.get("context", 1),
                              prefill=c.get("prefill", False), lp_size=lp_size, rank_budget=cap,
                              rank_tables=c.get("rank_tables", False))]


def decode_seeds(model, spec, lp=None, seeds=None):
    """{seed: {output_ids, accept_lengths, collectives}}: lookahead sampling of ``spec`` once per seed.

    ``spec``: {"prompt": [...], "W": 2, "N": 3, "G": 3, "max_new_tokens": 3, "seeds": [0, 1, ...],
    "sampling": {SamplingConfig fields but seed}}; ``seeds`` (default: all of the spec's) picks a share.
    ``collectives``: the LP group's step exchanges during that seed's decode (0 in one process)."""
    from lp_runtime.config import SamplingConfig
    from lp_runtime.decoder import Decoder

    dec = Decoder(model, lookahead(window_size=spec["W"], ngram_size=spec["N"], guess_set_size=spec["G"],
                                   successors="false"), lp=lp, copy_kv=False)  # LP re-feeds; one process must match it
    out = {}
    for s in spec["seeds"] if seeds is None else seeds:
        before = lp.stats.collectives if lp is not None else 0
        o = dec.generate(spec["prompt"], max_new_tokens=spec["max_new_tokens"],
                         sampling=SamplingConfig(**{**spec["sampling"], "seed": s}))
        out[str(s)] = {"output_ids": o.output_ids, "accept_lengths": o.accept_lengths,
                       "collectives": (lp.stats.collectives if lp is not None else 0) - before}
    return out


COMPILED_DECODING = dict(window_size=2, ngram_size=3, guess_set_size=1, max_depth=2,  # steps of <= 8 tokens a rank
                         successors="false")
COMPILED_SAMPLING = dict(temperature=0.8, seed=3)


def decode_compiled(lp=None, step=None) -> list:
    """[[output_ids, decoding_steps] greedy, the same seeded-sampled] on test_static_cache's prompt: through
    ``step`` (a ``compiled.CapturedStep``) when given, else eagerly on the same 1-layer tiny Llama."""
    from lp_runtime.config import SamplingConfig
    from lp_runtime.decoder import Decoder
    from test_static_cache import PROMPT, tiny_llama

    model = step.model if step is not None else tiny_llama(layers=1)
    dec = Decoder(model, lookahead(**COMPILED_DECODING), lp=lp, step=step)
    outs = [dec.generate(PROMPT * 3, max_new_tokens=24),
            dec.generate(PROMPT * 3, max_new_tokens=24, sampling=SamplingConfig(**COMPILED_SAMPLING))]
    return [[o.output_ids, o.decoding_steps] for o in outs]


def _compiled(lp) -> list:
    """``decode_compiled`` through this rank's own captured bucket (aot_eager, every step padded to 8: one trace)."""
    from lp_runtime.compiled import CapturedStep
    from test_static_cache import tiny_llama

    step = CapturedStep(tiny_llama(layers=1), max_len=96, buckets=(8,), backend="aot_eager")
    step.warm_up(log=None)
    return decode_compiled(lp, step)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


class _Failing:
    """Wraps an LP group; after ``after`` merges on ``rank`` it fails the way ``mode`` says."""

    def __init__(self, inner, mode: str, rank: int, after: int) -> None:
        self.inner, self.mode, self.fail_rank, self.after, self.count = inner, mode, rank, after, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def merge(self, *args, **kwargs):
        self.count += 1
        if distributed.rank() == self.fail_rank and self.count > self.after:
            if self.mode == "raise":
                raise ValueError(f"injected failure on rank {self.fail_rank} at merge {self.count}")
            if self.mode == "exit":
                os._exit(3)
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "hang":
                time.sleep(3600)
            if self.mode == "corrupt":  # a silently wrong merge: the debug consistency check must catch it
                x1, window, cands, topk = self.inner.merge(*args, **kwargs)
                return (x1 + 1) % 64, window, cands, topk
        return self.inner.merge(*args, **kwargs)


def _failing_steps(ctx, args) -> dict:
    """``--fail``: steps of a fixed plan (1 pending token, W = 2 columns of 1 level, a 3-node tree) through the LP
    group's merge and debug check, called as the decoder calls them, until the injected failure. No model: a rank
    then never imports transformers' model code (about half of a rank's start-up CPU)."""
    lp = _Failing(ctx.lp_group, args.fail, args.fail_rank, args.fail_after)
    parents = [-1, 0, -1]
    for step in range(args.fail_after + 10):
        cols, nodes = lp.plan(1, 2, 1, parents)
        kept = torch.tensor([step % 64] + [c + 1 for c in cols] + [n + 3 for n in nodes])
        x1, window, node_out, _ = lp.merge(kept, 1, 2, 1, parents)
        lp.check_consistent(state_hash(x1, window, node_out))
    return {"results": {}, "sampling": [], "stats": asdict(ctx.lp_group.stats), "compiled": None}


def _work(ctx, spec, args) -> dict:
    """This rank's share of the grid and of the sampling seeds, plus its step-exchange statistics."""
    if args.fail is not None:
        return _failing_steps(ctx, args)
    model = tiny_model().to(ctx.device)  # transformers' model code: imported after the group exists
    lp = ctx.lp_group
    mine = shard_questions(list(range(len(spec["prompts"]))), ctx.dp_rank, ctx.dp_size)
    start = time.perf_counter()
    results = decode_grid(model, spec["configs"], spec["prompts"], spec["max_new_tokens"], lp=lp, prompt_ids=mine)
    elapsed = time.perf_counter() - start
    stats = dict(asdict(ctx.lp_group.stats), decode_seconds=elapsed, rank=ctx.rank, dp_rank=ctx.dp_rank)
    sampling = []
    if spec.get("sampling"):
        tiny8 = build_tiny8().to(ctx.device)
        for one in spec["sampling"]:
            sampling.append(decode_seeds(tiny8, one, lp=lp,
                                         seeds=shard_questions(one["seeds"], ctx.dp_rank, ctx.dp_size)))
    compiled = _compiled(lp) if spec.get("compiled") and ctx.dp_rank == 0 else None
    return {"results": results, "sampling": sampling, "stats": stats, "compiled": compiled}


def fork_ranks(nproc: int, preload: bool) -> int:
    """``--ranks N``: run the N ranks as children forked from this process, which has imported torch and
    lp_runtime's parallel layer (each fresh process under torchrun pays ~3 s of CPU for them, ~8 s with
    transformers' model code), each with the environment torchrun gives (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT). ``preload`` (``--ranks-preloaded N``): transformers' Llama, torch._dynamo and the Decoder are
    imported before the fork too, so the process group then exists after transformers' model code, the reverse of
    a run's order (the teardown test's launch must not preload). This process starts no thread and no OpenMP pool
    (OMP_NUM_THREADS=1, one torch thread) before the fork. A rank leaves through the interpreter's normal exit (an
    exception: its traceback and status 1), so a thread left for finalization fails it as under torchrun. When a
    rank fails the others are killed, as torchrun does; the exit status is the first failure's, else 0."""
    torch.set_num_threads(1)
    if preload:
        import transformers.models.llama.modeling_llama  # noqa: F401
        from lp_runtime import compiled, decoder  # noqa: F401

    port = free_port()
    sys.stdout.flush(), sys.stderr.flush()
    pids = []
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:  # the rank: main(), then out of this function and the interpreter as a torchrun rank exits
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(port))
            main()
            return 0
        pids.append(pid)
    status = 0
    while pids:
        pid, raw = os.wait()
        pids.remove(pid)
        code = os.waitstatus_to_exitcode(raw)
        if code and not status:
            status = code if code > 0 else 128 - code
            for other in pids:
                os.kill(other, signal.SIGKILL)
    return status


# No torch.distributed.elastic @record here, as in generate: a rank that writes torchrun's error file can be
# terminated by torchrun mid-write (it stops the other ranks when one fails, then reads their files), and an empty
# file crashes torchrun with a JSONDecodeError instead of its failure summary (a clean clone's suite, 2026-12-02).
def _raise(err: Exception):
    raise err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lp", type=int, required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--fail", choices=["raise", "exit", "kill", "hang", "corrupt"])
    ap.add_argument("--fail-rank", type=int, default=1)
    ap.add_argument("--fail-after", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    before = threads()
    with open(args.spec) as f:
        spec = json.load(f)

    ctx = setup_parallel(ParallelConfig(lp=args.lp, backend="gloo", timeout_s=args.timeout, debug_check=True))
    # decoding=auto under LP: every rank takes global rank 0's object (its latency profile); recorded per rank
    broadcast = distributed.from_rank0(lambda: ["from rank", ctx.rank], timeout_s=args.timeout)
    try:  # an error on rank 0 is every rank's error (the others would otherwise wait for its result)
        distributed.from_rank0(lambda: _raise(ValueError(f"bad files, seen by rank {ctx.rank}")))
        raised = None
    except ValueError as e:
        raised = str(e)
    gathered = distributed.gather_objects_to_rank0(dict(_work(ctx, spec, args), broadcast=broadcast, raised=raised))  # the model and Decoders die here
    if ctx.is_writer:
        merged, sampling = {}, [{} for _ in spec.get("sampling") or []]
        for part in gathered:
            merged.update(part["results"])
            for acc, got in zip(sampling, part["sampling"], strict=True):
                acc.update(got)
        with open(args.out, "w") as f:
            json.dump({"results": merged, "sampling": sampling, "stats": [p["stats"] for p in gathered],
                       "compiled": gathered[0]["compiled"],
                       "broadcast": [p["broadcast"] for p in gathered],
                       "raised": [p["raised"] for p in gathered],
                       "world_size": ctx.world_size, "dp_size": ctx.dp_size}, f)
    rank = ctx.rank
    ctx.teardown()
    del ctx, gathered
    print(f"rank {rank} threads before {before} after {threads()}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] in (["--ranks"], ["--ranks-preloaded"]):  # lp_driver.py --ranks N --lp ...: fork_ranks
        preloaded, n = sys.argv[1] == "--ranks-preloaded", int(sys.argv[2])
        del sys.argv[1:3]
        sys.exit(fork_ranks(n, preloaded))
    main()
