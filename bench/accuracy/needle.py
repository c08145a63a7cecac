"""Needle-in-a-haystack retrieval probe: greedy answers with and without quantized KV.

The haystack is real prose (the Python reference docs); one sentence "The secret number is
NNNN." is inserted at a line boundary at a relative depth, and the chat-formatted question at the
end asks for it. A 135M model is a weak retriever, so the needle is a short, distinctive
key->value statement that the baseline answers reliably; the probe then checks whether a KV
format changes the answer. Prefill and every decode step go through the scheme's cache, as in
vLLM.
"""

from __future__ import annotations

import random
import re
from typing import Dict, List, Optional, Sequence

import torch

from .kv_schemes import FakeQuantKVCache, Scheme, identity

NEEDLE_TEMPLATE = "The secret number is {number}."
QUESTION = "What is the secret number? Answer with the number only."
MAX_NEW_TOKENS = 16


def secret_numbers(lengths: Sequence[int], depths: Sequence[float], seed: int) -> Dict[tuple, int]:
    """One 4-digit number per (length, depth), the same for every scheme."""
    rng = random.Random(seed)
    return {(length, depth): rng.randint(1000, 9999) for length in lengths for depth in depths}


def build_prompt(tokenizer, haystack_ids: List[int], length: int, depth: float, number: int) -> torch.Tensor:
    """Chat-formatted prompt of at most ``length - MAX_NEW_TOKENS`` tokens with the needle at ``depth``."""
    needle = NEEDLE_TEMPLATE.format(number=number)
    budget = length - MAX_NEW_TOKENS

    def render(body: str) -> List[int]:
        cut = len(body) if depth >= 1.0 else (body.rfind("\n", 0, int(len(body) * depth)) + 1)
        content = body[:cut] + needle + "\n" + body[cut:] + "\n\n" + QUESTION
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)

    overhead = len(render(""))
    take = budget - overhead
    ids = render(tokenizer.decode(haystack_ids[:take]))
    # Decoding and re-encoding can merge or split a few tokens; shrink until it fits.
    while len(ids) > budget:
        take -= len(ids) - budget
        ids = render(tokenizer.decode(haystack_ids[:take]))
    return torch.tensor([ids], dtype=torch.long)


def first_integer(text: str) -> Optional[int]:
    match = re.search(r"\d+", text)
    return int(match.group()) if match else None


@torch.no_grad()
def answer(model, tokenizer, prompt: torch.Tensor, fake_quantize: Scheme) -> str:
    cache = FakeQuantKVCache(fake_quantize)
    output = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        past_key_values=cache,
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    if cache.update_calls == 0:
        raise RuntimeError("the KV scheme's cache was never used by generate()")
    return tokenizer.decode(output[0, prompt.shape[1] :], skip_special_tokens=True)


def run_probe(
    model,
    tokenizer,
    haystack_ids: List[int],
    schemes: Dict[str, Optional[Scheme]],
    lengths: Sequence[int],
    depths: Sequence[float],
    seed: int = 0,
    log=print,
) -> List[Dict[str, object]]:
    """One record per (scheme, length, depth): prompt size, answer, exact match."""
    numbers = secret_numbers(lengths, depths, seed)
    prompts = {key: build_prompt(tokenizer, haystack_ids, key[0], key[1], number) for key, number in numbers.items()}
    records = []
    for scheme_name, fake_quantize in schemes.items():
        for (length, depth), number in numbers.items():
            text = answer(model, tokenizer, prompts[(length, depth)], fake_quantize or identity)
            record = {
                "scheme": scheme_name,
                "length": length,
                "depth": depth,
                "prompt_tokens": int(prompts[(length, depth)].shape[1]),
                "number": number,
                "answer": text,
                "exact_match": first_integer(text) == number,
            }
            records.append(record)
            log(f"  needle {scheme_name:>12} len={length:5d} depth={depth:.2f} -> {text!r} "
                f"({'ok' if record['exact_match'] else 'MISS'})")
    return records
