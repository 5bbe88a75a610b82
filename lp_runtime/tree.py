"""The candidate tree of a lookahead step (paper section 3.2's verification branch, candidates sharing prefixes as
in SpecInfer / Medusa tree attention) and every tree operation, defined once.

A tree is a parent array in topological order: ``parents[i] < i``, -1 = the root ``c`` (the newest accepted token,
which is not a node). Depth 1 = a child of ``c``. Pure Python (numpy for the ancestor matrix only).

    >>> t = CandidateTree(tokens=[7, 8, 3, 9], parents=[-1, 0, 0, 1], prob=[0.9, 0.5, 0.2, 0.5])
    >>> t.depths(), t.path(3), children(t.parents), subtrees(t.parents)
    ([1, 2, 2, 3], [0, 1, 3], {-1: [0], 0: [1, 2], 1: [3]}, [[0, 1, 2, 3]])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


def check_parents(parents: Sequence[int]) -> None:
    """``ValueError`` unless every ``parents[i]`` is -1 or an earlier node."""
    for i, p in enumerate(parents):
        if p >= i or p < -1:
            raise ValueError(f"parents={list(parents)}: node {i} has parent {p}; parents must precede children")


def depths(parents: Sequence[int]) -> list[int]:
    """1-based depth of each node (a child of the root has depth 1).

    >>> depths([-1, 0, 1, -1, 3])
    [1, 2, 3, 1, 2]
    """
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def path(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root's child down to ``node`` (inclusive); [] for -1."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def children(parents: Sequence[int]) -> dict[int, list[int]]:
    """{node: its children in tree order} for every node with children (-1 = the root).

    >>> children([-1, 0, 0, -1])
    {-1: [0, 3], 0: [1, 2]}
    """
    out: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        out.setdefault(int(p), []).append(i)
    return out


def preorder(parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """The tree's nodes in depth-first preorder (children in index order) and each node's depth (its number of
    ancestors: a child of ``c`` has depth 0). A contiguous run ``order[a:b]`` plus the ancestors of its first node
    ``order[a]`` is ancestor-closed (an ancestor of a later node of the run that precedes the run also precedes
    ``order[a]`` and holds it in its subtree), so a rank that feeds the run feeds ``b - a + depth[order[a]]`` nodes.
    ``ValueError`` when a parent does not precede its child.

        >>> preorder([-1, 0, -1, 1, 0])
        ([0, 1, 3, 4, 2], [0, 1, 0, 2, 1])
    """
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"preorder: node {i} has parent {p}; a parent must be -1 (c) or an earlier node")
    kids = children(parents)
    order, depth, stack = [], [0] * len(parents), list(reversed(kids.get(-1, [])))
    while stack:
        n = stack.pop()
        order.append(n)
        for ch in reversed(kids.get(n, ())):
            depth[ch] = depth[n] + 1
            stack.append(ch)
    return order, depth


def child_tokens(tokens: Sequence[int], parents: Sequence[int], node: int) -> list[int]:
    """The distinct tokens of ``node``'s children in tree order (-1 = the root): the drafts sampling
    verification tries there; [] for a leaf.

        >>> child_tokens([7, 8, 3, 6, 8], [-1, 0, 0, -1, 0], -1), child_tokens([7, 8, 3, 6, 8], [-1, 0, 0, -1, 0], 0)
        ([7, 6], [8, 3])
    """
    return list(dict.fromkeys(int(t) for t, p in zip(tokens, parents) if p == node))


def subtrees(parents: Sequence[int]) -> list[list[int]]:
    """The nodes grouped by the root child they descend from (one group per child of ``c``, in tree order).

        >>> subtrees([-1, 0, -1, 1, 2])
        [[0, 1, 3], [2, 4]]
    """
    top: list[int] = []
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        r = i if p < 0 else top[p]
        top.append(r)
        groups.setdefault(r, []).append(i)
    return list(groups.values())


def reindex(parents: Sequence[int], nodes: Sequence[int]) -> tuple[int, ...]:
    """The parent array of the ancestor-closed ``nodes`` (ascending), re-indexed among themselves.
    ``ValueError`` when a node's parent is not among ``nodes``.

        >>> reindex([-1, 0, -1, 2, 3], [2, 3, 4])
        (-1, 0, 1)
    """
    where = {n: i for i, n in enumerate(nodes)}
    out = []
    for n in nodes:
        p = parents[n]
        if p >= 0 and p not in where:
            raise ValueError(f"node {n} selected without its parent {p}: a selection must be ancestor-closed")
        out.append(-1 if p < 0 else where[p])
    return tuple(out)


def ancestors(parents: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(depth int64 (n,), 1 for a root child; ancestors bool (n, n), True where j is i or one of its ancestors).
    ``ValueError`` for a malformed parent array.

        >>> d, a = ancestors([-1, 0, 0, -1]); d.tolist(), a.astype(int).tolist()
        ([1, 2, 2, 1], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]])
    """
    check_parents(parents)
    n = len(parents)
    anc = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return np.asarray(depths(parents), dtype=np.int64).reshape(n), anc


def path_probabilities(parents: Sequence[int], probs: Sequence[float]) -> list[float]:
    """P(path root -> node accepted) = product of the per-node probabilities along the path.

    >>> path_probabilities([-1, 0, -1], [0.5, 0.5, 0.25])
    [0.5, 0.25, 0.25]
    """
    out: list[float] = []
    for par, p in zip(parents, probs):
        out.append(p if par < 0 else out[par] * p)
    return out


@dataclass
class CandidateTree:
    """Draft tokens as a tree rooted at ``c``, the newest accepted token.

    Attributes:
        tokens: node token ids, parents before children (topological order).
        parents: parent node index per node; -1 = the root ``c``.
        prob: a proposer's estimate of P(node accepted | its parent accepted), in [0, 1].
        from_window: per node, True when only the window's harvested n-grams proposed it; empty when the
            proposer does not tag (then ``policy.CostPolicy`` keeps its window prior).
        calibrated: True when ``prob`` is already learned online from this proposer's own outcomes, per source
            (``successors.grow_tree``): ``policy.CostPolicy`` prices it as it is instead of calibrating it again.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    prob: list[float] = field(default_factory=list)
    from_window: list[bool] = field(default_factory=list)
    calibrated: bool = False

    def __len__(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        return depths(self.parents)

    def path(self, node: int) -> list[int]:
        return path(self.parents, node)

    def select(self, nodes: Sequence[int]) -> "CandidateTree":
        """The sub-tree of the ancestor-closed ``nodes`` (ascending), re-indexed. ``ValueError`` otherwise."""
        return CandidateTree([self.tokens[n] for n in nodes], list(reindex(self.parents, nodes)),
                             [self.prob[n] for n in nodes], calibrated=self.calibrated)

    def append(self, token: int, parent: int, prob: float) -> int:
        """Add one node under ``parent`` (an existing node or -1); returns its index."""
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.prob.append(prob)
        return len(self.tokens) - 1

    def chains(self) -> "CandidateTree":
        """Each root-to-leaf path as its own chain (shared prefixes repeated), leaves in tree order."""
        inner = set(self.parents)
        out = CandidateTree()
        for leaf in (i for i in range(len(self)) if i not in inner):
            prev = -1
            for n in self.path(leaf):
                prev = out.append(self.tokens[n], prev, self.prob[n])
        return out

    def merged(self) -> "CandidateTree":
        """Siblings with the same token merged (shared prefixes fed once); the first one's ``prob`` kept; a merged
        node is window-only (``from_window``) when every node merged into it was."""
        out, where, remap = CandidateTree(), {}, []
        tagged = len(self.from_window) == len(self)
        for i, (t, p, pr) in enumerate(zip(self.tokens, self.parents, self.prob)):
            key = (-1 if p < 0 else remap[p], t)
            if key not in where:
                where[key] = out.append(t, key[0], pr)
                out.from_window += [self.from_window[i]] if tagged else []
            elif tagged:
                out.from_window[where[key]] = out.from_window[where[key]] and self.from_window[i]
            remap.append(where[key])
        return out

    @staticmethod
    def from_chains(chains: Sequence[Sequence[int]], prob: float = 0.5) -> "CandidateTree":
        """Separate chains from the root (no sharing), every node with ``prob``."""
        out = CandidateTree()
        for chain in chains:
            prev = -1
            for t in chain:
                prev = out.append(t, prev, prob)
        return out

    @staticmethod
    def union(trees: Sequence["CandidateTree"]) -> "CandidateTree":
        """The trees side by side under one root, then equal siblings merged (the first tree's node wins);
        ``from_window`` is kept only when every tree tags its nodes, ``calibrated`` only when every tree is."""
        out = CandidateTree()
        tagged = all(len(t.from_window) == len(t) for t in trees)
        for t in trees:
            base = len(out)
            out.tokens += t.tokens
            out.parents += [p if p < 0 else p + base for p in t.parents]
            out.prob += t.prob
            out.from_window += t.from_window if tagged else []
        out = out if len(trees) == 1 else out.merged()
        out.calibrated = bool(trees) and all(t.calibrated for t in trees)
        return out
