"""../shared/cases/CASES.md, greedy decoding: stopping (S1-S6), streaming (T1), shapes (C1-C4 and precision F1
are in test_exactness_tiny.py; C5 in test_parallel.py).

Where a case needs a specific next token, the model is a tiny Llama (for the real cache and mask path)
whose logits are replaced by a fixed successor table: the next token after t is ``succ[t]``.
"""

from lp_runtime.config import DecodingConfig
from lp_runtime.decoder import Decoder

from fakes import ForcedLM, lookahead as fixed

VOCAB = 128


def SuccessorLM(succ: dict[int, int]):
    """The forced-successor LM (``fakes.ForcedLM``) over ``VOCAB`` ids: the next token after t is ``succ[t]``."""
    return ForcedLM(VOCAB, succ)


class Collector:
    """TextStreamer-compatible: records the prompt put first, then every token."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def lookahead(model, W=0, N=4, G=2, eos=(2,), tokenizer=None):
    return Decoder(model, fixed(window_size=W, ngram_size=N, guess_set_size=G), eos_token_ids=list(eos),
                   tokenizer=tokenizer)


def test_s1_eos_inside_accepted_run():
    # Prompt pool holds 5 -> (6, 2, 8); the model continues 5 6 2 8 9: one step accepts [6, 2, 8, 9].
    model = SuccessorLM({5: 6, 6: 2, 2: 8, 8: 9})
    streamer = Collector()
    out = lookahead(model, eos=[2]).generate([40, 5, 6, 2, 8, 41, 5], max_new_tokens=20, streamer=streamer)
    assert out.output_ids == [6, 2] and out.finish_reason == "stop"
    assert out.decoding_steps == 1 and out.accept_lengths == [2]
    assert streamer.puts[1:] == [[6], [2]] and streamer.ended


def test_s2_several_eos_ids():
    model = SuccessorLM({5: 6, 6: 7, 7: 8, 8: 9})
    out = lookahead(model, eos=[2, 7]).generate([40, 5, 6, 7, 8, 41, 5], max_new_tokens=20)
    assert out.output_ids == [6, 7] and out.finish_reason == "stop"


def test_s3_no_eos_runs_to_budget():
    model = SuccessorLM({})
    out = Decoder(model, fixed(window_size=2, ngram_size=3, guess_set_size=2),
                  eos_token_ids=None).generate([3, 4, 5], max_new_tokens=17)
    assert out.output_ids == list(range(6, 23)) and out.finish_reason == "length"


def test_s4_budget_smaller_than_run():
    model = SuccessorLM({})  # t -> t + 1; the prompt pool (N=5) holds 10 -> (11, 12, 13, 14)
    prompt = [10, 11, 12, 13, 14, 15, 10]
    for budget in (1, 3):
        out = lookahead(model, N=5, eos=[]).generate(prompt, max_new_tokens=budget)
        assert out.output_ids == [11, 12, 13][:budget] and out.finish_reason == "length"
        assert out.decoding_steps == 1
    full = lookahead(model, N=5, eos=[]).generate(prompt, max_new_tokens=10)
    # one step: the candidate 11..14, chained on by matching "11 12 13 14" again (-> 15, then 10, which the
    # model rejects), so 11..15 plus the bonus 16
    assert full.output_ids[:6] == [11, 12, 13, 14, 15, 16] and full.accept_lengths[0] == 6


def test_s5_eos_and_budget_same_step():
    model = SuccessorLM({10: 11, 11: 12, 12: 2, 2: 13, 13: 14})
    out = lookahead(model, N=5, eos=[2]).generate([10, 11, 12, 2, 13, 99, 10], max_new_tokens=5)
    assert out.output_ids == [11, 12, 2] and out.finish_reason == "stop"


class CharTokenizer:
    def decode(self, ids, **kwargs):
        return "".join(chr(i) for i in ids)


def test_s6_stop_string_across_step_boundary():
    nl, a, b = ord("\n"), ord("a"), ord("b")
    model = SuccessorLM({a: nl, nl: nl, b: b})
    plain = Decoder(model, DecodingConfig(method="greedy"), eos_token_ids=[], tokenizer=CharTokenizer())
    out = plain.generate([b, a], max_new_tokens=10, stop_strings=["\n\n"])  # "\n" ends one step, "\n" starts the next
    assert out.output_ids == [nl, nl] and out.finish_reason == "stop" and out.decoding_steps == 2
    # Inside a multi-token run: the prompt pool proposes "\n\n b" after "a"; tokens after the stop are dropped.
    out = lookahead(model, N=4, eos=[], tokenizer=CharTokenizer()).generate(
        [a, nl, nl, nl, b, a], max_new_tokens=10, stop_strings=["\n\n"])
    assert out.output_ids == [nl, nl] and out.finish_reason == "stop" and out.decoding_steps == 1


def test_t1_streamer_sees_every_token_once_in_order():
    cycle = [20, 21, 22, 23, 24, 25]
    model = SuccessorLM({t: cycle[(i + 1) % len(cycle)] for i, t in enumerate(cycle)})
    streamer = Collector()
    prompt = cycle + cycle[:2]
    out = lookahead(model, W=3, N=4, G=3, eos=[]).generate(prompt, max_new_tokens=60, streamer=streamer)
    assert streamer.puts[0] == prompt
    streamed = [t for chunk in streamer.puts[1:] for t in chunk]
    assert streamed == out.output_ids and len(streamed) == 60
    assert out.output_ids == [cycle[(2 + i) % 6] for i in range(60)]
    # the suffix lookup proposes up to max_depth (10) tokens on this cycle: a full match accepts 11
    assert max(out.accept_lengths) == 11 and out.decoding_steps < 60 and streamer.ended
