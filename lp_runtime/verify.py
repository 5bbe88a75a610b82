"""Verification branch: choose the accepted tokens of a step (paper section 3.2 and Algorithm 2, appendix A).

Greedy verification is a pure function over token ids; sampling verification (appendix B) a pure function
over processed probability rows, candidates and uniform draws. No model needed.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


def greedy_verify(next_token: int, candidates: Sequence[Sequence[int]],
                  cand_argmax: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """Longest verified candidate prefix plus the bonus token.

    Args:
        next_token: x1, the argmax at ``c`` (the newest accepted token).
        candidates: G' candidates, each N-1 token ids (positions p+1 .. p+N-1).
        cand_argmax: for each candidate, the argmax at each of its N-1 tokens (same shape).

    Candidate g's token i is verified while it equals the argmax at its token i-1 (x1 for i = 0). The
    longest run m wins (the first candidate on ties); the step accepts those m tokens plus the bonus token
    the model predicted after them, so 1 .. N tokens (DESIGN.md section 1: a full match keeps the bonus).

    Returns:
        (accepted token ids, index of the winning candidate or -1 when none matched).

    Example::

        >>> greedy_verify(7, [[7, 8, 9], [7, 3, 1]], [[8, 9, 4], [5, 0, 0]])
        ([7, 8, 9, 4], 0)
        >>> greedy_verify(7, [[6, 8, 9]], [[8, 9, 4]])
        ([7], -1)
    """
    best_len, best = 0, -1
    for g, (cand, out) in enumerate(zip(candidates, cand_argmax)):
        m, expected = 0, next_token
        while m < len(cand) and cand[m] == expected:
            expected = out[m]
            m += 1
        if m > best_len:
            best_len, best = m, g
    if best < 0:
        return [int(next_token)], -1
    cand, out = candidates[best], cand_argmax[best]
    return [int(t) for t in cand[:best_len]] + [int(out[best_len - 1])], best


# ------------------------------------------------------------------------------------ sampling (appendix B)
def node_children(candidates: Sequence[Sequence[int]], prefix: Sequence[int]) -> list[int]:
    """The distinct tokens that follow ``prefix`` in the candidates that start with it, in candidate order.

    The candidates form a trie; a node is an accepted prefix, its children the draft tokens to try there.
    ``[]`` when no candidate continues ``prefix`` (a full match: the next token is the bonus token).

        >>> node_children([[7, 8], [7, 3], [6, 1], [7, 8]], [])
        [7, 6]
        >>> node_children([[7, 8], [7, 3], [6, 1], [7, 8]], [7])
        [8, 3]
    """
    k = len(prefix)
    out: list[int] = []
    for cand in candidates:
        if len(cand) > k and list(cand[:k]) == list(prefix) and int(cand[k]) not in out:
            out.append(int(cand[k]))
    return out


def node_outcome(probs, children: Sequence[int], u: Sequence[float]) -> int:
    """One trie node of sampling verification: try the draft tokens ``children`` in order, then the residual.

    ``probs``: the node's processed distribution, float (V,) tensor (or sequence), non-negative, sum > 0.
    ``u``: ``len(children) + 1`` uniforms in [0, 1). Draft d (a point mass) is accepted with probability
    min(1, p(d) / 1) = p(d) under the current residual p; on rejection p(d) is set to 0 and p renormalised.
    When every child is rejected, the token is drawn from the residual by inverse CDF with the last uniform,
    so it is never a child. The returned token is therefore distributed exactly as ``probs`` (the accepted
    child, or the residual sample that ends the step).
    """
    p = torch.as_tensor(probs, dtype=torch.float64)
    total = float(p.sum())
    rejected: list[int] = []
    for k, d in enumerate(children):
        pd = float(p[d])
        if u[k] * total < pd:
            return int(d)
        total -= pd
        rejected.append(int(d))
    if rejected:
        p = p.clone()
        p[rejected] = 0.0
    cdf = torch.cumsum(p, 0)
    if not float(cdf[-1]) > 0:  # every token with mass was a rejected child: only reachable through rounding
        return int(torch.as_tensor(probs).argmax())
    idx = int(torch.searchsorted(cdf, torch.tensor([u[len(children)] * float(cdf[-1])], dtype=cdf.dtype,
                                                     device=cdf.device), right=True))
    return min(idx, p.numel() - 1)


def walk_outcomes(next_token: int, candidates: Sequence[Sequence[int]],
                  cand_out: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """Accepted tokens of a sampling step from per-node outcomes (``node_outcome`` at every kept position).

    ``next_token``: the outcome at ``c``; ``cand_out[g][i]``: the outcome at candidate g's token i (the node
    ``cand_g[:i+1]``). A node's outcome is an accepted child exactly when it is one of its children, so the
    walk follows it while some candidate continues with it, reading each node from the FIRST candidate that
    reaches it (all candidates with that prefix share the node), and stops after a residual or bonus sample.

    Returns (accepted tokens, 1 .. N of them; index of the candidate followed last or -1).

        >>> walk_outcomes(7, [[7, 8], [7, 3]], [[5, 0], [3, 9]])   # 7 accepted, then 5 is a residual sample
        ([7, 5], 0)
        >>> walk_outcomes(7, [[7, 8], [7, 3]], [[3, 0], [3, 9]])   # 7, then 3 (child of [7]), then bonus 9
        ([7, 3, 9], 1)
    """
    accepted, token, alive, last = [int(next_token)], int(next_token), list(range(len(candidates))), -1
    depth = 0
    while alive and depth < len(candidates[alive[0]]):
        alive = [g for g in alive if int(candidates[g][depth]) == token]
        if not alive:
            break
        last = alive[0]
        token = int(cand_out[last][depth])
        accepted.append(token)
        depth += 1
    return accepted, last


def sample_verify(root_probs, candidates: Sequence[Sequence[int]], cand_probs,
                  uniforms_at: Callable[[int], Sequence[float]]) -> tuple[list[int], int]:
    """Sampling verification of one step (paper appendix B), end to end, no model needed.

    Args:
        root_probs: float (V,), the processed distribution at ``c``.
        candidates: G' candidates of N-1 token ids.
        cand_probs: float (G', N-1, V), the processed distribution after each candidate token (against that
            candidate's own prefix).
        uniforms_at: depth -> at least G'+1 uniforms in [0, 1) for the node at that depth (depth 0 = ``c``);
            the decoder keys them by (seed, absolute position).

    The accepted tokens are distributed exactly as sampling them one by one from the model would be:
    ``node_outcome`` at every node, then ``walk_outcomes``. Returns (accepted tokens, candidate index or -1).
    """
    n = len(candidates) + 1
    x1 = node_outcome(root_probs, node_children(candidates, []), list(uniforms_at(0))[:n])
    cand_out = [[node_outcome(cand_probs[g][i], node_children(candidates, cand[: i + 1]),
                              list(uniforms_at(i + 1))[:n]) for i in range(len(cand))]
                for g, cand in enumerate(candidates)]
    return walk_outcomes(x1, candidates, cand_out)
