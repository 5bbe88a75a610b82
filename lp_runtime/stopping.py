"""Stopping: cut a step's accepted run at the first token that ends generation (docs/design.md section 1),
so nothing after it is emitted, streamed, counted or cached. Checked token by token: EOS ("stop"), a completed stop
string ("stop"), the budget ("length"); EOS and stop strings win over the budget on the same token.

Stop strings are matched by transformers' ``StopStringCriteria`` as ``generate`` matches them: on the prompt's end
and the generated text, a hit ending in a new token (so a string that starts in the prompt and ends in the first
new token stops there), after every accepted token, so a string spanning any number of tokens or steps is found at
the token completing it; tokenizers it cannot probe (word-level) fall back to searching the decoded text."""
from __future__ import annotations

import functools
from typing import Iterable, Optional, Sequence

import torch

from .config import ConfigError, check_stop_strings


@functools.lru_cache(maxsize=16)
def _criteria(tokenizer, stop_strings: tuple[str, ...]):
    """``StopStringCriteria`` for this tokenizer and strings (~1 s to build), or None where transformers
    cannot probe the vocabulary (word-level: ``ValueError: substring not found``)."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    try:
        return StopStringCriteria(tokenizer, list(stop_strings))
    except ValueError:
        return None


class StopChecker:
    """Tracks one generation's output and decides where it ends.

    Args:
        max_new_tokens: budget in tokens (>= 1).
        eos_token_ids: ids that end generation (may be empty).
        stop_strings: non-empty texts that end generation once the generated text contains them (a single string
            is one; ``ConfigError`` for anything else, e.g. a number or an empty string).
        tokenizer: needed with stop strings (``ConfigError``, a ``ValueError``, if missing then).
        prompt: the prompt's token ids (its end may begin a stop string)."""

    def __init__(self, max_new_tokens: int, eos_token_ids: Iterable[int] = (),
                 stop_strings: Sequence[str] = (), tokenizer=None, prompt: Sequence[int] = ()) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}; it must be >= 1")
        stop_strings = check_stop_strings(stop_strings, key="stop_strings")  # ConfigError: a number, an empty one
        if stop_strings and tokenizer is None:
            raise ConfigError(f"stop_strings={list(stop_strings)} need a tokenizer to decode the output; give "
                              "Decoder(..., tokenizer=...) or no stop strings")
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(int(t) for t in eos_token_ids if t is not None)
        self.stop_strings = tuple(stop_strings)
        self.tokenizer = tokenizer
        probe = self.stop_strings and hasattr(tokenizer, "get_vocab")
        self._criteria = _criteria(tokenizer, self.stop_strings) if probe else None
        # one token per character at most: the tail of the text it reads (the prompt's end before any output)
        self._tail = self._criteria.maximum_token_len if self._criteria is not None else \
            max(map(len, self.stop_strings), default=0)
        self._prefix = [int(t) for t in prompt[max(0, len(prompt) - self._tail):]] if self._tail else []
        # fallback matcher: length of the text decoded before the newest token
        self._decoded_len = len(tokenizer.decode(self._prefix)) if self._prefix and self._criteria is None else 0
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
        """True when the newest token completes a stop string (checked after every token, so the first hit is
        the completing token)."""
        if not self.stop_strings:
            return False
        if self._criteria is not None:
            tail = (self._prefix + self.output[-self._tail:])[-self._tail:]
            return bool(self._criteria(torch.tensor([tail]), None)[0])
        text = self.tokenizer.decode(self._prefix + self.output)
        before, self._decoded_len = self._decoded_len, len(text)
        # A hit must end in the newest token's text: start the search where such a hit could begin.
        return any(s in text[max(0, before - len(s) + 1) :] for s in self.stop_strings)
