"""Self-tuning of the INT8 kernels' launch configs on the GPU they run on, once per model shape.

How the shape gets here: only a vLLM worker knows it (head_dim, q/kv heads, block size, dtype),
so the attention metadata builder calls :func:`launch_configs_for` when it is created, before
any CUDA graph is captured. That reads the tuned choice cached on disk for this shape, or runs
``python -m govinda_patch tune --json --shape ...`` in a child process (the same way, and with
the same cache key parts, as the kernel self-test: a candidate that crashes the GPU takes the
child down, never the server) under a file lock, so the tensor-parallel workers of one server
tune once and all use the same choice. The builder passes the resulting table to every kernel
call; no table is ever modified.

The child (:func:`run_tuning`) checks each candidate of ``launch_configs.tuning_candidates``
against the torch reference on a small batch of the model's shape, with the KV rotation in force,
then times it: decode tiles x split policy at
batch 1 (scored by the geometric mean of their times at several contexts, 4K/16K/32K on a
GPU), the split policy at batch 8, then prefill tiles/warps/stages. It keeps the fastest
correct candidate of each part, within a time budget (``GOVINDA_TUNE_BUDGET_S``); parts it
does not reach, or where no candidate passes, keep the hand table's entry, checked at the shape
too. If that is wrong as well, nothing correct is left to launch: :class:`WrongAtShape` records
the device's self-test verdict as failed, so the guard keeps vLLM stock.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from ..excerpt import clip, error_text
from ..kernel_package import import_kernel

TUNE_TIMEOUT_MARGIN_S = 180  # child start-up, imports and the last compile on top of the budget
# The batch-1 timings cycle through copies of their context holding at least this many bytes.
REPLICATED_BYTES = 128 << 20


@dataclass(frozen=True)
class TuneShape:
    head_dim: int
    num_q_heads: int
    num_kv_heads: int
    block_size: int
    dtype: str  # "bf16" | "fp16"

    def key(self) -> str:
        return f"d{self.head_dim}-q{self.num_q_heads}-kv{self.num_kv_heads}-b{self.block_size}-{self.dtype}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def torch_dtype(self):
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]

    @classmethod
    def from_json(cls, text: str) -> "TuneShape":
        data = json.loads(text)
        shape = cls(**data)
        if shape.dtype not in ("bf16", "fp16") or shape.num_q_heads % max(shape.num_kv_heads, 1):
            raise ValueError(f"bad tuning shape {data}")
        return shape


@dataclass(frozen=True)
class TuneWorkload:
    """The problem sizes timed (the check batch is fixed and small)."""

    decode_contexts: tuple = (4096, 16384, 32768)  # batch 1: a candidate's score is the geometric mean
    batched_decodes: int = 8
    batched_context: int = 8192
    prefill_tokens: int = 8192
    # The checked prefill: chunks over an existing prefix and a fresh prompt.
    check_prefill_query_lens: tuple = (40, 17)
    check_prefill_seq_lens: tuple = (100, 17)


DEFAULT_WORKLOAD = TuneWorkload()
# Interpreter (CPU tests): shapes that still span several tiles, splits and pages.
INTERPRETER_WORKLOAD = TuneWorkload(
    decode_contexts=(40, 96), batched_decodes=3, batched_context=64, prefill_tokens=40,
    check_prefill_query_lens=(20, 5), check_prefill_seq_lens=(37, 5),
)


def _log(message: str) -> None:
    print(f"govinda INFO [pid {os.getpid()}] tune: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Worker side: the cached choice for a shape
# --------------------------------------------------------------------------------------------


def _device_label(device) -> str:
    import torch

    from .device_cache import device_model

    index = torch.device(device).index
    return device_model(torch.cuda.current_device() if index is None else index)


def cache_path(settings, shape: TuneShape, device_label: str, arch_key: str) -> Path:
    from .fingerprint import machine_key

    # Keyed like the self-test verdict (device model, kernel sources, torch/triton, visible
    # devices), plus the table in force and the shape (a tensor-parallel rank's head counts).
    extra = hashlib.sha256(f"{device_label}|{arch_key}".encode()).hexdigest()[:12]
    directory = settings.cache_subdir("tune")
    if directory is None:
        raise FileNotFoundError("no home directory and GOVINDA_CACHE_DIR unset: no cache for tuned configs")
    return directory / f"{machine_key(device_label)}-{extra}-{shape.key()}.json"


def _read_cached(path: Path) -> Optional[dict]:
    """The cached result for ``path``, None without one; ``BadCacheFile`` for an entry that is not
    a valid successful tuning result whose choice this table can use."""
    from . import cache_files
    from .cache_schemas import TuneResult

    result = cache_files.read_validated(path, TuneResult)
    if result is None:
        return None
    if result["ok"] is not True:
        raise cache_files.BadCacheFile(path, "a failed tuning result (those are never cached)")
    try:
        import_kernel("launch_configs").TunedChoice.from_json(result["choice"])
    except (TypeError, ValueError, KeyError) as exc:
        raise cache_files.BadCacheFile(path, f"its choice does not fit this launch-config table ({type(exc).__name__}: {exc})") from None
    return result


def cached_or_tuned(settings, shape: TuneShape, device, arch_key: str, device_label: str, tune_here: bool = False) -> dict:
    """The tuning result for ``shape``: from the cache, else from a tuning child (then cached).
    ``tune_here`` tunes in this process instead: for ``tune --cached``, already a process of its
    own, where a child would only import torch and set up the GPU a second time.

    A cache file that cannot be trusted is named in the result's ``cache_problem``, ignored and
    replaced by the fresh result. While another process keeps the lock past
    ``cache_files.LOCK_TIMEOUT_S`` (it is tuning this shape), the result is ``busy``: this start
    keeps the hand table instead of tuning the same shape twice at once.
    """
    from . import cache_files, child
    from .device_cache import write_json_atomically

    path = cache_path(settings, shape, device_label, arch_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with cache_files.locked(path.parent / ".lock") as lock:
        problems = [lock.problem] if lock.problem else []
        bad = None
        if settings.tune != "force":
            try:
                result = _read_cached(path)
            except cache_files.BadCacheFile as exc:
                result, bad = None, str(exc)
            if result is not None:
                result["from_cache"] = True
                if problems:
                    result["cache_problem"] = "; ".join(problems)
                return result
        if lock.busy:
            return {"ok": False, "busy": True, "cacheable": False, "from_cache": False,
                    "reason": f"{lock.note()}, tuning this shape: the tuned choice applies from the next start"}
        import torch

        device = torch.device(device)
        index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
        _log(f"tuning launch configs for {shape.key()} on {device_label} (budget {settings.tune_budget_s:g} s)")
        if tune_here:
            result = tune_result(shape, index, settings.tune_budget_s)
        else:
            args = ("tune", "--json", "--shape", shape.to_json(), "--device-index", str(index), "--budget-s", f"{settings.tune_budget_s:g}")
            result = child.run_subcommand(
                args, timeout_s=int(settings.tune_budget_s + TUNE_TIMEOUT_MARGIN_S), what="tuning", stream_stderr=True
            )
        written = False
        if result.get("ok") and result.get("cacheable", True):
            try:
                write_json_atomically(path, result)
                written = True
            except OSError as exc:
                problems.append(f"the result is not cached ({exc.strerror or exc})")
        if bad is not None:
            problems.append(f"ignored {bad}; tuned again" + (" and the result replaced the file" if written else ""))
        if problems:
            result["cache_problem"] = "; ".join(problems)
        result["from_cache"] = False
        return result


@functools.lru_cache(maxsize=None)
def _launch_configs_for(settings_key: tuple, shape: TuneShape, device_str: str, tune_here: bool = False):
    from ..settings import current as current_settings

    lc = import_kernel("launch_configs")
    settings = current_settings()
    import torch

    device = torch.device(device_str)
    base = lc.get_launch_configs(device)
    hand = f"hand table {base.key}: {lc.choice_from_table(base, shape.head_dim).label}"
    if settings.tune == "off":
        return base, f"{hand} (GOVINDA_TUNE=off)"
    if device.type != "cuda" or lc.interpreting():
        return base, f"{hand} (no GPU to tune on)"
    try:
        result = cached_or_tuned(settings, shape, device, base.key, _device_label(device), tune_here)
        if result.get("cache_problem"):  # once per shape and process (this function is cached)
            logging.getLogger("govinda").warning("launch-config cache for %s: %s", shape.key(), clip(result["cache_problem"], 1200))
        if result.get("busy"):
            return base, f"{hand} ({result.get('reason')})"
        if not result.get("ok"):
            return base, f"{hand} (tuning failed: {result.get('reason', 'unknown')})"
        choice = lc.TunedChoice.from_json(result["choice"])
    except Exception as exc:  # a broken child or cache directory must never stop the server
        return base, f"{hand} (tuning failed: {error_text(exc, 300)})"
    if result.get("wrong_at_shape"):
        error = refuse_shape(settings, shape, device, str(result["wrong_at_shape"]))
        if not tune_here:  # an engine building its attention: one line beside vLLM's traceback
            logging.getLogger("govinda").error("%s; this start stops rather than serve wrong attention", error)
        raise error
    origin = "cached" if result.get("from_cache") else f"tuned in {result.get('elapsed_s') or 0:.1f} s"
    return lc.with_choice(base, shape.head_dim, choice), f"tuned ({origin}) {choice.label}; {clip(result.get('summary', ''), 300)}"


class WrongAtShape(RuntimeError):
    """The tuner found the kernels this shape would launch wrong against the reference (no candidate
    passed and the hand table's entry failed too). The device's self-test verdict is cached as failed
    first (``recorded``), so the ``kernel_selftest`` guard keeps vLLM stock from then on; an engine
    that meets this while building its attention stops rather than serve wrong attention."""

    def __init__(self, reason: str, recorded: Optional[str]):
        self.reason, self.problem = reason, recorded
        then = ("the self-test verdict for this device is now failed, so vLLM runs stock from the next start" if recorded is None
                else f"set GOVINDA_INT8_KV=0 to run vLLM stock (the failed verdict could not be recorded: {recorded})")
        super().__init__(f"{reason}; {then}")


def refuse_shape(settings, shape: TuneShape, device, wrong: str) -> WrongAtShape:
    """Record the device's self-test verdict as failed because of ``wrong`` at ``shape``; return the
    error to raise (never raises itself)."""
    from ..settings import kv_rotation
    from . import selftest

    reason = (f"the INT8 kernels give wrong results at the model's attention shape {shape.key()} "
              f"(kv_rotation={kv_rotation()}; the launch-config tuner's check: {clip(wrong, 300)})")
    index = None
    if device.type == "cuda":  # the key the guard of a process on this GPU looks up
        index = device.index if device.index is not None else selftest.current_device_index()
    return WrongAtShape(reason, selftest.record_failure(settings, reason, index))


def launch_configs_for(shape: TuneShape, device, tune_here: bool = False):
    """``(ArchLaunchConfigs, description)`` for ``shape`` on ``device``; the hand table on any failure
    of the tuning itself. Raises :class:`WrongAtShape` when the tuning found the kernels wrong here.
    ``tune_here``: see :func:`cached_or_tuned` (servers leave it off: a tuning crash must not take them down)."""
    keys = ("GOVINDA_TUNE", "GOVINDA_TUNE_BUDGET_S", "GOVINDA_CACHE_DIR", "GOVINDA_KERNEL_ARCH")
    return _launch_configs_for(tuple(os.environ.get(k) for k in keys), shape, str(device), tune_here)


# --------------------------------------------------------------------------------------------
# Child side: check and time the candidates
# --------------------------------------------------------------------------------------------


class TuneProblems:
    """Inputs for one shape on one device: a small check batch and the timed batches.

    Everything runs with the KV rotation in force (``GOVINDA_KV_ROTATION``, part of the cache
    key): the rotated kernels are other specialisations, and the ones a server launches at its
    own shape are what the check must pass (a miscompile can hit one shape and spare another).
    """

    def __init__(self, shape: TuneShape, device, workload: TuneWorkload, seed: int = 0):
        import torch

        from ..settings import kv_rotation

        self.torch = torch
        self.rotation = kv_rotation()
        self.layout = import_kernel("int8_kv_layout")
        self.attention = import_kernel("int8_paged_attention")
        self.shape, self.device, self.workload = shape, torch.device(device), workload
        self.dtype = shape.torch_dtype()
        self.generator = torch.Generator().manual_seed(seed)
        w = workload
        # Decodes at batch 1 read one of several copies of their context in turn, so repeated
        # timing runs do not find it in a last-level cache (as in serving, where the other
        # layers run between two calls of one layer).
        page = self.layout.bytes_per_token(shape.num_kv_heads, shape.head_dim)
        self.replicas = {
            context: 1 if device_is_cpu(self.device) else min(16, max(1, -(-REPLICATED_BYTES // (context * page))))
            for context in w.decode_contexts
        }
        specs = {
            "check_decode": ([1, 1, 1], [w.batched_context // 2 + 37, 45, 2 * shape.block_size + 3], 3),
            "check_prefill": (list(w.check_prefill_query_lens), list(w.check_prefill_seq_lens), 0),
            **{
                f"decode_1_{context}_{i}": ([1], [context], 1)
                for context, count in self.replicas.items()
                for i in range(count)
            },
            "decode_b": ([1] * w.batched_decodes, [w.batched_context] * w.batched_decodes, w.batched_decodes),
            "prefill": ([w.prefill_tokens], [w.prefill_tokens], 0),
        }
        num_blocks = 1 + sum(-(-n // shape.block_size) for _, seq_lens, _ in specs.values() for n in seq_lens)
        self.cache = torch.zeros(
            self.layout.cache_shape(num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim),
            dtype=torch.int8,
            device=self.device,
        )
        self._next_block = 1
        batches = {name: self._batch(*spec) for name, spec in specs.items()}
        # Random K/V for the checked batches (the reference quantizer: the store kernel is the
        # self-test's business); the timed ones read zero pages (the same bytes move).
        for name in ("check_decode", "check_prefill"):
            self._fill(batches[name])
        self.check_decode, self.check_prefill = batches["check_decode"], batches["check_prefill"]
        # One list of replicas per batch-1 context.
        self.decode_1 = {
            context: [batches[f"decode_1_{context}_{i}"] for i in range(count)] for context, count in self.replicas.items()
        }
        self.decode_b, self.prefill = batches["decode_b"], batches["prefill"]

    def _fill(self, batch: dict) -> None:
        torch, bs = self.torch, self.shape.block_size
        slots = []
        for row, seq_len in zip(batch["block_table"].tolist(), batch["seq_lens"].tolist()):
            slots.extend(row[p // bs] * bs + p % bs for p in range(seq_len))
        keys = self._randn(len(slots), self.shape.num_kv_heads, self.shape.head_dim)
        slot_mapping = torch.tensor(slots, dtype=torch.int64, device=self.device)
        self.layout.store_reference(keys, self._randn(*keys.shape), self.cache, slot_mapping, bs, rotation=self.rotation)

    def _randn(self, *shape):
        return self.torch.randn(*shape, generator=self.generator).to(device=self.device, dtype=self.dtype)

    def _batch(self, query_lens, seq_lens, num_decodes) -> dict:
        torch = self.torch
        bs = self.shape.block_size
        tables = []
        for seq_len in seq_lens:
            count = -(-seq_len // bs)
            tables.append(list(range(self._next_block, self._next_block + count)))
            self._next_block += count
        width = max(len(t) for t in tables)
        block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=self.device)
        starts = [0]
        for length in query_lens:
            starts.append(starts[-1] + length)
        query = self._randn(starts[-1], self.shape.num_q_heads, self.shape.head_dim)
        return dict(
            query=query,
            output=torch.zeros_like(query),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            block_table=block_table,
            num_decodes=num_decodes,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )

    def run(self, batch: dict, configs, workspace=None):
        self.attention.paged_attention_int8(
            batch["query"], self.cache, batch["output"], batch["query_start_loc"], batch["seq_lens"], batch["block_table"],
            block_size=self.shape.block_size, num_kv_heads=self.shape.num_kv_heads,
            softmax_scale=self.shape.head_dim**-0.5, max_query_len=batch["max_query_len"],
            max_seq_len=batch["max_seq_len"], num_decodes=batch["num_decodes"], workspace=workspace, configs=configs,
            rotation=self.rotation,
        )
        return batch["output"]

    def check(self, batch: dict, configs) -> float:
        """Largest error of ``configs`` against the fp32 reference, relative to the bound."""
        output = self.run(batch, configs).float()
        expected = self.attention.attention_reference(
            batch["query"], self.cache, batch["query_start_loc"], batch["seq_lens"], batch["block_table"],
            block_size=self.shape.block_size, num_kv_heads=self.shape.num_kv_heads,
            softmax_scale=self.shape.head_dim**-0.5, rotation=self.rotation,
        )
        if not bool(self.torch.isfinite(output).all()):
            return math.inf
        # Two roundings to the query dtype (P before the PV product, then the output), as in
        # tests/kernels/test_int8_paged_attention.py; 2x margin for fp32 summation order.
        unit = {self.torch.bfloat16: 2.0**-8, self.torch.float16: 2.0**-11}[self.dtype]
        bound = 4 * unit * max(float(expected.abs().max()), 1.0)
        return float((output - expected).abs().max()) / bound


def device_is_cpu(device) -> bool:
    import torch

    return torch.device(device).type != "cuda"


def default_timer(problems: TuneProblems) -> Callable:
    """``timer(run, part, label)``: seconds per call of ``run()`` on this device."""
    torch = problems.torch
    if device_is_cpu(problems.device):
        def cpu_timer(run, part=None, label=None):
            run()
            started = time.perf_counter()
            run()
            return time.perf_counter() - started

        return cpu_timer

    def gpu_timer(run, part=None, label=None, calls: int = 20, replays: int = 3):
        run()  # compile and warm up outside the capture
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(stream):
                run()
                stream.synchronize()
                with torch.cuda.graph(graph, stream=stream):
                    for _ in range(calls):
                        run()
            replay = graph.replay
        except Exception:  # a platform without graph capture: time eager launches
            def replay():
                for _ in range(calls):
                    run()
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
        return sorted(times)[len(times) // 2]

    return gpu_timer


@dataclass
class Trial:
    part: str  # decode_b1 | decode_batched | prefill
    label: str
    seconds: Optional[float] = None  # decode_b1: the geometric mean over the contexts
    per_context_us: Optional[dict] = None  # decode_b1: microseconds per batch-1 context
    error_ratio: Optional[float] = None
    problem: str = ""

    @property
    def usable(self) -> bool:
        return self.seconds is not None and not self.problem


def run_tuning(
    shape: TuneShape,
    device,
    *,
    budget_s: float,
    workload: Optional[TuneWorkload] = None,
    timer: Optional[Callable] = None,
    candidates=None,
    base=None,
    clock: Callable[[], float] = time.monotonic,
    tune_prefill: Optional[bool] = None,
) -> dict:
    """Pick, per part, the fastest candidate that matches the reference, within ``budget_s``.

    ``tune_prefill`` (default: whether the Triton kernel runs prefills here,
    govinda_patch/int8/prefill_kernel.py) skips the prefill part when another kernel does."""
    lc = import_kernel("launch_configs")
    started = clock()
    deadline = started + budget_s
    base = base or lc.get_launch_configs(device)
    candidates = candidates or lc.tuning_candidates(base.key, shape.head_dim)
    if workload is None:
        workload = INTERPRETER_WORKLOAD if device_is_cpu(device) else DEFAULT_WORKLOAD
    problems = TuneProblems(shape, device, workload)
    timer = timer or default_timer(problems)
    chosen = lc.choice_from_table(base, shape.head_dim)
    trials: list[Trial] = []
    policy = replace(base.decode_splits, max_splits=candidates.max_splits)

    def try_candidate(part: str, label: str, configs, check_batch, timed) -> Trial:
        """``timed``: one callable, or a dict of them (scored by the geometric mean)."""
        trial = Trial(part, label)
        trials.append(trial)
        try:
            trial.error_ratio = problems.check(check_batch, configs)
            if not trial.error_ratio <= 1.0:
                trial.problem = f"wrong result: error {trial.error_ratio:.3g} x the bound"
            elif isinstance(timed, dict):
                seconds = {name: float(timer(run, part, f"{label} {name}")) for name, run in timed.items()}
                trial.per_context_us = {str(name): round(value * 1e6, 2) for name, value in seconds.items()}
                trial.seconds = math.exp(sum(math.log(max(value, 1e-12)) for value in seconds.values()) / len(seconds))
            else:
                trial.seconds = float(timer(timed, part, label))
        except Exception as exc:  # e.g. out of shared memory on a smaller GPU
            trial.problem = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        state = f"{trial.seconds * 1e6:.1f} us" if trial.usable else f"rejected ({trial.problem})"
        if trial.usable and trial.per_context_us:
            state += " geomean of " + ", ".join(f"{us:.1f} @ {name}" for name, us in trial.per_context_us.items())
        _log(f"[{len(trials)}] {part} {label}: {state}")
        return trial

    def decode_configs(tile, policy_):
        return replace(base, decode={**dict(base.decode), shape.head_dim: tile}, decode_splits=policy_)

    def timed_decode(configs, batches):
        workspace = problems.attention.DecodeWorkspace.allocate(
            max(b["num_decodes"] for b in batches), shape.num_q_heads, shape.head_dim, problems.device,
            num_kv_heads=shape.num_kv_heads, configs=configs,
        )
        state = {"i": 0}

        def run():
            batch = batches[state["i"] % len(batches)]
            state["i"] += 1
            problems.run(batch, configs, workspace)

        return run

    skipped: list[str] = []

    def fastest(part: str, options, until: float, check_batch, timed_batches):
        """The fastest usable (seconds, option) of ``(label, configs, option)`` triples, or None."""
        best = None
        for label, configs, option in options:
            if clock() >= until:
                skipped.append(f"{part} {label}")
                continue
            if isinstance(timed_batches, dict):
                timed = {name: timed_decode(configs, group) for name, group in timed_batches.items()}
            else:
                timed = timed_decode(configs, timed_batches)
            trial = try_candidate(part, label, configs, check_batch, timed)
            if trial.usable and (best is None or trial.seconds < best[0]):
                best = (trial.seconds, option)
        return best

    # 1. Decode tile x split policy at batch 1, then 2. the batched policy: half the budget.
    decode_deadline = started + budget_s / 2
    best_b1 = fastest(
        "decode_b1",
        (
            (f"{tile.label} pps{per_sm}", decode_configs(tile, replace(policy, programs_per_sm=per_sm, batched_programs_per_sm=None)), (tile, per_sm))
            for tile in candidates.decode
            for per_sm in candidates.programs_per_sm
        ),
        decode_deadline, problems.check_decode, problems.decode_1,
    )
    best_batched = None
    if best_b1 is not None:
        _, (tile, per_sm) = best_b1
        best_batched = fastest(
            "decode_batched",
            (
                (f"{tile.label} pps{per_sm}/{batched}", decode_configs(tile, replace(policy, programs_per_sm=per_sm, batched_programs_per_sm=batched)), batched)
                for batched in candidates.batched_programs_per_sm
            ),
            decode_deadline, problems.check_decode, [problems.decode_b],
        )
        batched = best_batched[1] if best_batched else None
        chosen = replace(
            chosen, decode=tile, decode_splits=replace(policy, programs_per_sm=per_sm, batched_programs_per_sm=batched)
        )
    # 3. Prefill tiles, warps, stages: the rest of the budget, and at least its half even if
    # the decode part overran (one slow compile must not starve prefill).
    prefill_deadline = max(deadline, clock() + budget_s / 2)
    best_prefill: Optional[tuple] = None
    if tune_prefill is None:
        from .prefill_kernel import TRITON, resolve

        tune_prefill = resolve(base, shape.head_dim, device).name == TRITON
    if not tune_prefill:
        _log("prefill not tuned: prefills run on another kernel (GOVINDA_PREFILL_KERNEL)")
    for config in candidates.prefill if tune_prefill else ():
        if clock() >= prefill_deadline:
            skipped.append(f"prefill {config.label}")
            continue
        configs = replace(base, prefill={**dict(base.prefill), shape.head_dim: config})
        trial = try_candidate(
            "prefill", config.label, configs, problems.check_prefill, lambda c=configs: problems.run(problems.prefill, c)
        )
        if trial.usable and (best_prefill is None or trial.seconds < best_prefill[0]):
            best_prefill = (trial.seconds, config)
    if best_prefill is not None:
        chosen = replace(chosen, prefill=best_prefill[1])
    parts = {
        "decode": best_b1 is not None,
        "decode_batched": best_batched is not None,
        "prefill": best_prefill is not None or not tune_prefill,
    }
    kept = [name for name, found in parts.items() if not found]
    # A part no passing trial chose runs the hand table's entry, which nothing has checked at this
    # shape and rotation yet; the server would launch it. Wrong there, the shape must go stock.
    wrong_at_shape = _hand_entries_wrong(
        problems, lc.with_choice(base, shape.head_dim, chosen),
        check_decode=best_b1 is None, check_prefill=best_prefill is None and tune_prefill,
    )
    if wrong_at_shape:
        _log(f"the hand table is wrong at {shape.key()}: {wrong_at_shape}")
    elapsed = clock() - started
    summary = f"{len([t for t in trials if t.usable])}/{len(trials)} candidates usable, {elapsed:.1f} s"
    if skipped:
        summary += f", budget left {len(skipped)} untried"
    if kept:
        summary += f", hand table kept for {'/'.join(kept)}"
    if wrong_at_shape:
        summary += f", WRONG at this shape: {wrong_at_shape}"
    _log(f"chose {chosen.label} ({summary})")
    return {
        "ok": True,
        "shape": asdict(shape),
        "rotation": problems.rotation,
        "table": base.key,
        "choice": chosen.to_json(),
        "label": chosen.label,
        "summary": summary,
        "elapsed_s": round(elapsed, 2),
        "budget_s": budget_s,
        "skipped": skipped,
        "trials": [asdict(t) for t in trials],
        # Set: the kernels this shape would launch give wrong results (see WrongAtShape).
        "wrong_at_shape": wrong_at_shape,
        # A partial pick (budget ran out) is still cached: later starts must not pay again.
        "cacheable": True,
    }


def _hand_entries_wrong(problems: TuneProblems, configs, *, check_decode: bool, check_prefill: bool) -> Optional[str]:
    """What is wrong with ``configs``' decode / prefill at the problems' shape (the parts asked
    for), or None. Only a wrong or non-finite result counts: a check that raises (out of memory
    in a tuning child beside a full server, say) proves nothing about the kernels."""
    found = []
    for part, batch, wanted in (("decode", problems.check_decode, check_decode), ("prefill", problems.check_prefill, check_prefill)):
        if not wanted:
            continue
        try:
            ratio = problems.check(batch, configs)
        except Exception as exc:
            _log(f"the hand table's {part} could not be checked at this shape: {type(exc).__name__}: {clip(exc, 160)}")
            continue
        if not ratio <= 1.0:
            found.append(f"{part}: error {ratio:.3g} x the bound")
    return "; ".join(found) or None


def tune_result(shape: TuneShape, device_index: int, budget_s: float) -> dict:
    """:func:`run_tuning` on GPU ``device_index`` of this process (the CPU interpreter with
    ``TRITON_INTERPRET=1``); a failure is an uncacheable result, never an exception."""
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(device_index)
            device = torch.device("cuda", device_index)
        elif os.environ.get("TRITON_INTERPRET") == "1":
            device = torch.device("cpu")
        else:
            raise RuntimeError("no GPU visible (set TRITON_INTERPRET=1 to tune on the CPU interpreter)")
        return run_tuning(shape, device, budget_s=budget_s)
    except Exception as exc:
        return _failed(exc)


def _failed(exc: Exception) -> dict:
    return {"ok": False, "reason": f"{type(exc).__name__}: {exc}"[:400], "cacheable": False}


def main_json(shape_json: str, device_index: int, budget_s: float) -> int:
    """``python -m govinda_patch tune --json``: one JSON line with the result."""
    try:
        result = tune_result(TuneShape.from_json(shape_json), device_index, budget_s)
    except Exception as exc:  # a malformed shape
        result = _failed(exc)
    print(json.dumps(result), flush=True)
    return 0


def configs_here(shape: TuneShape, device_index: int) -> tuple:
    """``(configs, "KEY: description")``: the launch configs a server start would use for ``shape``,
    read from the cache, or tuned now, in this process, and cached (``tune --cached``, the background
    prefetch)."""
    import torch

    device = torch.device("cuda", device_index) if torch.cuda.is_available() else torch.device("cpu")
    configs, description = launch_configs_for(shape, device, tune_here=True)
    return configs, f"{shape.key()}: {description}"


def main_cached(shape_json: str, device_index: int) -> int:
    """``python -m govinda_patch tune --cached``: :func:`configs_here`'s line; exit 1 when tuning failed."""
    try:
        _, line = configs_here(TuneShape.from_json(shape_json), device_index)
    except WrongAtShape as exc:
        print(f"{shape_json}: {exc}", flush=True)
        return 1
    print(line, flush=True)
    return 1 if "tuning failed" in line else 0
