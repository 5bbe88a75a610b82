"""decoding=auto under lookahead parallelism: steps priced by the busiest rank's tokens (the shard plan), the same
choice on every rank, and K ranks identical in tokens AND steps to one process (re-feed commit, same pricing).

The main job under LP runs ``python -m lp_runtime.generate`` through launch/slurm_multi_node.sbatch on this
machine (torchrun's c10d rendezvous, 2 ranks, gloo, one thread per rank): that one launch is also the test of the
multi-node script (test_parallel.py runs the single-node one); every latency curve is synthetic or seeded into a
temporary profile folder, so nothing measures the machine.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import lp_driver  # noqa: E402

from lp_runtime.tree import CandidateTree  # noqa: E402
from lp_runtime.parallel import max_rank_tokens  # noqa: E402
from fakes import char_tokenizer  # noqa: E402
from lp_runtime.policy import CostPolicy  # noqa: E402

# Flat up to 4 tokens, then 2.5 ms a token: 2 ranks can feed twice the nodes of one process at the flat price.
KNEE = {1: 0.010, 4: 0.010, 8: 0.020, 64: 0.160}
CONFIGS = [{"W": 0, "N": 4, "G": 3, "curve": KNEE, "price_lp": 2},
           {"W": 2, "N": 3, "G": 2, "curve": KNEE, "price_lp": 2}]
PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
    [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4, 5, 6, 9, 11, 3, 4, 5],
    [7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 1, 2, 3, 1, 2, 3, 1, 2],
]
MAX_NEW = 32


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HYDRA_FULL_ERROR"):
        env.pop(k, None)
    return env


# ------------------------------------------------------------------------------------------ pricing, no processes
def test_max_rank_tokens():
    chains = [-1, 0, 1, -1, 3, 4]                       # two chains of 3 nodes
    assert max_rank_tokens(1, 0, 0, chains, 1) == 7     # one process: 1 pending + 6 nodes
    assert max_rank_tokens(1, 0, 0, chains, 2) == 4     # a chain per rank
    assert max_rank_tokens(2, 0, 0, chains, 3) == 5     # a third rank idles; pending fed on every rank
    # W = 6, 2 levels over 3 ranks (parallel.tree_plan's worked example) + the chains
    assert max_rank_tokens(1, 6, 2, [], 1) == 1 + 5 + 12
    assert max_rank_tokens(1, 6, 2, chains, 3) == 1 + 11


def test_lp_pricing_feeds_what_pays_on_the_busiest_rank():
    t = CandidateTree([11, 12, 13, 21, 22, 23], [-1, 0, 1, -1, 3, 4], [0.9, 0.9, 0.9, 0.6, 0.9, 0.9])
    one = CostPolicy(KNEE)
    # one process: 3 nodes (q = 4) at the flat price beat 6 nodes at q = 7 (17.5 ms)
    assert one.choose(t, num_pending=1, window_tokens=0).nodes == (0, 1, 2)
    two = CostPolicy(KNEE)
    two.price_lp(2, 0)
    choice = two.choose(t, num_pending=1, window_tokens=0)
    assert choice.nodes == (0, 1, 2, 3, 4, 5) and choice.expected_seconds == 0.010  # each rank feeds 1 + 3
    # the window: W = 4, 2 levels = 3 + 8 = 11 tokens in one process, split by columns over 2 ranks
    win = CostPolicy({1: 0.010, 64: 0.011}, window_gain=0.5)
    win.price_lp(2, 4)
    c = win.choose(t, num_pending=1, window_tokens=11)
    assert c.use_window and c.expected_seconds == pytest.approx(
        CostPolicy({1: 0.010, 64: 0.011}).curve(max_rank_tokens(1, 4, 2, t.parents, 2)))
    with pytest.raises(ValueError, match="10 window tokens is not a window of W=4 columns"):
        win.choose(t, num_pending=1, window_tokens=10)
    with pytest.raises(ValueError, match="need lp_size >= 1"):
        win.price_lp(0, 4)


def test_decoder_prices_lp_steps_and_refuses_auto_without_a_shared_curve():
    from lp_runtime.config import ConfigError, DecodingConfig
    from lp_runtime.decoder import Decoder

    from lp_runtime.parallel import LocalGroup

    class FakeLP(LocalGroup):  # two ranks, as Decoder.__init__ reads a group
        size = 2

    model = lp_driver.tiny_model()
    policy = CostPolicy(KNEE)
    Decoder(model, DecodingConfig(method="auto", window_size=3, ngram_size=3, guess_set_size=2), lp=FakeLP(),
            step_policy=policy)
    assert (policy.lp_size, policy.window_size) == (2, 3)
    with pytest.raises(ConfigError) as e:  # DecodingConfig() is decoding=auto
        Decoder(model, DecodingConfig(), lp=FakeLP())
    assert str(e.value) == ("decoding.method='auto' needs its cost policy: pass step_policy=lp_runtime.auto."
                            "auto_policy(model) (this machine's latency profile; LookaheadGenerator does), or "
                            "DecodingConfig(method='lookahead', ...) for a fixed W, N, G")


# ------------------------------------------------------------------------------------------ torchrun (Slurm script)
# The K = 2 equality of decoding=auto (tokens and steps) and from_rank0 across ranks are checked in
# tests/test_parallel.py's dp2 x lp2 launch (AUTO_CONFIGS), so they cost no torchrun launch of their own.
def test_from_rank0_in_one_process_computes_and_raises_in_place():
    from lp_runtime import distributed

    assert distributed.from_rank0(lambda: "alone") == "alone"
    with pytest.raises(KeyError, match="no such"):
        distributed.from_rank0(lambda: {}["no such"])


def _job_in_one_process(model_dir, questions, summary, table):
    """The lp2 job's decodes in one process: its chosen setting on its curve priced for 2 ranks, re-feed, and the
    product's proposers for K = 2 (``table``: None = as ``decoding.successors`` says, False = none), one decoder
    over the questions in order. ([(output_ids, decoding_steps)] per question, transformers' greedy outputs)."""
    from exactness import hf_greedy
    from lp_runtime import checks, data, latency, models
    from lp_runtime.checks import vocab_size
    from lp_runtime.config import DatasetConfig, DecodingConfig, ModelConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.successors import successor_proposers

    model, tok = models.load_model(ModelConfig(path=str(model_dir), device="cpu", dtype="float32"))
    decoding = DecodingConfig(**summary["auto_decoding"]["chosen"])
    policy = CostPolicy(latency.curve_of(summary["auto_decoding"]))
    policy.price_lp(2, decoding.window_size)
    eos = checks.eos_token_ids(model, tok, None)
    dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, step_policy=policy, copy_kv=False,
                  proposers=successor_proposers(decoding, vocab_size(model), lp_size=2, table=table))
    prompts = [data.build_prompt(tok, q, []) for q in data.load_questions(DatasetConfig(name="jsonl",
                                                                                       path=str(questions)))]
    outs = [dec.generate(p, max_new_tokens=12) for p in prompts]
    return [(o.output_ids, o.decoding_steps) for o in outs], [hf_greedy(model, p, 12, eos) for p in prompts]


def test_generate_auto_under_torchrun_uses_rank0s_profile(tmp_path):
    """The main job with decoding=auto and parallel=lp2: rank 0 reads the (seeded) profile and prints one line,
    both ranks decode on its curve, the answers equal plain greedy's, and the summary records the choice. Launched
    by the multi-node Slurm script: its default parallel=lp2 (2 ranks a node) over the c10d rendezvous answers every
    question once and leaves torchrun's per-rank logs. With the
    default decoding.successors=auto the successor table is on at K = 2 (issue 18): the same tokens and steps as
    one process with the same total budget and pricing, steps that the table changed."""
    from lp_runtime import auto, latency, models
    from lp_runtime.config import DecodingConfig, ModelConfig

    model_dir = tmp_path / "tiny"
    model = lp_driver.tiny_model()
    model.config.eos_token_id, model.config.bos_token_id = 2, 1
    model.save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    loaded, _ = models.load_model(ModelConfig(path=str(model_dir), device="cpu", dtype="float32"))
    cache = tmp_path / "cache"
    curve = {1: 0.010, 4: 0.010, 8: 0.020, 64: 0.160}
    key = models.model_id_of(loaded)
    rank_cpu = latency.cpu_key(1)  # a rank's key: one thread
    latency.latency_profile(key, rank_cpu, "float32", measure=lambda: curve, root=str(cache))  # as if measured
    path = latency.profile_path(key, rank_cpu, "float32", str(cache))
    prof = json.loads(Path(path).read_text())
    w = auto.auto_window(curve, 4, lp_size=2)  # the window priced per rank
    prof["calibration"] = {f"W{w} N4 G3 T{auto.CALIBRATION_TOKENS}": {
        "tokens": 40, "steps": 20, "mean_step_tokens": 3.0, "expected_speedup": 1.5, "low": 1.2, "high": 1.8,
        "prompts": 4, "max_new_tokens": auto.CALIBRATION_TOKENS}}  # no calibration decode either
    Path(path).write_text(json.dumps(prof))
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "t", "turns": [t]}) + "\n"
                                 for i, t in enumerate(["abc abc abc abc", "1 2 3 1 2 3 1 2 3"])))
    common = [f"model.path={model_dir}", "model.dtype=float32", "dataset=jsonl", f"dataset.path={questions}",
              "generation.max_new_tokens=12", "decoding.ngram_size=4", "decoding.guess_set_size=3",
              "parallel.backend=gloo", "progress=false"]
    out = tmp_path / "lp" / "answers.jsonl"
    # launch/slurm_multi_node.sbatch on one local node of 2 ranks: its default parallel=lp2 over the c10d rendezvous
    proc = lp_driver.local_slurm("slurm_multi_node.sbatch", [*common, "decoding=auto", f"output.path={out}"],
                                 tmp_path, tmp_path / "run", dict(_env(), LP_RUNTIME_CACHE=str(cache)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert list((tmp_path / "run").rglob("*.log")), "torchrun per-rank logs missing"
    assert proc.stdout.count("decoding=auto: ") == 1 and "measuring" not in proc.stdout  # rank 0, cached profile
    summary = json.loads(out.with_name("answers.summary.json").read_text())
    assert summary["auto_decoding"]["reused_profile"] is True and summary["auto_decoding"]["profile"] == path
    assert summary["auto_decoding"]["calibration"]["expected_speedup"] == 1.5  # the seeded one: nothing decoded
    assert summary["lp_communication"]["lp_degree"] == 2
    ref = tmp_path / "greedy" / "answers.jsonl"  # plain greedy, the same job in this process
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lp_runtime.cli import CONF_DIR
    from lp_runtime.generate import run

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("generate", overrides=[*common, "decoding=greedy", "parallel=lp1", f"output.path={ref}"])
    run(OmegaConf.to_object(cfg))  # greedy: no profile, so the cache folder does not matter here
    rows = [[json.loads(x)["choices"][0] for x in p.read_text().splitlines()] for p in (out, ref)]
    assert [json.loads(x)["question_id"] for x in out.read_text().splitlines()] == [0, 1]  # each question once
    assert [c["output_ids"] for c in rows[0]] == [c["output_ids"] for c in rows[1]]
    assert sum(sum(c["decoding_steps"]) for c in rows[0]) < sum(sum(c["decoding_steps"]) for c in rows[1])
    assert DecodingConfig(**summary["auto_decoding"]["chosen"]).method == "auto"
    assert summary["settings"]["decoding.successors"] == "auto"
    lp_rows = [(c["output_ids"][0], c["decoding_steps"][0]) for c in rows[0]]
    one_process, transformers_greedy = _job_in_one_process(model_dir, questions, summary, table=None)
    assert lp_rows == one_process and [ids for ids, _ in lp_rows] == transformers_greedy
    no_table, _ = _job_in_one_process(model_dir, questions, summary, table=False)
    assert [s for _, s in lp_rows] != [s for _, s in no_table]  # the table took part


def test_main_job_defaults_to_the_cost_policy_in_the_native_dtype():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lp_runtime.config import RunConfig
    from lp_runtime.cli import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = OmegaConf.to_object(compose("generate"))
        fixed = OmegaConf.to_object(compose("generate", overrides=["decoding=lookahead", "model.dtype=float32"]))
    assert isinstance(cfg, RunConfig)
    assert (cfg.decoding.method, cfg.model.dtype, cfg.model.path) == ("auto", "auto", "bundled:smollm2")
    assert (cfg.decoding.ngram_size, cfg.decoding.guess_set_size, cfg.decoding.max_depth) == (6, 4, 24)  # bounds
    assert (fixed.decoding.method, fixed.decoding.window_size, fixed.model.dtype) == ("lookahead", 0, "float32")
