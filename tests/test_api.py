"""Python API: load once, decode many, stream with transformers' TextStreamer."""
from transformers import TextStreamer

from lp_runtime import LookaheadGenerator
from lp_runtime.config import DecodingConfig, GenerationConfig

from exactness import hf_greedy


def test_api_text_messages_ids_and_streamer(smollm2, capsys):
    model, tok = smollm2
    gen = LookaheadGenerator(model, tok, DecodingConfig(window_size=2, ngram_size=3, guess_set_size=2),
                             GenerationConfig(max_new_tokens=24))
    ids = gen.encode("Name three colours.")
    assert ids == gen.encode([{"role": "user", "content": "Name three colours."}])
    out = gen.generate("Name three colours.", streamer=TextStreamer(tok, skip_prompt=True))
    assert out.output_ids == hf_greedy(model, ids, 24, eos_token_id=2)
    printed = capsys.readouterr().out
    assert printed.strip() == out.text.strip() and out.text
    raw = gen.generate(ids, max_new_tokens=5)
    assert raw.output_ids == out.output_ids[:5] and raw.finish_reason == "length"
