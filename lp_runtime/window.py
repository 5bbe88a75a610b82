"""The 2D Jacobi window of the lookahead branch (paper section 3.1, Figure 2; docs/architecture.md). Pure Python.

W columns by N-1 levels. Level 0 ("row 0") holds the newest accepted token ``c`` (position p) as column 0 and
W-1 guesses at p+1 .. p+W-1; level l (1 <= l <= N-2) holds W tokens, column j at position p+l+j. Column j, read
top to bottom, is a run of consecutive positions, so a full window yields one n-gram per column once the last
level's outputs are known. Each step (``advance``) in warm-up (fewer than N-2 levels) appends the W new tokens
as a level; after it, harvests one n-gram per column ``[row0[j] (c for j=0), L1[j], ..., L_{N-2}[j], new[j]]``,
moves every level up (level 1 minus its first token becoming row 0) and appends the new tokens as level N-2.

Worked example, W = 3, N = 3 (one level besides row 0), full window::

    row0 = [a1, a2] (c is column 0),  L1 = [b0, b1, b2],  new = [n0, n1, n2]
    advance(c, new) -> n-grams [c, b0, n0], [a1, b1, n1], [a2, b2, n2]
                       row0 = [b1, b2], L1 = [n0, n1, n2]
"""
from __future__ import annotations

import random
from typing import Sequence


def step_tokens(window_size: int, num_levels: int) -> int:
    """Window tokens one step feeds (one process): row 0's columns 1..W-1 plus W per level besides row 0;
    0 without a window.

    >>> step_tokens(3, 2), step_tokens(1, 0), step_tokens(0, 3)
    (8, 0, 0)
    """
    return max(window_size - 1, 0) + num_levels * window_size if window_size > 0 else 0


def levels_of(window_size: int, tokens: int) -> int:
    """The levels besides row 0 of a window of W columns feeding ``tokens`` (the inverse of ``step_tokens``);
    ``ValueError`` when no number of levels gives ``tokens``."""
    if window_size <= 0 or tokens <= 0:
        if tokens:
            raise ValueError(f"{tokens} window tokens with W={window_size} columns")
        return 0
    levels, rest = divmod(tokens - (window_size - 1), window_size)
    if rest or levels < 0:
        raise ValueError(f"{tokens} window tokens is not a window of W={window_size} columns")
    return levels


def reach(window_size: int, ngram_size: int) -> int:
    """How far past ``c`` a full window's deepest token sits (positions): (W-1) + (N-2); 0 without a window."""
    return window_size - 1 + ngram_size - 2 if window_size > 0 else 0


class JacobiWindow:
    """Window state for one sequence: W = ``window_size`` >= 0 columns (0 = no lookahead branch; every method is
    then a no-op), N = ``ngram_size`` >= 2 (``ValueError`` otherwise)."""

    def __init__(self, window_size: int, ngram_size: int) -> None:
        if window_size < 0 or ngram_size < 2:
            raise ValueError(f"window_size={window_size}, ngram_size={ngram_size}: need W >= 0 and N >= 2")
        self.window_size, self.ngram_size = window_size, ngram_size
        self.row0: list[int] = []  # W-1 tokens: columns 1..W-1 of level 0
        self.levels: list[list[int]] = []  # levels 1..L, each W tokens; L grows to N-2 in warm-up

    def reset(self, prompt_ids: Sequence[int], seed: int) -> None:
        """Initialise row 0 with tokens drawn uniformly (with replacement, ``random.Random(seed)``) from the prompt,
        as in the paper. ``ValueError`` for an empty prompt."""
        if not prompt_ids:
            raise ValueError("cannot initialise the lookahead window from an empty prompt")
        rng = random.Random(seed)
        self.row0 = [int(prompt_ids[rng.randrange(len(prompt_ids))]) for _ in range(max(self.window_size - 1, 0))]
        self.levels = []

    @property
    def active(self) -> bool:
        return self.window_size > 0

    @property
    def num_levels(self) -> int:
        """Levels fed besides row 0 (0 .. N-2)."""
        return len(self.levels)

    @property
    def step_tokens(self) -> int:
        """Tokens this window adds to a step now (``step_tokens``)."""
        return step_tokens(self.window_size, self.num_levels)

    @property
    def full(self) -> bool:
        return len(self.levels) == self.ngram_size - 2

    def advance(self, c: int, new_tokens: Sequence[int]) -> list[list[int]]:
        """Feed the W tokens predicted at the last level (column order) of the step whose newest accepted token
        is ``c``; returns the harvested N-token n-grams (none in warm-up). ``ValueError`` unless W tokens."""
        if not self.active:
            return []
        if len(new_tokens) != self.window_size:
            raise ValueError(f"got {len(new_tokens)} new window tokens; the window has W={self.window_size} columns")
        new = [int(t) for t in new_tokens]
        if not self.full:
            self.levels.append(new)
            return []
        top = [int(c)] + self.row0
        ngrams = [[top[j]] + [lvl[j] for lvl in self.levels] + [new[j]] for j in range(self.window_size)]
        if self.levels:
            self.row0 = self.levels[0][1:]
            self.levels = self.levels[1:] + [new]
        else:  # N = 2: row 0 is the last level
            self.row0 = new[1:]
        return ngrams

    def kept_tokens(self, c: int, num_columns: int, num_levels: int) -> list[int]:
        """The input token of each column's kept cell in a step feeding ``num_columns`` columns and
        ``num_levels`` levels (``layout.py``: the newest level, or row 0 with ``c`` as column 0 when none)."""
        if num_levels:
            return list(self.levels[num_levels - 1][:num_columns])
        return ([int(c)] + self.row0)[:num_columns]

    def state(self) -> tuple:
        """A hashable snapshot (for the LP consistency check)."""
        return tuple(self.row0), tuple(tuple(lvl) for lvl in self.levels)
