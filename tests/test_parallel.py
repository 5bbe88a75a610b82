"""Lookahead parallelism (docs/design.md sections 3 and 6.2): the shard plan, multi-rank exactness, failures, launchers.

Multi-rank tests run ``torchrun --standalone`` on tests/lp_driver.py (gloo, one thread per rank), ONE launch per
world size (lp3; dp2 x lp2), each asserted on by several tests: the whole (W, N, G) x prompt grid against the
single-process Decoder run here (same tokens, same number of steps, same accepted lengths), with the successor-table
proposer (both launches) and decoding=auto's cost policy (dp2 x lp2) among the settings, the sampling seeds
(dp2 x lp2) and the teardown's thread count (lp3). Each failure mode needs a launch of its own (the job ends).

The Slurm-script test drives ``python -m lp_runtime.generate`` through launch/slurm_single_node.sbatch on this
machine with parallel=lp1 (dp2 over 2 ranks) and a resuming re-run. The multi-node script (its default parallel=lp2
over the c10d rendezvous, same tokens as one process) runs in tests/test_lp_auto.py's decoding=auto job: one launch.
"""
from __future__ import annotations

import itertools
import random
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lp_runtime import distributed
from lp_runtime.config import ConfigError, ParallelConfig
from lp_runtime.parallel import (LocalGroup, rank_tokens, setup_parallel, shard_questions, split_outputs,
                                 state_hash, tree_plan)
from lp_runtime.tree import preorder, reindex, subtrees

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = str(ROOT / ".venv" / "bin" / "torchrun")
sys.path.insert(0, str(Path(__file__).parent))
import lp_driver  # noqa: E402

# ------------------------------------------------------------------------------------------ tree plan
SHAPES = [  # (num_columns, num_levels, num_candidates, cand_len, world)
    (w, l, g, c, k)
    for w, l, g, c, k in itertools.product([0, 1, 2, 4, 6], [0, 1, 3], [0, 1, 3], [1, 2, 4], [1, 2, 3, 4])
    if w or g
]


def _brute_force_best(num_columns, num_levels, sizes, world) -> int:
    """Smallest possible largest-rank load over contiguous column blocks and any whole-subtree placement."""
    splits = [[]] if num_columns == 0 else [
        [tuple(range(x, y)) for x, y in zip((0, *cuts), (*cuts, num_columns))]
        for nb in range(1, min(world, num_columns) + 1)
        for cuts in itertools.combinations(range(1, num_columns), nb - 1)
    ]
    best = None
    for blocks in splits:
        loads = [max(b) + num_levels * len(b) for b in blocks] + [0] * (world - len(blocks))
        for assign in itertools.product(range(world), repeat=len(sizes)):
            ld = list(loads)
            for r, size in zip(assign, sizes):
                ld[r] += size
            best = max(ld) if best is None else min(best, max(ld))
    return best


def _best_cut(parents, world) -> int:
    """Smallest busiest-rank node count over every cut of the preorder into ``world`` runs (chains repeated)."""
    order, depth = preorder(parents)
    best = len(parents)
    for cuts in itertools.combinations(range(1, len(order)), min(world, len(order)) - 1):
        bounds = list(zip((0, *cuts), (*cuts, len(order))))
        best = min(best, max(b - a + depth[order[a]] for a, b in bounds))
    return best


def _chains(num, length):
    return [-1 if j == 0 else i * length + j - 1 for i in range(num) for j in range(length)]


def _random_tree(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(-1, i) if rng.random() < 0.3 else (i - 1 if i else -1) for i in range(n)]


@pytest.mark.parametrize("shape", SHAPES)
def test_tree_plan_covers_everything_and_balances(shape):
    w, l, g, c, k = shape
    for parents in (_chains(g, c), _random_tree(g * c, g + c + k)):
        plan = tree_plan(1, w, l, parents, k)
        assert len(plan) == k
        assert sorted(j for p in plan for j in p[0]) == list(range(w))
        assert sorted(set().union(*(p[1] for p in plan))) == list(range(len(parents)))
        for cols, nodes in plan:
            assert list(cols) == list(range(cols[0], cols[0] + len(cols))) if cols else not cols  # contiguous
            assert all(parents[n] < 0 or parents[n] in nodes for n in nodes)  # ancestor-closed
        worst = max(rank_tokens(p, 0, l) for p in plan)
        if w == 0:  # the best contiguous cut of the preorder
            assert worst == _best_cut(parents, k)
        else:  # within one level's (or one subtree's) worth of the best plan that keeps subtrees whole
            sizes = [len(t) for t in subtrees(parents)]
            assert worst <= _brute_force_best(w, l, sizes, k) + max(l, *sizes, 0)
        assert tree_plan(1, w, l, parents, k) == plan  # deterministic


def test_tree_plan_examples():
    assert tree_plan(1, 6, 2, _chains(3, 3), 3) == (((0, 1, 2, 3), ()), ((4, 5), ()), ((), tuple(range(9))))
    # More ranks than columns; idle ranks are fine.
    plan = tree_plan(1, 2, 1, [-1, 0], 4)
    assert plan == (((0,), ()), ((1,), ()), ((), (0, 1)), ((), ()))
    assert [rank_tokens(p, 1, 1) for p in plan] == [2, 3, 3, 1]  # 1 pending + (col 0) | (row0 1 + col 1) | nodes
    # Pool-only (W = 0): one chain per rank, extra ranks idle.
    assert tree_plan(2, 0, 0, _chains(2, 4), 3) == (((), (0, 1, 2, 3)), ((), (4, 5, 6, 7)), ((), ()))
    # One rank: everything, like LocalGroup.
    assert tree_plan(1, 5, 2, _chains(3, 2), 1) == ((tuple(range(5)), tuple(range(6))),)
    # Later column blocks are shorter: they pay for the longer row-0 prefix.
    sizes = [len(p[0]) for p in tree_plan(1, 16, 1, [], 4) if p[0]]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
    with pytest.raises(ValueError, match="counts must be >= 0 and world >= 1"):
        tree_plan(1, -1, 0, [], 2)
    with pytest.raises(ValueError, match="node 1 has parent 1; a parent must be -1"):
        tree_plan(1, 1, 0, [-1, 1], 2)


def test_tree_plan_cuts_the_preorder_repeating_ancestor_chains():
    parents = [-1, 0, 0, -1, 3, -1, 1]  # subtrees {0, 1, 2, 6}, {3, 4}, {5}
    assert preorder(parents) == ([0, 1, 6, 2, 3, 4, 5], [0, 1, 1, 0, 1, 0, 2])  # depth by node
    plan = tree_plan(1, 0, 0, parents, 2)
    assert plan == (((), (0, 1, 2, 6)), ((), (3, 4, 5)))
    assert reindex(parents, plan[0][1]) == (-1, 0, 0, 1)
    assert reindex(parents, plan[1][1]) == (-1, 0, -1)
    assert tree_plan(1, 3, 1, parents, 1) == (((0, 1, 2), tuple(range(7))),)
    # over 3 ranks, 3 nodes each: runs [0, 1, 6], [2, 3] (feeding 2's parent 0 again), [4, 5] (4's parent 3)
    assert tree_plan(1, 0, 0, parents, 3) == (((), (0, 1, 6)), ((), (0, 2, 3)), ((), (3, 4, 5)))


def test_local_group_and_split_outputs():
    lg = LocalGroup()
    assert lg.plan(1, 3, 1, [-1, 0]) == ((0, 1, 2), (0, 1)) and not lg.debug
    assert split_outputs([9, 1, 2, 3, 4, 5, 6, 7], 3, 4) == (9, [1, 2, 3], [4, 5, 6, 7])
    assert lg.merge(torch.tensor([9, 1, 2, 3, 4, 5]), 1, 3, 1, [-1, 0]) == (9, [1, 2, 3], [4, 5], None)
    lg.check_consistent(123)


# ------------------------------------------------------------------------------------------ setup, pure parts
def test_validate_messages():
    with pytest.raises(ConfigError, match=r"parallel.lp=3 does not divide the world size 4"):
        distributed.validate(4, 3, "gloo", 0, 0)
    with pytest.raises(ConfigError, match=r"parallel.backend=nccl needs one GPU per local rank: local rank 2 but 2 GPUs"):
        distributed.validate(4, 2, "nccl", 2, 2)
    with pytest.raises(ConfigError) as e:
        distributed.validate(1, 1, "nccl", 0, 0)
    assert str(e.value) == ("parallel.backend=nccl needs CUDA GPUs and none is visible on this machine; use "
                            "parallel.backend=gloo (CPU)")
    distributed.validate(4, 2, "gloo", 3, 0)
    distributed.validate(8, 8, "nccl", 7, 8)


def test_detect_torchrun_then_slurm(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.detect() == distributed.RankInfo(0, 1, 0, "single")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert distributed.detect() == distributed.RankInfo(5, 8, 1, "slurm")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert distributed.detect() == distributed.RankInfo(2, 4, 0, "torchrun")  # torchrun inside Slurm wins
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[012-015],cpu3")
    monkeypatch.delenv("HEAD_NODE", raising=False)
    assert distributed._slurm_head() == "gpu012"
    monkeypatch.setenv("HEAD_NODE", "head0")
    assert distributed._slurm_head() == "head0"


def test_setup_parallel_single_process(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    ctx = setup_parallel(ParallelConfig(lp=1, backend="gloo"))
    assert isinstance(ctx.lp_group, LocalGroup)
    assert (ctx.dp_rank, ctx.dp_size, ctx.rank, ctx.world_size, ctx.is_writer) == (0, 1, 0, 1, True)
    assert ctx.device == torch.device("cpu")
    ctx.teardown()
    with pytest.raises(ConfigError) as e:  # a new user ran parallel=lp2 without torchrun (2026-12-07)
        setup_parallel(ParallelConfig(lp=2, backend="gloo"))
    assert str(e.value) == (
        "parallel.lp=2 needs 2 ranks and one process was started; launch it with torchrun --nproc-per-node=2 -m "
        "lp_runtime.generate ... or NPROC=2 launch/torchrun_single_node.sh parallel.lp=2 ... (README, Usage)")


def test_shard_questions_and_state_hash():
    qs = list("abcdefg")
    parts = [shard_questions(qs, r, 3) for r in range(3)]
    assert parts == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert sorted(sum(parts, [])) == qs
    with pytest.raises(ValueError):
        shard_questions(qs, 3, 3)
    assert state_hash((1, 2), [3], 4) == state_hash((1, 2), [3], 4) != state_hash((1, 2), [3], 5)


# ------------------------------------------------------------------------------------------ multi-rank runs
CONFIGS = [
    {"W": 2, "N": 3, "G": 1},  # C5 with K = 4: more ranks than columns
    {"W": 4, "N": 4, "G": 3},
    {"W": 0, "N": 3, "G": 2},  # pool only
    {"W": 3, "N": 2, "G": 2},  # N = 2: one window row, 1-token candidates
    {"W": 5, "N": 3, "G": 0},  # no verification
    {"W": 1, "N": 4, "G": 5},  # K > W
    {"W": 7, "N": 5, "G": 4},
]
PROMPTS = [
    [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4, 5, 6, 9],
    [10, 11],  # tiny pool: fewer candidates than ranks
    [7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 1, 2, 3, 1, 2, 3, 1, 2],
]
MAX_NEW = 36


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _launch(tmp_path, nproc, lp, *extra, timeout=240, sampling=(), configs=CONFIGS, compiled=False, fork=None):
    """tests/lp_driver.py on ``nproc`` ranks: under ``torchrun --standalone``, or forked from one process
    (lp_driver.fork_ranks) that imported torch once (``fork="ranks"``) or transformers' model code too
    (``fork="ranks-preloaded"``)."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"configs": configs, "prompts": PROMPTS, "max_new_tokens": MAX_NEW,
                                "sampling": list(sampling), "compiled": compiled}))
    out = tmp_path / "out.json"
    launcher = ([sys.executable, str(ROOT / "tests" / "lp_driver.py"), f"--{fork}", str(nproc)] if fork else
                [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", str(ROOT / "tests" / "lp_driver.py")])
    cmd = [*launcher, "--lp", str(lp), "--spec", str(spec), "--out", str(out), *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    return proc, out, time.monotonic() - start


# Lookahead SAMPLING under LP (K = 2): draws are keyed by (seed, position), so K ranks give the same samples as one
# process (hence the same law, which test_sampling.py checks for K = 1). Decoded in the dp2 x lp2 launch, each LP
# group taking half of the seeds.
SAMPLING_SPECS = [
    {"prompt": None, "W": 2, "N": 3, "G": 3, "max_new_tokens": 6, "seeds": list(range(60)),
     "sampling": {"temperature": 1.0}},
    {"prompt": None, "W": 0, "N": 3, "G": 3, "max_new_tokens": 6, "seeds": list(range(60)),
     "sampling": {"temperature": 1.0, "repetition_penalty": 1.2}},
]


def _tiny8_prompt(model):
    """test_sampling.py's prompt: its pool (keyed by the last token 3) holds the model's likely continuation."""
    from exactness import hf_greedy

    base = [1, 2, 3]
    cont = hf_greedy(model, base, 6)
    return base + cont + [5, 3] + cont[:1] + [4] + base


@pytest.fixture(scope="module")
def sampling_specs():
    prompt = _tiny8_prompt(lp_driver.build_tiny8())
    return [dict(s, prompt=prompt) for s in SAMPLING_SPECS]


# One launch per world size, each asserted on by several tests. lp3 (odd K; K > W for the W = 1 and W = 2 configs,
# so some ranks get no column) and dp2 x lp2 (two LP groups of 2 ranks plus data parallelism; also the sampling
# seeds) cover what separate lp2 and lp4 launches checked; the shard plan itself is tested for K = 1..4 above
# without processes.
@pytest.fixture(scope="module")
def launch_lp3(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("lp3"), 3, 3, configs=LP3_CONFIGS, fork="ranks")


@pytest.fixture(scope="module")
def launch_dp2xlp2(tmp_path_factory, sampling_specs):
    return _launch(tmp_path_factory.mktemp("dp2xlp2"), 4, 2, sampling=sampling_specs, timeout=300,
                   configs=DP2_CONFIGS, compiled=True, fork="ranks-preloaded")


# decoding=auto under LP (K = 2, in the dp2 x lp2 launch): every rank decodes with one CostPolicy on rank 0's curve,
# pricing a step by its busiest rank's tokens; one process priced the same way (re-feed) must give the same steps.
# The curve is flat up to 4 tokens, then 2.5 ms a token: 2 ranks can feed twice the nodes at the flat price.
KNEE = {1: 0.010, 4: 0.010, 8: 0.020, 64: 0.160}
AUTO_CONFIGS = [{"W": 0, "N": 4, "G": 3, "curve": KNEE, "price_lp": 2},
                {"W": 2, "N": 3, "G": 2, "curve": KNEE, "price_lp": 2}]
# The successor-table proposer (issue 18) under LP, K = 3 and K = 2: with the debug consistency check on, every rank
# holds the same table each step, and the top-k rows travel in the step's one all-gather. The first one fills the
# table from the prompt's rows at prefill (which every rank computes alike) and cuts its tree so no rank of 3 feeds
# more than 5 nodes (the same cut on every rank, whatever the real LP degree); the second keeps a token table per rank
# of 2 (the product under LP), with the pair table.
SUCC_CONFIGS = [{"W": 0, "N": 4, "G": 2, "succ": 12, "prefill": True, "rank_cap": [3, 5]},
                {"W": 2, "N": 3, "G": 2, "succ": 30, "context": 2, "rank_cap": [2, None], "rank_tables": True}]
LP3_CONFIGS = CONFIGS + SUCC_CONFIGS
DP2_CONFIGS = CONFIGS + AUTO_CONFIGS + SUCC_CONFIGS


@pytest.fixture(scope="module")
def reference():
    """One process over DP2_CONFIGS' grid; lp3's successor configs (after CONFIGS there) under their own keys."""
    grid = lp_driver.decode_grid(lp_driver.tiny_model(), DP2_CONFIGS, PROMPTS, MAX_NEW)
    succ = {f"{int(k.split('/')[0]) - len(AUTO_CONFIGS)}/{k.split('/')[1]}": r
            for k, r in grid.items() if int(k.split("/")[0]) >= len(CONFIGS) + len(AUTO_CONFIGS)}
    return {"dp2": grid, "lp3": {**{k: r for k, r in grid.items() if int(k.split("/")[0]) < len(CONFIGS)}, **succ}}


@pytest.fixture(scope="module")
def reference_dp2():
    """One process per data-parallel share of the dp2 launch: a run's Decoder carries its cross-question store and
    policy calibration from question to question, so each group is compared with its own questions in order."""
    model, out = lp_driver.tiny_model(), {}
    for r in range(2):
        out.update(lp_driver.decode_grid(model, DP2_CONFIGS, PROMPTS, MAX_NEW,
                                         prompt_ids=shard_questions(list(range(len(PROMPTS))), r, 2)))
    return out


def test_lp_pricing_changes_auto_steps(reference):
    # Pricing by the busiest rank must matter here, or equal steps under LP would prove little.
    one_rank = lp_driver.decode_grid(lp_driver.tiny_model(), [dict(c, price_lp=1) for c in AUTO_CONFIGS], PROMPTS,
                                     MAX_NEW)
    auto = [f"{len(CONFIGS) + int(k.split('/')[0])}/{k.split('/')[1]}" for k in one_rank]
    assert [r["decoding_steps"] for r in one_rank.values()] != [reference["dp2"][k]["decoding_steps"] for k in auto]


def test_reference_accepts_candidates(reference):
    # The grid must exercise multi-token steps, or equal step counts would prove little.
    grid = reference["dp2"]
    assert sum(max(r["accept_lengths"]) > 1 for r in grid.values()) >= len(grid) // 2
    assert all(len(r["output_ids"]) == MAX_NEW for r in grid.values())
    succ = [r for k, r in grid.items() if int(k.split("/")[0]) >= len(CONFIGS) + len(AUTO_CONFIGS)]
    assert len(succ) == len(SUCC_CONFIGS) * len(PROMPTS) and sum(max(r["accept_lengths"]) > 1 for r in succ) >= 3


@pytest.mark.parametrize("launch,nproc,lp", [("launch_lp3", 3, 3), ("launch_dp2xlp2", 4, 2)], ids=["lp3", "dp2xlp2"])
def test_lp_matches_single_process(request, reference, reference_dp2, launch, nproc, lp):
    proc, out, secs = request.getfixturevalue(launch)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["world_size"] == nproc and got["dp_size"] == nproc // lp
    assert got["broadcast"] == [["from rank", 0]] * nproc  # distributed.from_rank0: rank 0's object everywhere
    assert got["raised"] == ["bad files, seen by rank 0"] * nproc  # and rank 0's error, raised on every rank
    configs = DP2_CONFIGS if lp == 2 else LP3_CONFIGS
    reference = reference_dp2 if nproc // lp == 2 else reference["lp3"]
    assert set(got["results"]) == set(reference) and len(reference) == len(configs) * len(PROMPTS)
    for key, ref in reference.items():
        cfg = configs[int(key.split("/")[0])]
        assert got["results"][key] == ref, f"config {cfg}, prompt {key.split('/')[1]}"
    for st in got["stats"]:  # one step exchange per decode step (plus a debug check per step)
        assert st["collectives"] > 0 and st["debug_collectives"] > 0
    for st in got["stats"]:  # exactly ONE exchange a step: a rank's grid exchanges = its LP group's steps
        mine = shard_questions(list(range(len(PROMPTS))), st["dp_rank"], nproc // lp)
        assert st["collectives"] == sum(r["decoding_steps"] for k, r in reference.items()
                                        if int(k.split("/")[1]) in mine), st
    print(f"\nK={nproc} lp={lp}: {secs:.1f} s; rank stats {got['stats']}")


def test_lp2_sampling_equals_single_process(launch_dp2xlp2, sampling_specs):
    """Same samples and accepted lengths as one process for every seed, one step exchange per step."""
    proc, out, _ = launch_dp2xlp2
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())["sampling"]
    model = lp_driver.build_tiny8()
    for spec, mine in zip(sampling_specs, got, strict=True):
        ref = lp_driver.decode_seeds(model, spec)
        assert set(mine) == set(ref)
        for seed, r in ref.items():
            assert mine[seed]["output_ids"] == r["output_ids"], (spec["sampling"], seed)
            assert mine[seed]["accept_lengths"] == r["accept_lengths"], (spec["sampling"], seed)
            assert mine[seed]["collectives"] == len(r["accept_lengths"])  # one collective per step, sampling included
        assert any(max(r["accept_lengths"]) > 1 for r in ref.values())  # drafts accepted: verification exercised


def test_lp2_through_captured_buckets_equals_one_eager_process(launch_dp2xlp2):
    """LP K = 2 (the first LP group of the dp2 x lp2 launch), each rank through its own captured bucket
    (compiled.CapturedStep, aot_eager): the same tokens and steps as one eager process, greedy and seeded sampling
    (issue 19; DESIGN invariant 2)."""
    proc, out, _ = launch_dp2xlp2
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(out.read_text())["compiled"] == lp_driver.decode_compiled()


def test_teardown_leaves_no_gloo_thread_for_interpreter_exit(launch_lp3):
    """Issue 11 fault 9. Root cause of the abort at exit: a default ProcessGroup kept alive after
    destroy_process_group (function defaults in torch.distributed.nn.functional, imported after the group existed)
    left gloo's worker threads to be torn down during interpreter finalization. After a teardown every gloo thread
    must be gone (the driver imports transformers' model code after the group exists, as a run does)."""
    proc, _, _ = launch_lp3
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the ranks print to one pipe: their lines may run together, so match the records, not the lines
    records = sorted(re.findall(r"rank (\d+) threads before (\d+) after (\d+)", proc.stdout))
    assert [r[0] for r in records] == ["0", "1", "2"], proc.stdout
    for rank, before, after in records:
        assert int(after) == int(before), f"rank {rank}: {before} threads before the group, {after} after teardown"


# ------------------------------------------------------------------------------------------ failures
def test_rank_raises_job_fails_fast_and_names_rank(tmp_path):
    proc, _, secs = _launch(tmp_path, 2, 2, "--timeout", "10", "--fail", "raise", "--fail-rank", "1", timeout=120)
    assert proc.returncode != 0
    assert secs < 60
    assert "injected failure on rank 1" in proc.stderr
    assert "rank: 1" in proc.stderr  # torchrun's failure summary names the failing rank


def test_rank_killed_job_ends(tmp_path):
    proc, _, secs = _launch(tmp_path, 2, 2, "--timeout", "10", "--fail", "kill", "--fail-rank", "1", timeout=120)
    assert proc.returncode != 0
    assert secs < 60
    assert "rank: 1" in proc.stderr and "Signal 9" in proc.stderr


def test_rank_stuck_outside_collective_times_out(tmp_path):
    # Rank 1 stays alive but never enters the all-gather: rank 0 must raise within the gloo timeout.
    proc, _, secs = _launch(tmp_path, 2, 2, "--timeout", "3", "--fail", "hang", "--fail-rank", "1", timeout=120)
    assert proc.returncode != 0
    assert secs < 45, f"took {secs:.0f} s"
    assert "rank 0: all_gather failed" in proc.stderr
    assert "rank: 0" in proc.stderr


def test_debug_check_names_diverged_rank(tmp_path):
    # the product's own message (how torchrun ends a job whose rank failed: the three tests above), forked ranks
    proc, _, secs = _launch(tmp_path, 3, 3, "--timeout", "10", "--fail", "corrupt", "--fail-rank", "2", timeout=120,
                            fork="ranks")
    assert proc.returncode != 0
    assert "rank(s) [2] hold a different decoding state" in proc.stderr


# ------------------------------------------------------------------------------------------ Slurm scripts
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama plus a character-level tokenizer, saved as a local model folder."""
    from fakes import char_tokenizer

    d = tmp_path_factory.mktemp("tiny_llama")
    char_tokenizer().save_pretrained(d)
    model = lp_driver.tiny_model()
    model.config.eos_token_id, model.config.bos_token_id = 2, 1
    model.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def questions_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("questions") / "q.jsonl"
    rows = [{"question_id": i, "category": "test", "turns": [t]} for i, t in
            enumerate(["abc abc abc abc", "the cat sat on the mat, the cat", "1 2 3 1 2 3 1 2 3"])]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _generate_args(model_dir, questions, out):
    return [f"model.path={model_dir}", "model.dtype=float32", "dataset=jsonl", f"dataset.path={questions}",
            f"output.path={out}", "generation.max_new_tokens=12", "decoding.window_size=3",
            "decoding=paper",  # the pool keeps nothing across questions: steps equal across DP shares and resumes
            "decoding.ngram_size=3",
            "decoding.guess_set_size=2", "parallel.backend=gloo", "progress=false"]


@pytest.fixture(scope="module")
def single_process_answers(tmp_path_factory, tiny_model_dir, questions_file):
    """The reference of the launcher tests: the same job in one process (parallel=lp1), run once in this process
    from the same command-line overrides (Hydra's compose); its answers path."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lp_runtime.cli import CONF_DIR
    from lp_runtime.generate import run

    ref_out = tmp_path_factory.mktemp("reference") / "ref.jsonl"
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("generate", overrides=[*_generate_args(tiny_model_dir, questions_file, ref_out), "parallel=lp1"])
    run(OmegaConf.to_object(cfg))
    return ref_out


def _script(tmp_path, script, *args):
    """Run launch/<script> as sbatch would on one local node (2 ranks, srun left out)."""
    return lp_driver.local_slurm(script, list(args), tmp_path, tmp_path / "run", _env())


def test_slurm_single_node_script_dp2_writes_one_ordered_file_and_resumes(tmp_path, tiny_model_dir, questions_file,
                                                                          single_process_answers):
    """world 2 = dp2 x lp1 through the single-node script: each rank answers its share, rank 0 writes one file in
    dataset order, identical to one process's (tokens and steps); a re-run finds every question done and appends
    nothing."""
    out = tmp_path / "answers.jsonl"
    want = [json.loads(line) for line in single_process_answers.read_text().splitlines()]
    for attempt in range(2):
        proc = _script(tmp_path, "slurm_single_node.sbatch", *_generate_args(tiny_model_dir, questions_file, out),
                       "parallel=lp1")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["question_id"] for r in rows] == [0, 1, 2]
        assert [r["choices"][0]["output_ids"] for r in rows] == [r["choices"][0]["output_ids"] for r in want]
        assert [r["choices"][0]["decoding_steps"] for r in rows] == [r["choices"][0]["decoding_steps"] for r in want]
        if attempt == 0:
            first = out.read_bytes()
            assert list((tmp_path / "run").rglob("*.log")), "torchrun per-rank logs missing"
    assert out.read_bytes() == first


WAITS_FOR_RANK0 = """
import sys, time
import torch.distributed as dist
from lp_runtime import cli, distributed

def app():
    dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[2])
    print("ready", flush=True)
    distributed.from_rank0(lambda: time.sleep(120), timeout_s=300)  # rank 0 measures for minutes

cli.main(app, interrupted="interrupted")
"""


def test_a_rank_waiting_for_rank0_takes_ctrl_c_at_once(tmp_path):
    """Rank 1 waits in from_rank0 while rank 0 computes: Ctrl-C reached it only when torchrun killed it 30 s later
    (a blocking collective; a new user, 2026-12-04), and then the process group's teardown at exit waited for the
    collective. Now it polls, and an interrupted rank leaves without that teardown: one line, exit 130."""
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", WAITS_FOR_RANK0, str(rank), port], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) for rank in (0, 1)]
    try:
        assert procs[1].stdout.readline().strip() == "ready"
        time.sleep(1.0)  # rank 1 is inside from_rank0 by now
        procs[1].send_signal(signal.SIGINT)
        out, err = procs[1].communicate(timeout=20)  # was: blocked until rank 0 answered (120 s here)
        assert (procs[1].returncode, err.splitlines()[-1:]) == (130, ["interrupted"]), err[-2000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()


GATHER_AFTER_A_LONG_QUESTION = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
from lp_runtime import distributed

rank, wait = int(sys.argv[1]), sys.argv[3] == "wait"
dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[2],
                        timeout=timedelta(seconds=1))  # parallel.timeout_s=1
group = distributed.waiting_group(60) if wait else None
time.sleep(4 * rank)  # rank 1's question takes 4 s longer than rank 0's
try:
    print(distributed.gather_objects_to_rank0(f"answer {rank}", group), flush=True)
except RuntimeError as e:
    print(f"failed: {e}"[:60], flush=True)
distributed.release_group(group)
"""


@pytest.mark.parametrize("wait", ["wait", "no_wait"])
def test_data_parallel_ranks_wait_for_each_others_questions(tmp_path, wait):
    """Data parallelism gathered each round's answers under parallel.timeout_s: a rank whose partner's question took
    that much longer failed, blaming a dead peer, with rank 0's finished answer lost (a new user, 2026-12-07). The
    round's gather first waits in a group of its own (generate.ROUND_WAIT_S)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", GATHER_AFTER_A_LONG_QUESTION, str(rank), port, wait], env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in (0, 1)]
    try:
        out = [p.communicate(timeout=60)[0].strip() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    if wait == "wait":
        assert out == ["['answer 0', 'answer 1']", "None"]
    else:  # the collective's own timeout: what generate did before
        assert out[0].startswith("failed: rank 0: gather of results to rank 0 (")
