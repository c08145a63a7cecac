"""Teacher-forced comparison of a KV scheme against unquantized KV on one token window.

One causal forward pass over a window of ``T`` tokens scores every position ``t`` with exactly
``t + 1`` tokens of context, so a single 8K window measures all context lengths up to 8K; the
per-token results are then grouped into context-length buckets.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .kv_schemes import FP8_E4M3_MAX, FakeQuantKVCache, Scheme, identity, kv_maps

# Context-length buckets (tokens of context, inclusive lower / exclusive upper bound).
DEFAULT_BUCKETS: Tuple[Tuple[int, int], ...] = ((1, 1024), (1024, 2048), (2048, 4096), (4096, 8193))


@torch.no_grad()
def final_hidden_states(model, input_ids: torch.Tensor, fake_quantize: Optional[Scheme]):
    """Last-layer hidden states ``[T, hidden]`` and the cache holding what attention read.

    The whole window runs as one prefill through :class:`FakeQuantKVCache`; ``fake_quantize=None``
    stores K/V untouched (the baseline; the tests check it is bit-identical to running without
    a cache).
    """
    cache = FakeQuantKVCache(fake_quantize if fake_quantize is not None else identity)
    output = model.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
    return output.last_hidden_state[0], cache


# A token is "confident" when the baseline's top-1 probability beats the runner-up by this much;
# top-1 flips below it are near-ties that any perturbation (even bf16 rounding) can flip.
CONFIDENT_MARGIN = 0.1


@torch.no_grad()
def compare_to_baseline(
    model,
    targets: torch.Tensor,
    base_hidden: torch.Tensor,
    scheme_hidden: Dict[str, torch.Tensor],
    chunk: int = 1024,
) -> Dict[str, Dict[str, torch.Tensor]]:
    """Per-position metrics of each scheme against the baseline.

    ``targets[t]`` is the token that follows position ``t``; hidden states are trimmed to
    ``len(targets)`` rows. Returns ``{scheme: {nll_base, nll, kl, agree, margin}}`` ([N] each);
    ``kl`` is KL(baseline || scheme) of the next-token distributions in nats, ``margin`` the
    baseline's top-1 minus top-2 probability. float32 log-softmax keeps KL accurate to ~1e-6.
    """
    count = targets.shape[0]
    results = {name: {"nll_base": [], "nll": [], "kl": [], "agree": [], "margin": []} for name in scheme_hidden}
    for start in range(0, count, chunk):
        stop = min(start + chunk, count)
        target = targets[start:stop].unsqueeze(-1)
        base_logp = torch.log_softmax(model.lm_head(base_hidden[start:stop]), dim=-1)
        base_nll = -base_logp.gather(-1, target).squeeze(-1)
        base_p = base_logp.exp()
        top2 = base_p.topk(2, dim=-1)
        base_top, margin = top2.indices[:, 0], top2.values[:, 0] - top2.values[:, 1]
        for name, hidden in scheme_hidden.items():
            logp = torch.log_softmax(model.lm_head(hidden[start:stop]), dim=-1)
            entry = results[name]
            entry["nll_base"].append(base_nll.double())
            entry["nll"].append(-logp.gather(-1, target).squeeze(-1).double())
            entry["kl"].append((base_p * (base_logp - logp)).sum(-1).double().clamp_min(0.0))
            entry["agree"].append(logp.argmax(-1) == base_top)
            entry["margin"].append(margin)
    return {name: {key: torch.cat(parts) for key, parts in entry.items()} for name, entry in results.items()}


def summarize(per_token: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Aggregate metrics over the selected tokens (perplexities from summed NLL)."""
    n = int(per_token["nll"].numel())
    if n == 0:
        return {"tokens": 0}
    sum_base = float(per_token["nll_base"].sum())
    sum_scheme = float(per_token["nll"].sum())
    kl = per_token["kl"]
    confident = per_token["margin"] >= CONFIDENT_MARGIN
    return {
        "tokens": n,
        "ppl_base": math.exp(sum_base / n),
        "ppl": math.exp(sum_scheme / n),
        "ppl_ratio": math.exp((sum_scheme - sum_base) / n),
        "top1_agreement": float(per_token["agree"].double().mean()),
        "top1_agreement_confident": float(per_token["agree"][confident].double().mean()) if bool(confident.any()) else 1.0,
        "confident_fraction": float(confident.double().mean()),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(torch.quantile(kl, 0.99)) if n > 1 else float(kl.max()),
        "kl_max": float(kl.max()),
    }


def concat_per_token(parts: Sequence[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    keys = parts[0].keys()
    return {key: torch.cat([part[key] for part in parts]) for key in keys}


def bucket_summaries(
    per_token: Dict[str, torch.Tensor],
    context_lengths: torch.Tensor,
    buckets: Sequence[Tuple[int, int]] = DEFAULT_BUCKETS,
) -> List[Dict[str, float]]:
    rows = []
    for low, high in buckets:
        mask = (context_lengths >= low) & (context_lengths < high)
        if not bool(mask.any()):
            continue
        row = {"context_from": low, "context_to": high - 1}
        row.update(summarize({k: v[mask] for k, v in per_token.items()}))
        rows.append(row)
    return rows


@torch.no_grad()
def quantizer_error(baseline_cache: FakeQuantKVCache, fake_quantize: Scheme) -> Dict[str, float]:
    """Error of one scheme applied to the baseline's real post-RoPE K and V (all layers).

    Isolates the number format from error propagation through the network: relative L2 error,
    and the fraction of elements at or beyond the fp8 e4m3 range (saturation risk of unit scales).
    """
    stats: Dict[str, float] = {}
    maps = dict(zip(("k", "v"), kv_maps(fake_quantize)))
    for kind in ("k", "v"):
        err_sq, ref_sq, saturated, total, absmax = 0.0, 0.0, 0, 0, 0.0
        for layer in baseline_cache.layers:
            raw = (layer.keys if kind == "k" else layer.values).float()
            err_sq += float(torch.linalg.vector_norm(maps[kind](raw) - raw)) ** 2
            ref_sq += float(torch.linalg.vector_norm(raw)) ** 2
            saturated += int((raw.abs() >= FP8_E4M3_MAX).sum())
            total += raw.numel()
            absmax = max(absmax, float(raw.abs().max()))
        stats[f"{kind}_rel_l2_error"] = math.sqrt(err_sq / ref_sq)
        stats[f"{kind}_absmax"] = absmax
        stats[f"{kind}_fraction_beyond_fp8_range"] = saturated / total
    return stats
