"""Stop strings with a tokenizer whose vocabulary transformers' StopStringCriteria cannot probe (word-level): the
decoded text is matched instead of failing with a bare 'ValueError: substring not found'."""
from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from fakes import lookahead
from lp_runtime.decoder import Decoder
from lp_runtime.stopping import StopChecker

WORDS = ["[UNK]", "hello", "world", "the", "end", "stop", "here", ".", "again", "now"]


def word_level(pre_tokenizer) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.mark.parametrize("pre", [pre_tokenizers.Whitespace(), pre_tokenizers.WhitespaceSplit()],
                         ids=["whitespace", "whitespace_split"])
def test_word_level_stop_strings_match_the_decoded_text(pre):
    tok = word_level(pre)
    ids = {w: i for i, w in enumerate(WORDS)}
    stop = StopChecker(10, [], ["the end"], tok)  # transformers' probe raises 'substring not found' here
    assert stop.push([ids["hello"], ids["the"]]) == [ids["hello"], ids["the"]] and stop.finish_reason is None
    assert stop.push([ids["end"], ids["world"]]) == [ids["end"]] and stop.finish_reason == "stop"
    # a second input of the kind: a one-word stop string inside a run, and one never completed
    stop = StopChecker(4, [], ["now", "stop here"], tok)
    assert stop.push([ids["again"], ids["now"], ids["hello"]]) == [ids["again"], ids["now"]]
    assert stop.finish_reason == "stop"
    stop = StopChecker(3, [], ["stop here"], tok)
    assert stop.push([ids["stop"], ids["world"], ids["here"], ids["."]]) == [ids["stop"], ids["world"], ids["here"]]
    assert stop.finish_reason == "length"


def test_a_decoder_with_a_word_level_tokenizer_stops_at_the_string():
    tok = word_level(pre_tokenizers.Whitespace())
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         bos_token_id=None, eos_token_id=None, pad_token_id=None)).eval()
    dec = Decoder(model, lookahead(), tokenizer=tok)
    free = dec.generate([1, 2], max_new_tokens=12).output_ids
    word = tok.decode(free[2:3])  # stop at the word the model emits third
    out = dec.generate([1, 2], max_new_tokens=12, stop_strings=[word])
    assert out.finish_reason == "stop" and out.output_ids == free[: free.index(free[2]) + 1]


def test_stop_strings_without_a_tokenizer_are_a_config_error():
    """Decoder(..., no tokenizer).generate(ids, stop_strings=["sea"]) raised a plain ValueError (a new user,
    2026-12-02): a ConfigError, as every bad API argument."""
    from lp_runtime.config import ConfigError
    from lp_runtime.stopping import StopChecker

    with pytest.raises(ConfigError) as e:
        StopChecker(8, stop_strings=["sea"])
    assert str(e.value) == ("stop_strings=['sea'] need a tokenizer to decode the output; give Decoder(..., "
                            "tokenizer=...) or no stop strings")


def test_a_stop_string_begun_in_the_prompt_stops_where_generate_stops(tiny_model_dir):
    """transformers' ``generate`` matches stop strings on the whole sequence, so one that starts in the prompt and
    ends in the first new token stops there; the checker read only the generated text and ran on to the budget (a
    review, 2026-12-04)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    # the last: a stop string longer (in characters) than the prompt is in tokens (a review: the prompt's kept end
    # wrapped round to its last token)
    for text, chars in (("Hello world", 3), ("def f(x):\n    return", 3), ("Hello there, how are you", 6)):
        prompt = tok(text)["input_ids"]
        ids = torch.tensor([prompt])
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8, pad_token_id=0)
        free = model.generate(ids, **kw)[0, len(prompt):].tolist()
        stop = text[-chars:] + tok.decode(free[:1])[:1]  # the prompt's last characters and the first new one
        ref = model.generate(ids, **kw, stop_strings=[stop], tokenizer=tok)[0, len(prompt):].tolist()
        assert ref == free[:1]
        for setting in (lookahead(method="greedy"), lookahead(window_size=2)):
            out = Decoder(model, setting, eos_token_ids=(), tokenizer=tok).generate(prompt, max_new_tokens=8,
                                                                                 stop_strings=[stop])
            assert (out.output_ids, out.finish_reason) == (ref, "stop")


def test_a_word_level_stop_string_begun_in_the_prompt_stops_at_its_first_new_word():
    tok = word_level(pre_tokenizers.Whitespace())
    ids = {w: i for i, w in enumerate(WORDS)}
    stop = StopChecker(10, [], ["the end"], tok, prompt=[ids["hello"], ids["the"]])
    assert stop.push([ids["end"], ids["world"]]) == [ids["end"]] and stop.finish_reason == "stop"
    stop = StopChecker(10, [], ["the end now"], tok, prompt=[ids["hello"]] * 8 + [ids["the"], ids["end"]])
    assert stop.push([ids["now"]]) == [ids["now"]] and stop.finish_reason == "stop"  # 10 tokens, 11 characters
    stop = StopChecker(10, [], ["the end"], tok, prompt=[ids["the"], ids["hello"]])  # not at the prompt's end
    assert stop.push([ids["end"], ids["world"]]) == [ids["end"], ids["world"]] and stop.finish_reason is None
