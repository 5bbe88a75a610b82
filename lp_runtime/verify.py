"""Verification branch: choose the accepted tokens of a step (paper section 3.2 and Algorithm 2, appendix A).

Greedy verification is a pure function over token ids; no model needed.
"""
from __future__ import annotations

from typing import Sequence


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
