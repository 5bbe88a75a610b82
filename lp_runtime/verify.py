"""Verification branch: choose the accepted tokens of a step (paper section 3.2, Algorithm 2; appendix B for
sampling). Pure functions, no model. A row that was not finite carries ``step.NONFINITE`` (-1), which no token
equals, so verification rejects every candidate under it."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .tree import children, path


def greedy_verify(next_token: int, tokens: Sequence[int], parents: Sequence[int],
                  node_argmax: Sequence[int]) -> tuple[list[int], list[int]]:
    """Greedy verification of the candidate tree ``tokens``, ``parents``: the longest verified path plus the bonus.

    A node is verified when its parent is and its token equals the argmax at its parent (``next_token``, x1, at
    the root ``c``; ``node_argmax`` at the nodes). The deepest verified node wins (the first in tree order on
    ties). Returns (accepted token ids: its path plus the argmax after it, node indices of the path, root child
    first; [] when none matched).

        >>> greedy_verify(7, [7, 8, 3, 9], [-1, 0, 0, 1], [8, 9, 0, 4])   # tree 7 -> 8 -> 9 and 7 -> 3
        ([7, 8, 9, 4], [0, 1, 3])
        >>> greedy_verify(7, [6, 8], [-1, 0], [8, 9])
        ([7], [])
    """
    depth = [0] * len(tokens)  # 0 = not verified
    best, best_depth = -1, 0
    for i, (t, p) in enumerate(zip(tokens, parents)):
        if (p < 0 or depth[p] > 0) and int(t) == int(next_token if p < 0 else node_argmax[p]):
            depth[i] = 1 if p < 0 else depth[p] + 1
            if depth[i] > best_depth:
                best, best_depth = i, depth[i]
    if best < 0:
        return [int(next_token)], []
    nodes = path(parents, best)
    return [int(tokens[n]) for n in nodes] + [int(node_argmax[best])], nodes


# ------------------------------------------------------------------------------------ sampling (appendix B)
def node_outcome(probs, children: Sequence[int], u: Sequence[float]) -> int:
    """One trie node of sampling verification: try the draft tokens ``children`` in order, then the residual.

    ``probs``: the node's processed distribution, float (V,), non-negative, sum > 0; ``u``: ``len(children) + 1``
    uniforms in [0, 1). Draft d is accepted with probability p(d) under the current residual p; on rejection p(d) is
    set to 0 and p renormalised; when every child is rejected the token is drawn from the residual by inverse CDF.
    The returned token is distributed exactly as ``probs``."""
    # numpy, not torch: a node is a handful of scalar reads, where each torch call costs microseconds of dispatch
    p = given = np.asarray(probs.detach().cpu() if torch.is_tensor(probs) else probs, dtype=np.float64)
    total = float(p.sum())
    rejected: list[int] = []
    for k, d in enumerate(children):
        pd = float(p[d])
        if u[k] * total < pd:
            return int(d)
        total -= pd
        rejected.append(int(d))
    if rejected:
        p = p.copy()
        p[rejected] = 0.0
    cdf = np.cumsum(p)
    if not cdf[-1] > 0:  # every token with mass was a rejected child: only reachable through rounding
        return int(np.argmax(given))
    idx = int(np.searchsorted(cdf, u[len(children)] * cdf[-1], side="right"))
    return min(idx, p.size - 1)


def walk_outcomes(next_token: int, tokens: Sequence[int], parents: Sequence[int],
                  node_out: Sequence[int]) -> tuple[list[int], list[int]]:
    """Accepted tokens of a sampling step from per-node outcomes (``node_outcome`` at every kept node):
    (accepted tokens, node indices of the accepted path). The walk moves to the FIRST child carrying the outcome
    while there is one, and stops after a residual or bonus sample.

        >>> walk_outcomes(7, [7, 8, 3], [-1, 0, 0], [5, 0, 9])   # 7 accepted, then 5 is a residual sample
        ([7, 5], [0])
        >>> walk_outcomes(7, [7, 8, 3], [-1, 0, 0], [3, 0, 9])   # 7, then 3 (child of 7), then bonus 9
        ([7, 3, 9], [0, 2])
    """
    kids = children(parents)
    accepted, walked, node, token = [int(next_token)], [], -1, int(next_token)
    while True:
        nxt = next((c for c in kids.get(node, ()) if int(tokens[c]) == token), None)
        if nxt is None:
            return accepted, walked
        node = nxt
        walked.append(node)
        token = int(node_out[node])
        accepted.append(token)
