"""One-time self-test of the INT8 kernels on the real device, shared by every vLLM process.

``cached_verdict`` runs ``python -m govinda_patch selftest --json`` in a child process (so a
process that must not initialise the GPU, like vLLM 0.18's API server, never does) and caches
the verdict on disk keyed (``fingerprint.machine_key``) by the kernel sources, torch/triton
versions, the visible devices and the model of the GPU the process runs on (``device_cache``):
the processes of one server share a decision, and a tensor-parallel rank on another GPU model gets its own. ``run_selftest`` is the test
itself: a tiny quantize-and-store and a mixed prefill+decode attention against the references,
for the KV rotation in force (every process of a server shares it, and the cache key holds it, so
a server started with the other rotation runs its own test); ``selftest --all-rotations`` checks
both by hand.
"""

from __future__ import annotations

import json
import os

from ..excerpt import PATH_CHARS, error_text, quote
from ..settings import KV_ROTATIONS, kv_rotation
from . import cache_files, child, device_alias
from .device_cache import current_device_index, device_key, write_json_atomically
from .fingerprint import machine_key


def cached_verdict(settings) -> dict:
    """The verdict for this machine, from the cache or a fresh child run.

    A cache directory that cannot be created, locked or written (read-only HOME, a path under a
    regular file) never stops the decision: the child runs uncached and the verdict carries an
    ``uncached`` note for the caller's one log line. A cache file that cannot be trusted (not a
    regular file, not a valid verdict) is named in a ``cache_problem`` note, ignored, and replaced
    by the fresh verdict; a lock another process keeps past ``cache_files.LOCK_TIMEOUT_S`` is given
    up (``lock_note``): the child runs here too.
    """
    directory = settings.cache_subdir("selftest")
    try:
        if directory is None:
            raise FileNotFoundError("no home directory and GOVINDA_CACHE_DIR unset")
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return dict(child.run_subcommand(), uncached=_uncached_note(directory, exc))
    from .cache_schemas import SelftestVerdict

    # One child at a time (e.g. several TP workers), within the lock's timeout.
    with cache_files.locked(directory / ".lock") as lock:
        index = current_device_index()
        path = directory / f"{machine_key(_verdict_key(directory, index))}.json"
        problems = [lock.problem] if lock.problem else []
        bad = None
        try:
            cached = cache_files.read_validated(path, SelftestVerdict)
        except cache_files.BadCacheFile as exc:
            cached, bad = None, str(exc)
        if cached is not None:
            for key in RUNTIME_KEYS:  # notes about one process's cache, never read back from a file
                cached.pop(key, None)
            return dict(cached, cache_problem="; ".join(problems)) if problems else cached
        verdict = child.run_subcommand() if index is None else child.run_subcommand(("selftest", "--json", "--device-index", str(index)))
        notes, written = {}, False
        if verdict.get("cacheable", True):
            try:
                write_json_atomically(path, verdict)
                written = True
            except OSError as exc:
                notes["uncached"] = _uncached_note(directory, exc)
        if bad is not None:
            problems.append(f"ignored {bad}; the self-test ran again" + (" and its verdict replaced the file" if written else ""))
        if problems:
            notes["cache_problem"] = "; ".join(problems)
        if lock.busy:
            notes["lock_note"] = f"{lock.note()}, so it ran here too"
        return dict(verdict, **notes)


def _verdict_key(directory, index) -> str:
    """The device key a verdict is cached under: GPU ``index``'s, else (no GPU context) the
    background self-test's record of the first visible GPU, if any."""
    key = device_key(index)
    if index is None:
        key = device_alias.first_device_key(directory) or key
    return key


def record_failure(settings, reason: str, device_index=None):
    """Cache a failed verdict with ``reason`` for the device ``cached_verdict`` would look up (the
    GPU ``device_index``, else the background self-test's first visible GPU), replacing what is
    cached: the kernels failed a check the self-test's own small shape does not make (the tuner's,
    at the model's shape). None when written, else what stopped it."""
    directory = settings.cache_subdir("selftest")
    if directory is None:
        return "no home directory and GOVINDA_CACHE_DIR unset"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with cache_files.locked(directory / ".lock"):
            key = _verdict_key(directory, device_index)
            write_json_atomically(directory / f"{machine_key(key)}.json",
                                  {"ok": False, "device_key": key, "reason": reason, "cacheable": True})
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


# Keys cached_verdict adds for its caller's log line; they describe this process's cache only.
RUNTIME_KEYS = ("uncached", "cache_problem", "lock_note")


def _uncached_note(directory, exc: OSError) -> str:
    where = quote(directory, PATH_CHARS) if directory is not None else "no cache directory"
    cause = f"{type(exc).__name__}: {exc.strerror}" if exc.strerror else error_text(exc)  # the path is named already
    return f"its verdict is not cached ({where}: {cause}), so every process runs it again"


def run_selftest(device_index=None, rotations=None) -> dict:
    """Run the kernels once against their references on this machine's device (the current one,
    or ``device_index``), for ``rotations`` (default: the one in force)."""
    try:
        import torch
    except ImportError as exc:
        return {"ok": False, "reason": f"torch missing: {exc}"}
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.cuda.is_available():
        if device_index is not None:
            torch.cuda.set_device(device_index)
        device = torch.device("cuda", torch.cuda.current_device())
        device_name = torch.cuda.get_device_name(device)
    elif interpret:
        device, device_name = torch.device("cpu"), "cpu (TRITON_INTERPRET=1)"
    else:
        return {"ok": False, "reason": "no GPU visible (set TRITON_INTERPRET=1 to test kernels on the CPU)"}
    # The cache key of the device tested, for a prefetch that runs without a GPU context itself.
    tested_key = device_key(device.index) if device.type == "cuda" else device_key(None)
    summary, problems = {}, []
    for rotation in rotations or (kv_rotation(),):
        try:
            result = _check_kernels(torch, device, rotation)
        except Exception as exc:
            return {"ok": False, "device": device_name, "device_key": tested_key,
                    "reason": f"kv_rotation={rotation}: {type(exc).__name__}: {exc}"}
        if not result.pop("ok"):
            problems.append(f"kv_rotation={rotation}: {result['problem']}")
        summary[rotation] = result
    return {"ok": not problems, "device": device_name, "device_key": tested_key, "summary": summary, "reason": "; ".join(problems)}


def _check_kernels(torch, device, rotation: str) -> dict:
    from ..kernel_package import import_kernel

    layout = import_kernel("int8_kv_layout")
    store = import_kernel("int8_kv_store")
    attention = import_kernel("int8_paged_attention")

    generator = torch.Generator().manual_seed(0)
    num_kv_heads, group, head_dim, block_size = 2, 3, 128, 32
    # One decode (context 70) and one 5-token prefill chunk over a 40-token prefix.
    query_lens, seq_lens = [1, 5], [70, 45]
    num_blocks = sum(-(-s // block_size) for s in seq_lens) + 1
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    cache = torch.zeros(layout.cache_shape(num_blocks, block_size, num_kv_heads, head_dim), dtype=torch.int8, device=device)
    reference_cache = cache.clone()
    tables, slots, next_block = [], [], 1
    for seq_len in seq_lens:
        blocks = list(range(next_block, next_block + -(-seq_len // block_size)))
        next_block += len(blocks)
        tables.append(blocks + [0] * (4 - len(blocks)))
        slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(seq_len))
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=device)
    keys, values = randn(len(slots), num_kv_heads, head_dim), randn(len(slots), num_kv_heads, head_dim)
    store.store_kv_int8(keys, values, cache, slot_mapping, block_size=block_size, rotation=rotation)
    # The reference quantizer is defined by torch's CPU arithmetic (IEEE division, round half even).
    reference_cache = reference_cache.cpu()
    layout.store_reference(keys.cpu(), values.cpu(), reference_cache, slot_mapping.cpu(), block_size, rotation=rotation)
    store_exact = bool(torch.equal(cache.cpu(), reference_cache))

    query = randn(sum(query_lens), num_kv_heads * group, head_dim)
    output = torch.zeros_like(query)
    query_start_loc = torch.tensor([0, 1, 6], dtype=torch.int32, device=device)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    block_table = torch.tensor(tables, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    attention.paged_attention_int8(
        query, cache, output, query_start_loc, seq_lens_t, block_table,
        block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=scale,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens), num_decodes=1, rotation=rotation,
    )
    expected = attention.attention_reference(
        query, cache, query_start_loc, seq_lens_t, block_table,
        block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=scale, rotation=rotation,
    )
    max_error = float((output.float() - expected).abs().max())
    # bf16 output rounding of O(1) values is ~4e-3; P and V pass through bf16/fp16 in the dot.
    tolerance = 2e-2
    ok = store_exact and max_error <= tolerance and bool(torch.isfinite(output).all())
    problem = "" if ok else f"store_exact={store_exact} attention max_error={max_error:.3g} (tolerance {tolerance})"
    result = {"ok": ok, "store_exact": store_exact, "attention_max_error": max_error, "problem": problem}
    # The prefill path a server would take here (gather + FA3 on Hopper), on the same batch.
    from . import prefill_kernel as prefill_choice

    choice = prefill_choice.resolve(import_kernel("launch_configs").get_launch_configs(device), head_dim, device)
    result["prefill_kernel"] = choice.name
    if choice.varlen_attention is not None:
        gather = import_kernel("int8_kv_gather")
        prefill_lens = seq_lens[1:]
        cu_k = torch.tensor([0] + [sum(prefill_lens[: i + 1]) for i in range(len(prefill_lens))], dtype=torch.int32)
        plan = attention.GatheredPrefill(
            varlen_attention=choice.varlen_attention, cu_seqlens_k=cu_k.to(device), total_k=sum(prefill_lens),
            max_seqlen_k=max(prefill_lens), max_seqlen_q=max(query_lens[1:]), num_prefill_tokens=sum(query_lens[1:]),
        )
        gathered = torch.zeros_like(query)
        attention.paged_attention_int8(
            query, cache, gathered, query_start_loc, seq_lens_t, block_table,
            block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=scale,
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), num_decodes=1, rotation=rotation,
            gathered_prefill=plan,
        )
        keys = torch.empty((plan.total_k, num_kv_heads, head_dim), dtype=dtype, device=device)
        values = torch.empty_like(keys)
        gather.gather_kv_int8(
            cache, block_table, seq_lens_t, plan.cu_seqlens_k, keys, values, block_size=block_size,
            num_kv_heads=num_kv_heads, max_seqlen_k=plan.max_seqlen_k, rotation=rotation, first_seq=1,
        )
        ref_k, ref_v = gather.gather_kv_reference(
            cache.cpu(), block_table[1:].cpu(), prefill_lens, block_size=block_size, num_kv_heads=num_kv_heads,
            head_dim=head_dim, dtype=dtype, rotation=rotation,
        )
        gather_exact = bool(torch.equal(keys.cpu(), ref_k) and torch.equal(values.cpu(), ref_v))
        # The gathered K/V carry one more bf16 rounding than the reference (see tests/kernels).
        gathered_error = float((gathered.float() - expected).abs().max())
        gathered_ok = gather_exact and gathered_error <= 2 * tolerance and bool(torch.isfinite(gathered).all())
        result.update(gather_exact=gather_exact, gathered_prefill_max_error=gathered_error)
        if not gathered_ok:
            result["ok"] = False
            result["problem"] = (problem + "; " if problem else "") + (
                f"{choice.name} prefill: gather_exact={gather_exact} max_error={gathered_error:.3g} (tolerance {2 * tolerance})"
            )
    return result


def main_json(device_index=None, rotations=None) -> int:
    verdict = run_selftest(device_index, rotations)
    print(json.dumps(verdict), flush=True)
    return 0
