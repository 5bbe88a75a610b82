"""The paper's n-gram pool (section 3.2; ``decoding=paper``'s candidates through ``proposers.PoolProposer``).

An n-gram of N tokens is stored under its first token as the N-1 tokens that follow; each key keeps at most
``capacity`` (= G) n-grams in LRU order (re-adding moves one to the newest end; a full key evicts the oldest)::

    >>> pool = NGramPool(ngram_size=3, capacity=2)
    >>> pool.add([5, 6, 7]); pool.add([5, 8, 9]); pool.add([5, 6, 7]); pool.add([5, 1, 2])
    >>> pool.candidates(5)          # newest first; (8, 9) was the least recently seen and is gone
    [(1, 2), (6, 7)]
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence


class NGramPool:
    """N-gram pool keyed by first token: ``ngram_size`` N >= 2 tokens per n-gram, at most ``capacity`` G >= 0 per
    key (0 keeps nothing)."""

    def __init__(self, ngram_size: int, capacity: int) -> None:
        if ngram_size < 2:
            raise ValueError(f"ngram_size={ngram_size}; an n-gram needs N >= 2 tokens")
        if capacity < 0:
            raise ValueError(f"capacity={capacity}; the per-key cap must be >= 0")
        self.ngram_size, self.capacity = ngram_size, capacity
        self._pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def add(self, ngram: Sequence[int]) -> None:
        """Insert one n-gram of exactly N token ids (or refresh it to the newest end)."""
        if len(ngram) != self.ngram_size:
            raise ValueError(f"n-gram {list(ngram)} has {len(ngram)} tokens; this pool holds N={self.ngram_size}")
        if self.capacity == 0:
            return
        key, value = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        entries = self._pool.setdefault(key, OrderedDict())
        entries[value] = None
        entries.move_to_end(value)  # a re-added n-gram becomes the newest
        if len(entries) > self.capacity:
            entries.popitem(last=False)

    def add_from_sequence(self, tokens: Sequence[int], start: int = 0) -> None:
        """Add every N-gram of ``tokens`` whose last token is at index >= ``start``, oldest first (``start =
        len(tokens) - k``: the n-grams completed by the last k tokens; none from a sequence shorter than N)."""
        n = self.ngram_size
        for i in range(max(start - n + 1, 0), len(tokens) - n + 1):
            self.add(tokens[i : i + n])

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """The continuations of ``key`` (at most G, each N-1 token ids), newest first."""
        return list(reversed(self._pool.get(int(key), ())))

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())

    def items(self) -> Iterable[tuple[int, list[tuple[int, ...]]]]:
        """(key, continuations oldest-first) for every key, in insertion order of keys; for hashing/debug."""
        return ((k, list(v)) for k, v in self._pool.items())
