"""Shared helpers for exactness tests: plain greedy references and the near-tie rule (docs/design.md section 6)."""
import torch

NEAR_TIE = 1e-4
SMOLLM2_NEW = 48  # new tokens of the SmolLM2 greedy references (conftest.py's smollm2_greedy)


def hf_greedy(model, prompt, max_new_tokens, eos_token_id=None, **kwargs):
    """transformers' own greedy ``generate`` on one prompt; returns the new token ids."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=(eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id) if eos_token_id else 0,
        **kwargs,
    )
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def top2_gap(model, prefix):
    """Gap between the two largest next-token logits after ``prefix`` (float, logit units)."""
    logits = model(torch.tensor([prefix], device=model.device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def assert_greedy_equal(model, prompt, ours, ref, what=""):
    """Token-identical, or the first difference is a numerical near-tie of the plain model.

    Only the common length is compared when one side stopped early because of that difference.
    """
    n = min(len(ours), len(ref))
    for i in range(n):
        if ours[i] != ref[i]:
            gap = top2_gap(model, list(prompt) + ref[:i])
            assert gap < NEAR_TIE, (
                f"{what}: first difference at new token {i}: ours {ours[i]} vs plain {ref[i]}, "
                f"top-2 logit gap {gap:.3g} is not a near-tie"
            )
            return "near-tie"
    assert len(ours) == len(ref), f"{what}: lengths differ ({len(ours)} vs {len(ref)}) with no differing token"
    return "equal"
