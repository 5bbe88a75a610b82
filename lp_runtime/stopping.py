"""Stopping: cut a step's accepted run at the first token that ends generation (DESIGN.md section 1).

A step may accept several tokens at once; everything after the first stop condition is dropped, so it is
never emitted, streamed, counted or kept in the cache. Conditions, checked token by token in order: the
token is in the EOS set (finish reason "stop"), the token completes a stop string in the decoded output
("stop"), the token reaches ``max_new_tokens`` ("length"). EOS and stop strings win over the budget when
the same token meets both.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence


class StopChecker:
    """Tracks one generation's output and decides where it ends.

    Args:
        max_new_tokens: budget in tokens (>= 1).
        eos_token_ids: ids that end generation (may be empty: then only the budget and stop strings stop it).
        stop_strings: texts that end generation once the decoded output contains them.
        tokenizer: needed only with stop strings (``decode``). Raises ``ValueError`` if missing then.
    """

    def __init__(self, max_new_tokens: int, eos_token_ids: Iterable[int] = (),
                 stop_strings: Sequence[str] = (), tokenizer=None) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}; it must be >= 1")
        if stop_strings and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the output")
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(int(t) for t in eos_token_ids if t is not None)
        self.stop_strings = tuple(stop_strings)
        self.tokenizer = tokenizer
        # Every non-special token decodes to >= 1 character, so this many trailing tokens cover any stop string.
        self._tail = max((len(s) for s in self.stop_strings), default=0) + 1
        self.output: list[int] = []
        self.finish_reason: Optional[str] = None

    def push(self, accepted: Sequence[int]) -> list[int]:
        """Append a step's accepted tokens up to and including the first that ends generation.

        Returns the tokens actually emitted (a prefix of ``accepted``); ``finish_reason`` is set once done.
        """
        if self.finish_reason is not None:
            return []
        emitted: list[int] = []
        for tok in accepted:
            tok = int(tok)
            self.output.append(tok)
            emitted.append(tok)
            if tok in self.eos or self._completes_stop_string():
                self.finish_reason = "stop"
            elif len(self.output) >= self.max_new_tokens:
                self.finish_reason = "length"
            if self.finish_reason is not None:
                break
        return emitted

    def _completes_stop_string(self) -> bool:
        if not self.stop_strings:
            return False
        # Checked after every token, so the first hit is the token that completed the stop string.
        text = self.tokenizer.decode(self.output[-self._tail :])
        return any(s in text for s in self.stop_strings)
