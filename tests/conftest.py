"""Shared pytest fixtures."""
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

# The suite never downloads: a model that is not on disk fails at once. huggingface_hub reads this when it is
# first imported (by the test modules, through lp_runtime), and every test and subprocess inherits it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

# torch's default for this machine (one per core, or OMP_NUM_THREADS), shared out among pytest-xdist's workers
# (`make test` runs 2): each worker's SmolLM2 tests get their share of the cores, not all of them. Set by
# _setup_torch in every process that runs tests (a worker, or a run without xdist), not in xdist's controller,
# which only hands out tests: importing torch and transformers there (~5 s of CPU) held back every worker's start.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = 1


def _setup_torch() -> None:
    global THREADS
    import torch

    THREADS = max(1, torch.get_num_threads() // WORKERS)
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the processes the tests start run tiny models too


if os.environ.get("PYTEST_XDIST_WORKER"):
    _setup_torch()  # a worker: before its test modules are imported


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Without xdist (or with --collect-only) this process runs the tests: torch as in a worker. xdist's controller
    only sets OMP_NUM_THREADS, which its workers inherit (as they did when it imported torch here)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    controller = (config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))
                  and not config.getoption("collectonly"))
    if controller:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    else:
        _setup_torch()


# pytest-xdist (`make test` runs 2 workers, --dist loadscope): a test module is one unit of work, so its module
# fixtures are built once, and the two SmolLM2 modules sharing the greedy references are one unit. Units are handed
# out heaviest first, the rest by their number of tests, so no worker is left with a long module at the end. The
# order is by seconds under 2 workers on a cold cache, as CI runs (results/test_time/durations_2026-12-03_n2.txt
# plus the one-time work: the SmolLM2 references convert the bundled GGUF, ~45 s; test_compiled's inductor test
# compiles its kernels, ~45 s); SmolLM2 first, so its copy is there before the other modules that load it. A module
# missing from HEAVY only runs later than it could.
UNITS = {"tests/test_api.py": "smollm2 references", "tests/test_exactness_smollm2.py": "smollm2 references"}
HEAVY = ["smollm2 references", "tests/test_parallel.py", "tests/test_cli.py", "tests/test_compiled.py",
         "tests/test_sweeps.py", "tests/test_sampling.py", "tests/test_faults.py", "tests/test_bench.py",
         "tests/test_lp_auto.py", "tests/test_input_checks.py", "tests/test_successors.py",
         "tests/test_tree_decoding.py", "tests/test_auto.py", "tests/test_exactness_tiny.py", "tests/test_models.py"]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own choice
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadscope``: modules (and ``UNITS``) as units of work, ``HEAVY`` ones first."""
    if config.getvalue("dist") != "loadscope":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    class Modules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return UNITS.get(module, module)

        def _assign_work_unit(self, node) -> None:
            rank = {unit: i for i, unit in enumerate(HEAVY)}
            self.workqueue = OrderedDict(sorted(self.workqueue.items(),
                                                key=lambda kv: (rank.get(kv[0], len(HEAVY)), -len(kv[1]))))
            super()._assign_work_unit(node)

    return Modules(config, log)


@contextmanager
def all_threads():
    """torch's default thread count inside, one thread after."""
    import torch

    torch.set_num_threads(THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _torch_threads(request):
    """The suite runs torch on one thread: tiny random models' matmuls are too small to share, and a second thread
    only waits (many times slower when other processes hold the cores). Tests of the bundled SmolLM2 (and the
    fixtures that decode it) get torch's default."""
    if "smollm2" not in request.fixturenames:
        yield
        return
    with all_threads():
        yield


@contextmanager
def exclusive(lock: Path):
    """Hold an exclusive ``fcntl.flock`` on the file ``lock`` (made when absent) inside: one pytest-xdist worker
    at a time, the others wait there. For one-time work every worker would otherwise do at once."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def shared_temp(tmp_path_factory) -> Path:
    """A temporary folder of this run that every pytest-xdist worker sees (the parent of the workers' own base
    folders, .../pytest-N/); the base folder itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(model, tokenizer): the bundled SmolLM2-135M-Instruct, float32 on CPU. The first run converts the GGUF
    (~45 s of CPU): one worker converts, under a lock of this run, while the other waits for its copy instead of
    converting too (both could, on a cold cache, each on one of CI's 2 cores)."""
    from lp_runtime import bundled
    from lp_runtime.config import ModelConfig
    from lp_runtime.models import load_model

    with exclusive(shared_temp(tmp_path_factory) / "smollm2.lock"):
        with all_threads():
            bundled.bundled_cache("smollm2")
    with all_threads():
        return load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))


@pytest.fixture(scope="session")
def smollm2_greedy(smollm2):
    """(eos ids, questions, prompt ids, references): 1 MT-Bench first turn (chat template) and 1 HumanEval prompt
    (raw) with transformers' greedy ``generate`` of SMOLLM2_NEW new tokens each, computed once for the SmolLM2
    end-to-end checks (test_exactness_smollm2.py, test_api.py)."""
    from exactness import SMOLLM2_NEW, hf_greedy
    from lp_runtime.config import DatasetConfig
    from lp_runtime.data import build_prompt, load_questions
    from lp_runtime.checks import eos_token_ids

    model, tok = smollm2
    questions = load_questions(DatasetConfig(name="mt_bench", limit=1, first_turn_only=True))
    questions += load_questions(DatasetConfig(name="humaneval", limit=1))
    eos = eos_token_ids(model, tok, None)
    prompts = [build_prompt(tok, q, []) for q in questions]
    with all_threads():
        return eos, questions, prompts, [hf_greedy(model, p, SMOLLM2_NEW, eos_token_id=eos) for p in prompts]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer random Llama with SmolLM2's tokenizer (chat template included), saved as a local folder: built
    once per run, by the first worker that needs it (the others wait for it, then share it; the tests only read
    it). SmolLM2's tokenizer comes from the converted cache, else from the GGUF (~10 s of CPU on a cold cache)."""
    out = shared_temp(tmp_path_factory) / "tiny_llama0"
    with exclusive(out.with_suffix(".lock")):
        if not out.is_dir():
            build = out.with_suffix(".tmp")
            _save_tiny_llama(build)
            build.rename(out)  # complete or absent
    return out


def _save_tiny_llama(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from lp_runtime import models

    cached = Path(models.cache_root()) / "smollm2-135m-instruct"
    if (cached / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(cached)
    else:
        folder, gguf_file, _ = models.bundled_gguf("smollm2")
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng():  # the same weights whichever worker builds it; no test's random state touched
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
