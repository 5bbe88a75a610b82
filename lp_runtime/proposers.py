"""Candidate sources (paper section 3.2's verification branch): the ``Proposer`` protocol and its implementations,
each proposing a ``tree.CandidateTree``; ``proposers_for(decoding)`` builds the product's. Pure Python, no torch.

* ``SuffixProposer`` (the product's): a suffix match (SuffixDecoding, arXiv 2411.04975; prompt-lookup decoding)
  over the accepted sequence, the Jacobi window's n-grams and an ``AnswerStore`` of earlier answers (looked up by
  suffixes of at least ``store_min_key`` tokens: 1 here, 3 beside a large successor-table tree);
* ``PoolProposer`` (``decoding=paper``): the paper's n-gram pool.

The suffix lookup: every document (the accepted sequence, each harvested n-gram) is indexed by its k-token keys,
k = 1 .. ``max_key``. ``propose`` collects the occurrences of the accepted sequence's longest suffix, longest key
first, newest first; an occurrence found under a key of l tokens inserts its continuation (at most
``depth_for(l)`` tokens) in a trie with weight ``MATCH_WEIGHT ** (l - 1)``. A node's ``prob`` is
``w(node) / (w(continuing past its parent) + 1)`` (the +1 keeps one observation from claiming certainty). The
tree grows best first under G leaves and ``max_nodes`` nodes. *Chaining*: a node whose continuation ended above
``max_depth`` gets its children by matching again with its draft appended, so overlapping n-grams of
neighbouring window columns join into drafts longer than N-1.

Worked example (N = 3 so 1-token matches propose 2 tokens, max_key 2, G = 2, 4 nodes; ids are letters)::

    accepted: a b c a b d a b        the suffix "a b" occurs twice before the end; "b" alone adds nothing new
    occurrences: "a b|d a" (newest, l = 2), "a b|c a" (l = 2); weights 4 each (MATCH_WEIGHT = 4)
    trie: root -> c (w 4) -> a (4);  root -> d (4) -> a (4)
    prob: c = d = 4 / (8 + 1) = 0.444;  c->a = d->a = 4 / (4 + 1) = 0.8
    tree (ties broken by recency, newest first): tokens [d, c, a, a], parents [-1, -1, 0, 1]
"""
from __future__ import annotations

import heapq
import itertools
from typing import Optional, Protocol, Sequence

from .config import check_arguments
from .ngram_pool import NGramPool
from .tree import CandidateTree

MATCH_WEIGHT = 4.0  # one occurrence matching l+1 tokens counts as this many matching l
STORE_WEIGHT = 0.25  # an earlier answer's occurrence counts this much of one in the current text (docs/benchmarks.md 6)


class _Node:
    __slots__ = ("token", "weight", "cont", "recency", "kids", "from_history")

    def __init__(self, token: int) -> None:
        self.token, self.weight, self.cont, self.recency, self.kids = token, 0.0, 0.0, -1, {}
        self.from_history = False  # some occurrence in the accepted sequence (doc 0) runs through this node


def _index_kgrams(index: dict, seq: Sequence[int], end: int, max_key: int, doc: int) -> None:
    """Record (``doc``, ``end``) under each k-gram of ``seq`` ending at ``end``, k = 1 .. ``max_key``."""
    for k in range(1, min(max_key, end + 1) + 1):
        index.setdefault(tuple(seq[end - k + 1 : end + 1]), []).append((doc, end))


class AnswerStore:
    """Earlier answers of the same run, matched by later prompts (SuffixDecoding's global tree, arXiv 2411.04975
    section 4). A document is an answer after the last ``max_key`` tokens of its prompt (so an answer's opening
    is found by the prompt's ending). Accepted tokens only: every LP rank holds the same store."""

    def __init__(self, max_key: int = 4, max_tokens: int = 1 << 18) -> None:
        self.max_key = max_key
        # Past max_tokens stored tokens the older half is forgotten: memory stays bounded in long jobs (the
        # index holds max_key entries a token, ~0.3 KB in CPython, so the default cap is ~80 MB).
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self.docs: list[tuple[int, ...]] = []
        self.index: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # key -> [(doc, end index)], oldest first

    def add(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Store one finished answer (``output``, new tokens only) after the tail of its ``prompt``."""
        self._add_doc(tuple(int(t) for t in list(prompt)[-self.max_key:]) + tuple(int(t) for t in output))
        if self.num_tokens > self.max_tokens:  # keep the newest documents, at most half the cap (and the newest one)
            keep, total = [], 0
            for doc in reversed(self.docs):
                if keep and total + len(doc) > self.max_tokens // 2:
                    break
                keep.append(doc)
                total += len(doc)
            self.docs, self.index, self.num_tokens = [], {}, 0
            for doc in reversed(keep):
                self._add_doc(doc)

    def _add_doc(self, doc: tuple[int, ...]) -> None:
        self.docs.append(doc)
        self.num_tokens += len(doc)
        for end in range(len(doc)):
            _index_kgrams(self.index, doc, end, self.max_key, len(self.docs) - 1)

    def state(self) -> tuple:
        """A hashable summary (``Proposer.state``)."""
        return len(self.docs), self.num_tokens


class Proposer(Protocol):
    """A candidate source for one ``Decoder`` (docs/architecture.md), one sequence at a time: ``begin``, then per
    step ``propose`` and ``observe``, then ``end``. What it keeps across sequences must depend only on accepted
    tokens and the rows every LP rank holds, so that every rank proposes the same tree.

    Attributes:
        topk: top-k token ids wanted from every kept logits row in ``observe`` (0 = none: no extra work).
        max_depth: the deepest node it ever proposes (bounds the size of a step).

    Optional (read with ``getattr``, absent = 0 / never called): ``prefill_topk``, the top-k ids wanted from the
    prompt's rows at prefill, and ``observe_prefill(rows)``, which gets them as ``step.StepRows``.
    """

    topk: int
    max_depth: int

    def begin(self, prompt: Sequence[int], *, do_sample: bool) -> None:
        """Start a sequence after ``prompt`` (token ids); ``do_sample``: the call samples."""

    def observe(self, accepted: Sequence[int], ngrams: Sequence[Sequence[int]], rows=None) -> None:
        """One verified step: its ``accepted`` token ids, the window's harvested ``ngrams`` (each N ids) and
        ``rows`` (``step.StepRows`` when ``topk`` > 0, else None)."""

    def propose(self) -> CandidateTree:
        """The candidate tree rooted at the newest accepted token (may be empty)."""

    def end(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """The sequence finished with ``output`` (new token ids)."""

    def reset(self) -> None:
        """Forget everything kept across sequences (later prompts see no earlier answer)."""

    def state(self) -> tuple:
        """A hashable summary of the state (the LP debug consistency check)."""


class SuffixProposer:
    """Suffix-match candidate source (module docstring); a ``Proposer``.

    Args:
        ngram_size: N; a 1-token match proposes up to N-1 tokens.
        num_leaves: G, the most leaves of a proposed tree (0 = propose nothing).
        max_nodes: most nodes in a tree (default max(G x (N-1), max_depth)).
        max_depth: longest continuation proposed (>= N-1); max_key: longest suffix matched (tokens, >= 1).
        ranking: "counts" (path probability, recency breaks ties) or "recency".
        index_history: match over the accepted sequence too (``pool_from_prompt``); False: n-grams only.
        store: an ``AnswerStore`` matched after this sequence's sources (weight ``store_weight``) in greedy calls,
            and in sampled calls too when ``store_when_sampling``; every finished output is added to it.
        store_min_key: the shortest suffix (tokens) looked up in the store; shorter ones match the sequence's
            own sources only (above ``max_key``: the store is never matched).
        ngram_keys: "all" (every k-gram of an n-gram; docs/benchmarks.md 6b) or "head" (its first k tokens, as
            the paper's pool).
        chain: chain (module docstring); tree: False = each root-to-leaf path as its own chain.

    Raises ``ValueError`` (``config.check_arguments``: every bad one named) for N not an int >= 2, G or max_nodes
    not an int >= 0, max_depth, max_key, max_occurrences or store_min_key not an int >= 1, a flag not True or
    False, an unknown ``ranking`` / ``ngram_keys``, or a store_weight not a number >= 0.
    """

    topk = 0

    def __init__(self, ngram_size: int, num_leaves: int, *, max_nodes: Optional[int] = None, max_depth: int = 10,
                 max_key: int = 4, ranking: str = "counts", max_occurrences: int = 64,
                 index_history: bool = True, store: Optional[AnswerStore] = None, store_weight: float = STORE_WEIGHT,
                 store_when_sampling: bool = False, store_min_key: int = 1, ngram_keys: str = "all",
                 chain: bool = True, tree: bool = True) -> None:
        check_arguments("SuffixProposer", ints=(
            ("ngram_size", ngram_size, 2), ("num_leaves", num_leaves, 0), ("max_nodes", max_nodes, (0, None)),
            ("max_depth", max_depth, 1), ("max_key", max_key, 1), ("max_occurrences", max_occurrences, 1),
            ("store_min_key", store_min_key, 1)), reals=(("store_weight", store_weight, 0),),
            choices=(("ranking", ranking, ("counts", "recency")), ("ngram_keys", ngram_keys, ("all", "head"))),
            bools=(("index_history", index_history), ("store_when_sampling", store_when_sampling), ("chain", chain),
                   ("tree", tree)))
        self.ngram_size, self.num_leaves, self.max_key, self.ranking = ngram_size, num_leaves, max_key, ranking
        self.max_depth = max(max_depth, ngram_size - 1)
        self.max_nodes = max(num_leaves * (ngram_size - 1), self.max_depth) if max_nodes is None else max_nodes
        self.max_occurrences, self.index_history, self.ngram_keys = max_occurrences, index_history, ngram_keys
        self.store, self.store_weight, self.store_when_sampling = store, store_weight, store_when_sampling
        self.store_min_key = store_min_key
        self.chain, self.tree = chain, tree
        self.begin((), do_sample=False)

    def begin(self, prompt: Sequence[int], *, do_sample: bool) -> None:
        """Start a sequence: empty per-sequence index, then ``prompt`` as its first accepted tokens."""
        self._store = self.store if (self.store_when_sampling or not do_sample) else None  # matched this sequence
        self.history: list[int] = []
        self._docs: list[tuple[int, ...]] = []  # harvested n-grams (doc id = index + 1; doc 0 = history)
        self._doc_ids: dict[tuple[int, ...], int] = {}
        self._stamp: list[int] = []  # per n-gram doc: clock when last harvested
        self._clock = 0
        self._index: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # key -> [(doc, end index)], oldest first
        self.extend(prompt)

    def observe(self, accepted: Sequence[int], ngrams: Sequence[Sequence[int]], rows=None) -> None:
        """The window's n-grams first, then the accepted tokens (``add_ngram``, ``extend``)."""
        for ngram in ngrams:
            self.add_ngram(ngram)
        self.extend(accepted)

    def end(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Add the finished answer to the store (when there is one)."""
        if self.store is not None:
            self.store.add(prompt, output)

    def reset(self) -> None:
        """Empty the answer store: later prompts match no earlier answer."""
        if self.store is not None:
            self.store = AnswerStore(self.store.max_key, self.store.max_tokens)

    def propose(self) -> CandidateTree:
        tree = self.grow()
        return tree if self.tree else tree.chains()

    def extend(self, tokens: Sequence[int]) -> None:
        """Append accepted tokens (the prompt first, then each step's accepted tokens)."""
        for t in tokens:
            self.history.append(int(t))
            if self.index_history:
                _index_kgrams(self._index, self.history, len(self.history) - 1, self.max_key, 0)
            self._clock += 1

    def add_ngram(self, ngram: Sequence[int]) -> None:
        """Add one harvested n-gram (any length >= 2); a re-harvested one only becomes the newest."""
        key = tuple(int(t) for t in ngram)
        self._clock += 1
        doc = self._doc_ids.get(key)
        if doc is not None:
            self._stamp[doc - 1] = self._clock
            return
        self._docs.append(key)
        self._stamp.append(self._clock)
        doc = len(self._docs)
        self._doc_ids[key] = doc
        if self.ngram_keys == "head":  # the first 1 .. max_key tokens
            for k in range(1, min(self.max_key, len(key) - 1) + 1):
                self._index.setdefault(key[:k], []).append((doc, k - 1))
        else:  # every k-gram that leaves a continuation
            for end in range(len(key) - 1):
                _index_kgrams(self._index, key, end, self.max_key, doc)

    def state(self) -> tuple:
        return (len(self.history), self._clock, tuple(self._docs[-8:]), tuple(self._stamp[-8:]),
                self._store.state() if self._store is not None else None)

    def depth_for(self, match_len: int) -> int:
        """Continuation length proposed after a ``match_len``-token match: (N-1) x match_len, at most max_depth."""
        return min(self.max_depth, (self.ngram_size - 1) * match_len)

    def _occurrences(self, hist: Optional[Sequence[int]] = None) -> list[tuple[int, int, int, int]]:
        """(doc, end, match length, recency) of occurrences of ``hist``'s suffix (default the accepted
        sequence) with a continuation, best first. doc 0 = the accepted sequence, > 0 = an n-gram, < 0 = an
        answer of the store (-1 - its index)."""
        hist = self.history if hist is None else hist
        seen, out = set(), []
        last = len(self.history) - 1
        store = self._store
        for m in range(min(self.max_key, len(hist)), 0, -1):
            key = tuple(hist[-m:])
            for doc, end in reversed(self._index.get(key, ())):
                if (doc, end) in seen or (doc == 0 and end == last):
                    continue
                seen.add((doc, end))
                stamp = end if doc == 0 else self._stamp[doc - 1]
                out.append((doc, end, m, stamp))
                if len(out) >= self.max_occurrences:
                    return out
            if store is not None and m >= self.store_min_key:
                for d, end in reversed(store.index.get(key, ())):
                    if (-1 - d, end) in seen or end + 1 >= len(store.docs[d]):
                        continue
                    seen.add((-1 - d, end))
                    out.append((-1 - d, end, m, d - len(store.docs) - 1))  # older answers rank lower, all below own
                    if len(out) >= self.max_occurrences:
                        return out
        return out

    def _trie(self, hist: Optional[Sequence[int]] = None) -> _Node:
        root = _Node(-1)
        for doc, end, m, stamp in self._occurrences(hist):
            seq = self.history if doc == 0 else self._docs[doc - 1] if doc > 0 else self._store.docs[-1 - doc]
            cont = seq[end + 1 : end + 1 + self.depth_for(m)]
            w = MATCH_WEIGHT ** (m - 1) * (self.store_weight if doc < 0 else 1.0)
            node = root
            for t in cont:
                node.cont += w
                child = node.kids.get(t)
                if child is None:
                    child = node.kids[t] = _Node(t)
                child.weight += w
                child.from_history |= doc == 0
                child.recency = max(child.recency, stamp)
                node = child
        return root

    def grow(self) -> CandidateTree:
        """The candidate tree for the current accepted sequence (empty when nothing matches or G = 0).

        Nodes come best first (by estimated path probability, or recency), so the tree's order is also a
        priority order; ``parents`` always precede children.
        """
        tree = CandidateTree()
        if self.num_leaves == 0 or self.max_nodes == 0 or not self.history:
            return tree
        root = self._trie()
        heap: list = []
        counter = itertools.count()  # pushes so far: ties go to the node pushed first
        tail = self.history[-self.max_key:]
        drafts: list[list[int]] = []  # per tree node: the draft tokens from the root to it

        def push(node: _Node, parent_idx: int, parent: _Node, path_p: float) -> None:
            p = node.weight / (parent.cont + 1.0)
            key = (-node.recency,) if self.ranking == "recency" else (-path_p * p, -node.recency)
            heapq.heappush(heap, (*key, next(counter), node, parent_idx, p, path_p * p))

        for kid in root.kids.values():
            push(kid, -1, root, 1.0)
        has_kids: set[int] = set()
        leaves = 0
        while heap and len(tree) < self.max_nodes:
            *_, node, parent_idx, p, path_p = heapq.heappop(heap)
            adds_leaf = parent_idx < 0 or parent_idx in has_kids
            if adds_leaf and leaves >= self.num_leaves:
                continue
            leaves += adds_leaf
            has_kids.add(parent_idx)
            idx = tree.append(node.token, parent_idx, p)
            tree.from_window.append(not node.from_history)
            drafts.append((drafts[parent_idx] if parent_idx >= 0 else []) + [node.token])
            if len(drafts[idx]) >= self.max_depth:
                continue
            if not node.kids and self.chain:
                # The continuation ended (an n-gram's last token, or depth_for's cap): match again on the text
                # with this draft appended, so overlapping n-grams and occurrences chain into longer drafts.
                sub = self._trie((tail + drafts[idx])[-self.max_key:])
                node.kids, node.cont = sub.kids, sub.cont
            for kid in node.kids.values():
                push(kid, idx, node, path_p)
        return tree


class PoolProposer(Proposer):
    """The paper's candidate source (``decoding=paper``): ``NGramPool`` keyed by the newest token, G candidates
    of N-1 tokens, newest first, proposed as separate chains with prob 1/2 per node (``tree``: shared prefixes
    merged). Keeps nothing across sequences (``end`` and ``reset``: the protocol's no-ops)."""

    topk = 0

    def __init__(self, ngram_size: int, num_leaves: int, *, from_prompt: bool = True, tree: bool = False) -> None:
        self.ngram_size, self.num_leaves, self.from_prompt, self.tree = ngram_size, num_leaves, from_prompt, tree
        self.max_depth = ngram_size - 1
        self.begin((), do_sample=False)

    def begin(self, prompt: Sequence[int], *, do_sample: bool) -> None:
        self.pool = NGramPool(self.ngram_size, self.num_leaves)
        self.history: list[int] = []
        self.observe(prompt, ())

    def observe(self, accepted: Sequence[int], ngrams: Sequence[Sequence[int]], rows=None) -> None:
        for ngram in ngrams:
            self.pool.add(ngram)
        start = len(self.history)
        self.history.extend(int(t) for t in accepted)
        if self.from_prompt:
            self.pool.add_from_sequence(self.history, start=start)

    def state(self) -> tuple:
        return tuple((k, tuple(v)) for k, v in self.pool.items())

    def propose(self) -> CandidateTree:
        if not self.history:
            return CandidateTree()
        tree = CandidateTree.from_chains(self.pool.candidates(self.history[-1]))
        return tree.merged() if self.tree else tree


def proposers_for(decoding, *, cross_question: Optional[bool] = None, **levers) -> list:
    """The product's proposers for a ``DecodingConfig``: none for plain greedy or G = 0; ``PoolProposer`` for
    ``method="paper"``; else a ``SuffixProposer`` (depth ``max_depth``) with an ``AnswerStore`` of earlier answers,
    matched in greedy calls (``cross_question``: None = greedy calls only, True = sampled calls too, False = no
    store). ``levers``: further ``SuffixProposer`` (or ``PoolProposer``) arguments, for measurements (e.g.
    ``chain=False``, ``ranking="recency"``, ``tree=True``)."""
    n, g = decoding.ngram_size, decoding.guess_set_size
    if decoding.method == "greedy" or g == 0:
        return []
    if decoding.method == "paper":
        return [PoolProposer(n, g, from_prompt=decoding.pool_from_prompt, **levers)]
    store = None if cross_question is False else AnswerStore()
    return [SuffixProposer(n, g, max_depth=decoding.max_depth, index_history=decoding.pool_from_prompt, store=store,
                           store_when_sampling=bool(cross_question), **levers)]
