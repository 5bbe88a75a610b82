"""Distributed setup: rank detection (torchrun, then Slurm's ``SLURM_PROCID``/``SLURM_NTASKS`` with
``MASTER_ADDR`` or ``HEAD_NODE``), process groups, and collectives that raise ``RuntimeError`` after the group's
timeout (``parallel.timeout_s``) instead of hanging. The only module that imports ``torch.distributed``::

    torchrun --standalone --nproc-per-node=2 -m lp_runtime.generate parallel=lp2 hydra.run.dir=outputs/run1
    srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=$HEAD:29500 --rdzv-id=$SLURM_JOB_ID -m lp_runtime.generate parallel=lp8"""
from __future__ import annotations

import atexit
import os
import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
# Imported before any process group exists: its functions take `group=group.WORLD` as a default argument, and
# imported later (transformers does, lazily) they keep the destroyed default group alive, so gloo's threads are
# torn down at interpreter exit and sometimes abort a finished rank (SIGABRT).
import torch.distributed.nn.functional  # noqa: F401,E402

from .config import ConfigError, PeerFailure


@dataclass(frozen=True)
class RankInfo:
    """Global ``rank`` of ``world_size``, ``local_rank`` on its node; ``source``: "torchrun", "slurm" or "single"."""

    rank: int
    world_size: int
    local_rank: int
    source: str


def detect() -> RankInfo:
    """Rank, world size and local rank from the environment (torchrun first, then Slurm, else one process)."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return RankInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), "torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return RankInfo(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)), "slurm")
    return RankInfo(0, 1, 0, "single")


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``nccl`` when CUDA is available, else ``gloo``; ``gloo``/``nccl`` (checked by ``ParallelConfig``)
    pass through."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def validate(world_size: int, lp: int, backend: str, local_rank: int, num_gpus: int) -> None:
    """``ConfigError`` naming the numbers unless ``lp`` (>= 1, checked by ``ParallelConfig``) divides ``world_size``
    and, with ``nccl``, every local rank has its own of the ``num_gpus`` GPUs visible here."""
    if world_size == 1 and lp > 1:  # one process started: a new user ran parallel=lp2 without torchrun
        raise ConfigError(f"parallel.lp={lp} needs {lp} ranks and one process was started; launch it with torchrun "
                          f"--nproc-per-node={lp} -m lp_runtime.generate ... or NPROC={lp} "
                          f"launch/torchrun_single_node.sh parallel.lp={lp} ... (README, Usage)")
    if world_size % lp != 0:
        raise ConfigError(f"parallel.lp={lp} does not divide the world size {world_size}; start a multiple of {lp} "
                          f"ranks (world = dp x lp) or choose parallel.lp among the divisors of {world_size}")
    if backend == "nccl" and num_gpus == 0:
        raise ConfigError("parallel.backend=nccl needs CUDA GPUs and none is visible on this machine; use "
                          "parallel.backend=gloo (CPU)")
    if backend == "nccl" and local_rank >= num_gpus:
        raise ConfigError(f"parallel.backend=nccl needs one GPU per local rank: local rank {local_rank} but "
                          f"{num_gpus} GPUs; start at most {num_gpus} ranks per node or use parallel.backend=gloo")


def _slurm_head() -> Optional[str]:
    """First host of the Slurm allocation: ``HEAD_NODE``, else the first entry of a simple node list."""
    if os.environ.get("HEAD_NODE"):
        return os.environ["HEAD_NODE"]
    nodes = os.environ.get("SLURM_JOB_NODELIST", "")
    prefix, _, rest = nodes.split(",")[0].partition("[")  # node[01-04] -> node01 (full expansion needs scontrol)
    return prefix + rest.split("-")[0].rstrip("]") if nodes else None


_STATE: dict[str, Any] = {"initialized_here": False, "timeout_s": None}


def init(backend: str, timeout_s: float) -> RankInfo:
    """Join the default process group (no-op for one process without a launcher); return this rank's info.
    ``backend``: ``gloo`` or ``nccl`` (``resolve_backend``; nccl sets ``cuda:LOCAL_RANK`` first); ``timeout_s``:
    seconds any collective may wait for its peers. ``ConfigError`` under Slurm without torchrun, MASTER_ADDR or
    HEAD_NODE."""
    info = detect()
    if dist.is_initialized() or info.source == "single":
        return info
    if info.source == "slurm":
        if "MASTER_ADDR" not in os.environ:
            head = _slurm_head()
            if head is None:
                raise ConfigError("under Slurm without torchrun set MASTER_ADDR or HEAD_NODE to the first node's host")
            os.environ["MASTER_ADDR"] = head
        os.environ.setdefault("MASTER_PORT", "29500")
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend=backend, init_method="env://", rank=info.rank, world_size=info.world_size,
                            timeout=timedelta(seconds=timeout_s))
    _STATE.update(initialized_here=True, timeout_s=timeout_s)
    atexit.register(destroy)
    return info


def destroy(barrier: bool = False) -> None:
    """Leave the process group if this module joined it (safe twice, and at exit). ``barrier``: wait for every
    rank first (the normal end), so no rank tears down gloo connections a peer still uses."""
    if _STATE["initialized_here"] and dist.is_initialized():
        try:
            if barrier:
                dist.barrier()
            dist.destroy_process_group()
        except Exception:  # at exit after a peer died: nothing left to clean up
            pass
    _STATE["initialized_here"] = False


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_initialized() else detect().rank


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else detect().world_size


def make_groups(lp: int):
    """``(lp_group, dp_rank, dp_size)`` of contiguous LP groups, ranks [i*lp, (i+1)*lp) forming group i
    (``lp_group`` None for one process). Collective; ``lp`` must divide the world size (``validate``)."""
    world, me = world_size(), rank()
    dp_size, dp_rank = world // lp, me // lp
    if not is_initialized() or lp == world:
        return (dist.group.WORLD if is_initialized() else None), dp_rank, dp_size
    mine, _ = dist.new_subgroups_by_enumeration([list(range(i * lp, (i + 1) * lp)) for i in range(dp_size)],
                                                timeout=timedelta(seconds=_STATE["timeout_s"] or 120.0))
    return mine, dp_rank, dp_size


def _fail(what: str, err: Exception) -> PeerFailure:
    first = (str(err).strip().splitlines() or [""])[0]
    return PeerFailure(f"rank {rank()}: {what} failed (a peer rank died, or did not reach it within the "
                       f"{_STATE['timeout_s']} s timeout parallel.timeout_s): {type(err).__name__}: {first}")


# torch >= 2.12 renames all_gather_into_tensor (same signature) and warns on the old name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_gather_fixed(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather a tensor of the same shape and dtype from every rank of ``group``: (group size, *shape).
    ``RuntimeError`` naming this rank when the collective fails or times out."""
    size = dist.get_world_size(group)
    out = torch.empty(size * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    try:
        _all_gather_single(out, tensor.contiguous().view(-1), group=group)
    except Exception as e:  # gloo: RuntimeError / DistBackendError on timeout or a closed peer
        raise _fail("all_gather", e) from e
    return out.view((size,) + tuple(tensor.shape))


def waiting_group(seconds: float) -> Any:
    """A group of every rank whose collectives time out after ``seconds``, for ``gather_objects_to_rank0``'s wait
    (None for one process); every rank must call, and release it with ``release_group``."""
    if not is_initialized():
        return None
    group = dist.new_group(list(range(dist.get_world_size())), timeout=timedelta(seconds=seconds))
    try:  # connected now, while every rank is here: NCCL connects a group at its first collective, under the
        _wait_for_all(group)  # store's timeout (parallel.timeout_s), not the group's
    except Exception as e:
        raise _fail("setting up the wait for the other ranks' answers", e) from e
    return group


def gather_objects_to_rank0(obj: Any, wait: Any = None) -> Optional[list[Any]]:
    """One picklable object per rank, in rank order, on rank 0 (None elsewhere; [obj] for one process); for the
    end-of-run merge, never inside a decode step. ``wait`` (a ``waiting_group``): first wait for every rank there,
    under its timeout, taking Ctrl-C meanwhile (data-parallel ranks finish their questions at different times).
    ``RuntimeError`` naming this rank when the collective fails."""
    if not is_initialized():
        return [obj]
    size = dist.get_world_size()
    out = [None] * size if dist.get_rank() == 0 else None
    start = time.perf_counter()
    try:
        if wait is not None:
            _wait_for_all(wait)
        if dist.get_backend() == "nccl":  # gather_object is not supported by NCCL
            everyone = [None] * size
            dist.all_gather_object(everyone, obj)
            return everyone if dist.get_rank() == 0 else None
        dist.gather_object(obj, out, dst=0)
    except Exception as e:
        raise _fail(f"gather of results to rank 0 ({time.perf_counter() - start:.1f} s)", e) from e
    return out


def from_rank0(compute: Callable[[], Any], *, timeout_s: Optional[float] = None) -> Any:
    """``compute()`` run on global rank 0 only, its picklable result on every rank; every rank must call. For
    start-up decisions, never inside a decode step. When ``compute`` raises on rank 0, every rank raises that
    error, so none waits for a result that never comes. ``timeout_s``: how long the others may wait for rank 0.
    ``RuntimeError`` naming this rank when the collective fails or times out."""
    if not is_initialized():
        return compute()
    # made by every rank before rank 0 computes: a rank waiting in new_group took no Ctrl-C
    group = None if timeout_s is None else dist.new_group(list(range(dist.get_world_size())),
                                                          timeout=timedelta(seconds=timeout_s))
    box: list[Any] = [None]
    err: Optional[Exception] = None
    if dist.get_rank() == 0:
        try:
            box = [(True, compute())]
        except Exception as e:  # sent to the others, then raised here too
            err = e
            try:
                pickle.dumps(e)
                box = [(False, e)]
            except Exception:  # an error that does not pickle travels as its type and message
                box = [(False, RuntimeError(f"rank 0: {type(e).__name__}: {e}"))]
    start = time.perf_counter()
    try:  # a Ctrl-C leaves the group as it is: destroying it would wait for the pending collective
        _wait_for_all(group)
        dist.broadcast_object_list(box, src=0, group=group)
    except Exception as e:
        release_group(group)
        raise _fail(f"broadcast from rank 0 ({time.perf_counter() - start:.1f} s)", e) from e
    release_group(group)
    ok, value = box[0]
    if not ok:
        raise err if err is not None else value
    return value


def release_group(group) -> None:
    """Destroy a group made here (``waiting_group``, ``from_rank0``'s); nothing for None."""
    if group is not None:
        dist.destroy_process_group(group)


def _wait_for_all(group) -> None:
    """Block until every rank of ``group`` reaches this point, polling so that Ctrl-C and SIGTERM reach Python
    meanwhile: a rank waiting in a blocking collective while rank 0 measured for minutes took a Ctrl-C only when
    torchrun killed it, 30 s later (a new user, 2026-12-04). ``group``'s timeout bounds the wait. Raises what the
    collective raises (a timeout, a dead peer)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    work = dist.all_reduce(torch.zeros(1, device=device), group=group, async_op=True)
    while not work.is_completed():
        time.sleep(0.05)
    work.wait()


def group_ranks(group=None) -> list[int]:
    """Global ranks of ``group``'s members in group-rank order ([0] for one process)."""
    if not is_initialized():
        return [0]
    return [dist.get_global_rank(group, i) if group is not None else i for i in range(dist.get_world_size(group))]


def group_rank(group=None) -> int:
    """This process's rank inside ``group`` (0 for one process)."""
    return dist.get_rank(group) if is_initialized() else 0


def comm_device(group=None, like: Optional[torch.device] = None) -> torch.device:
    """Where a collective's buffers must live: ``like`` (or the current GPU) for NCCL, the CPU for gloo."""
    if is_initialized() and dist.get_backend(group) == "nccl":
        return like if like is not None and like.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
