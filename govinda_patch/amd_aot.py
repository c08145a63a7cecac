"""AMD compile gate: compile every INT8 kernel for CDNA targets on a CPU-only machine.

``python -m govinda_patch amd-aot`` compiles the store, decode-split (with and without the
direct write-out), decode-reduce and prefill kernels for the ``rocm_gfx9`` table and for every
self-tuning candidate of that table (``kernels/launch_configs.py``), over head_dim 64/128/256,
bf16/fp16 and GQA groups 6 and 1, for gfx90a and gfx942 (wave64). Triton's AMD backend ships
in the wheel and links the code object in-process, so no GPU and no ROCm install is needed.

Signatures are never written down here: each kernel's arguments, constexprs and options are
recorded from the real launch wrappers (:mod:`launch_capture`) and specialised with Triton's
own binder for the HIP backend, exactly as a launch on the device would. gfx906 (older DCUs)
is probed as well and reported, not failed on: Triton 3.6 refuses it, 3.8 compiles it.

Exit status 1 when a kernel fails to compile for gfx90a/gfx942, uses scratch or needs more than
64 KiB of LDS. Output: ``reports/amd/aot_resources.{json,md}`` (occupancy model: amd_resources).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import platform
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .amd_resources import AmdResources, parse_listing
from .kernel_package import import_kernel
from .launch_capture import CapturedLaunch, capture_launches
from .settings import REPO_ROOT

GATED_ARCHS = ("gfx90a", "gfx942")
PROBED_ARCHS = ("gfx906",)  # refused by upstream Triton 3.6 (needs a vendor fork); 3.8 compiles it
HEAD_DIMS = (64, 128, 256)
DTYPES = ("bf16", "fp16")
GROUPS = (6, 1)
WAVE_SIZE = 64
TABLE_KEY = "rocm_gfx9"
# A non-hybrid model's block size; BLOCK_SIZE only enters index arithmetic.
CAPTURE_BLOCK_SIZE = 16
DEFAULT_REPORT_DIR = REPO_ROOT / "reports" / "amd"


@dataclass(frozen=True)
class Variant:
    """One launch table to compile: the hand table, or the table with one candidate in force."""

    source: str  # "table" or "candidate"
    kernels: tuple  # which kernel kinds this variant contributes (candidates vary one kind)
    configs: object  # ArchLaunchConfigs
    label: str


@dataclass(frozen=True)
class Case:
    head_dim: int
    dtype: str
    group: int
    # GOVINDA_KV_ROTATION: the rotated kernels are other specialisations (a constexpr).
    rotation: str = "none"


@dataclass
class Job:
    arch: str
    case: Case
    variant: Variant
    kernel: str  # store | decode_split | decode_write | decode_reduce | prefill | gather | rotate | rotate_decode
    config_label: str
    launch: CapturedLaunch


def variants(head_dim: int, *, with_candidates: bool = True) -> list[Variant]:
    lc = import_kernel("launch_configs")
    table = lc.ARCH_TABLES[TABLE_KEY]
    found = [Variant("table", ("store", "decode", "prefill", "gather"), table, "rocm_gfx9")]
    if not with_candidates:
        return found
    candidates = lc.tuning_candidates(TABLE_KEY, head_dim)
    for config in candidates.decode:
        configs = replace(table, decode={**dict(table.decode), head_dim: config})
        found.append(Variant("candidate", ("decode",), configs, f"decode {config.label}"))
    for config in candidates.prefill:
        configs = replace(table, prefill={**dict(table.prefill), head_dim: config})
        found.append(Variant("candidate", ("prefill",), configs, f"prefill {config.label}"))
    return found


def _kernel_kind(launch: CapturedLaunch) -> str:
    name = launch.name
    if name == "decode_split_kernel":
        return "decode_write" if launch.kwargs.get("WRITE_OUTPUT") else "decode_split"
    return {
        "_store_kv_int8_kernel": "store",
        "decode_reduce_kernel": "decode_reduce",
        "prefill_attention_kernel": "prefill",
        "_gather_kv_kernel": "gather",
        "_rotate_token_rows_kernel": "rotate",  # the rotated prefill's pre/post pass
        "_rotate_decode_rows_kernel": "rotate_decode",  # the rotated decode's query pass
    }.get(name, name)


def _config_label(kind: str, configs, head_dim: int) -> str:
    if kind == "store":
        return configs.store.label
    if kind == "decode_reduce":
        return configs.reduce.label
    if kind == "gather":
        return configs.gather.label
    if kind == "prefill":
        return configs.prefill_config(head_dim).label
    if kind in ("rotate", "rotate_decode"):  # fixed tile, not in the tables
        rotation = import_kernel("kv_rotation")
        return f"r{rotation.ROTATE_TILE_ELEMENTS // head_dim}w{rotation.ROTATE_NUM_WARPS}"
    return configs.decode_config(head_dim).label


def _reduce_form_suffix(kind: str, launch: CapturedLaunch, configs) -> str:
    """The reduce's whole-row form (int8_paged_attention._reduce_form) where it is another kernel
    than the head-dim slices (a head no wider than one slice has one form)."""
    if kind != "decode_reduce":
        return ""
    return " rows" if launch.kwargs["BLOCK_D"] > min(configs.reduce.block_n, launch.kwargs["HEAD_DIM"]) else ""


def capture_variant(variant: Variant, case: Case) -> list[tuple[str, CapturedLaunch]]:
    """The launches the real wrappers make for ``variant`` on a small batch of ``case``."""
    import torch

    layout = import_kernel("int8_kv_layout")
    store = import_kernel("int8_kv_store")
    attention = import_kernel("int8_paged_attention")
    gather = import_kernel("int8_kv_gather")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
    num_kv_heads, block_size, head_dim = 2, CAPTURE_BLOCK_SIZE, case.head_dim
    num_q_heads = num_kv_heads * case.group
    cache = torch.zeros(layout.cache_shape(16, block_size, num_kv_heads, head_dim), dtype=torch.int8)
    block_table = torch.arange(1, 9, dtype=torch.int32).reshape(2, 4)
    scale = head_dim**-0.5
    recorded: list[tuple[str, CapturedLaunch]] = []

    def attend(configs, query_lens, seq_lens, num_decodes):
        query = torch.zeros(sum(query_lens), num_q_heads, head_dim, dtype=dtype)
        starts = [0]
        for length in query_lens:
            starts.append(starts[-1] + length)
        table = block_table.repeat(-(-len(seq_lens) // block_table.shape[0]), 1)  # nothing runs: shapes only
        attention.paged_attention_int8(
            query, cache, torch.zeros_like(query),
            torch.tensor(starts, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32), table,
            block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=scale,
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), num_decodes=num_decodes, configs=configs,
            rotation=case.rotation,
        )

    configs = variant.configs
    with capture_launches() as recorder:
        if "store" in variant.kernels:
            keys = torch.zeros(4, num_kv_heads, head_dim, dtype=dtype)
            slots = torch.arange(4, dtype=torch.int64) + block_size
            store.store_kv_int8(keys, keys, cache, slots, block_size=block_size, config=configs.store, rotation=case.rotation)
        if "decode" in variant.kernels:
            attend(configs, [1, 1], [50, 40], 2)  # split-KV: partials + reduce
            # A batch of many decodes: fewer splits, so the reduce may take its other form
            # (int8_paged_attention._reduce_form).
            many = max(2, -(-configs.default_sm_count // num_q_heads))
            attend(configs, [1] * many, [50] * many, many)
            if case.rotation != "none":  # the rotated reduce's other form: row slices, the last rotates
                whole_row_limit = attention.WHOLE_ROW_REDUCE_ELEMENTS
                attention.WHOLE_ROW_REDUCE_ELEMENTS = 0
                try:
                    attend(configs, [1, 1], [50, 40], 2)
                finally:
                    attention.WHOLE_ROW_REDUCE_ELEMENTS = whole_row_limit
            single = replace(configs, decode_splits=replace(configs.decode_splits, max_splits=1))
            attend(single, [1, 1], [50, 40], 2)  # one split: the decode kernel writes the output
        if "prefill" in variant.kernels:
            attend(configs, [7], [40], 0)
        if "gather" in variant.kernels:  # INT8 pages -> bf16/fp16 for a vendor varlen prefill kernel
            kv = torch.zeros(40, num_kv_heads, head_dim, dtype=dtype)
            gather.gather_kv_int8(
                cache, block_table[:1], torch.tensor([40], dtype=torch.int32), torch.tensor([0, 40], dtype=torch.int32),
                kv, torch.zeros_like(kv), block_size=block_size, num_kv_heads=num_kv_heads, max_seqlen_k=40,
                rotation=case.rotation, block_t=configs.gather.block_n, launch_kwargs=configs.gather.launch_kwargs(),
            )
    for launch in recorder.launches:
        recorded.append((_kernel_kind(launch), launch))
    return recorded


def build_jobs(cases: Iterable[Case], archs: Sequence[str], *, with_candidates: bool = True) -> list[Job]:
    jobs, seen = [], set()
    for case in cases:
        for variant in variants(case.head_dim, with_candidates=with_candidates):
            for kind, launch in capture_variant(variant, case):
                label = _config_label(kind, variant.configs, case.head_dim) + _reduce_form_suffix(kind, launch, variant.configs)
                if (case, kind, label) in seen:  # a candidate equal to the table's entry
                    continue
                seen.add((case, kind, label))
                for arch in archs:
                    jobs.append(Job(arch, case, variant, kind, label, launch))
    return jobs


@contextlib.contextmanager
def _stderr_to(path: str):
    """MLIR/LLVM diagnostics go to file descriptor 2 (C++), not to sys.stderr: catch them."""
    saved = os.dup(2)
    with open(path, "w") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def bind_launch(launch: CapturedLaunch, arch: str, target=None):
    """What ``JITFunction.run`` would key its compile on for ``arch`` (or for another
    ``GPUTarget``, e.g. an NVIDIA one in tests): the target and ``(options, signature, constexprs,
    attrs)`` (attrs hold the argument specializations, e.g. 16-byte pointer alignment); equal
    bindings reuse one compiled kernel."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.fn
    target = target or GPUTarget("hip", arch, WAVE_SIZE)
    backend = make_backend(target)
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    return target, fn._pack_args(backend, kwargs, bound_args, specialization, options)


def compile_launch(launch: CapturedLaunch, arch: str, target=None):
    """Compile one recorded launch for ``arch`` (or ``target``) the way ``JITFunction.run`` would
    on that device."""
    import triton
    from triton.compiler import ASTSource

    target, (options, signature, constexprs, attrs) = bind_launch(launch, arch, target)
    return triton.compile(ASTSource(launch.fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def _diagnostic(text: str) -> str:
    text = text.replace(str(REPO_ROOT) + os.sep, "")
    lines = [line.strip() for line in text.splitlines() if "error" in line.lower()]
    return " | ".join(dict.fromkeys(lines))[:400]


def run_job(job: Job) -> dict:
    row = {
        "arch": job.arch,
        "kernel": job.kernel,
        "config": job.config_label,
        "variant": job.variant.label,
        "source": job.variant.source,
        "head_dim": job.case.head_dim,
        "dtype": job.case.dtype,
        "group": job.case.group,
        "rotation": job.case.rotation,
        "num_warps": int(job.launch.kwargs.get("num_warps", 4)),
    }
    wall, cpu = time.perf_counter(), time.process_time()
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        try:
            with _stderr_to(log.name):
                compiled = compile_launch(job.launch, job.arch)
            resources = parse_listing(
                compiled.asm["amdgcn"], lds_bytes=compiled.metadata.shared, num_warps=row["num_warps"]
            )
        except Exception as exc:
            diagnostic = _diagnostic(log.read())
            unsupported = "unsupported target" in diagnostic
            row.update(
                status="unsupported" if unsupported else "compile_error",
                error=f"{type(exc).__name__}: {exc}"[:300],
                diagnostic=diagnostic,
            )
            resources = None
    row["compile_wall_s"] = round(time.perf_counter() - wall, 3)
    row["compile_cpu_s"] = round(time.process_time() - cpu, 3)
    if resources is not None:
        problems = resources.problems()
        row.update(status="problem" if problems else "ok", problems=problems, **resources.as_dict())
    return row


_JOBS: list[Job] = []  # inherited by forked workers (captured launches do not pickle)


def _run_index(index: int) -> dict:
    return run_job(_JOBS[index])


def run_jobs(jobs: list[Job], workers: int, progress=None) -> list[dict]:
    global _JOBS
    _JOBS = jobs
    rows: list[Optional[dict]] = [None] * len(jobs)
    if workers <= 1:
        for index, job in enumerate(jobs):
            rows[index] = run_job(job)
            if progress:
                progress(index + 1, len(jobs), rows[index])
        return rows  # type: ignore[return-value]
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(_run_index, index): index for index in range(len(jobs))}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            index = futures[future]
            try:
                rows[index] = future.result()
            except Exception as exc:  # a compiler crash takes the worker down
                job = jobs[index]
                rows[index] = {
                    "arch": job.arch, "kernel": job.kernel, "config": job.config_label, "variant": job.variant.label,
                    "source": job.variant.source, "head_dim": job.case.head_dim, "dtype": job.case.dtype,
                    "group": job.case.group, "status": "crashed", "error": f"{type(exc).__name__}: {exc}"[:300],
                }
            if progress:
                progress(done, len(jobs), rows[index])
    return rows  # type: ignore[return-value]


def gate_failures(rows: list[dict]) -> list[dict]:
    """Rows that fail the gate: anything but "ok" on a gated arch; a crash on a probed one."""
    failures = []
    for row in rows:
        if row["arch"] in GATED_ARCHS and row["status"] != "ok":
            failures.append(row)
        elif row["arch"] not in GATED_ARCHS and row["status"] == "crashed":
            failures.append(row)
    return failures


SUBSETS = {
    # Every table entry and candidate, every case, both gated archs, and the gfx906 probe.
    "full": dict(cases=[Case(d, t, g) for d in HEAD_DIMS for t in DTYPES for g in GROUPS], archs=GATED_ARCHS + PROBED_ARCHS, candidates=True),
    # CI: the table's kernels at the largest head_dim (the register-heaviest) for each arch,
    # one head_dim/dtype/group combination each, the Hadamard-rotated kernels at D=256 (the
    # full report covers the default, unrotated kernels only), and the gfx906 probe.
    "ci": dict(
        cases=[Case(256, "bf16", 6), Case(128, "fp16", 1), Case(256, "bf16", 6, "hadamard")],
        archs=GATED_ARCHS + PROBED_ARCHS,
        candidates=False,
        keep={("gfx90a", 256), ("gfx942", 128)},
    ),
}


def select_jobs(jobs: list[Job], keep=None) -> list[Job]:
    """A probed arch gets one table job per kernel kind (it is expected to refuse them all);
    ``keep`` limits the gated archs to (arch, head_dim) pairs."""
    selected, probed = [], set()
    for job in jobs:
        if job.arch in PROBED_ARCHS:
            if job.variant.source == "table" and (job.arch, job.kernel) not in probed:
                probed.add((job.arch, job.kernel))
                selected.append(job)
        elif keep is None or (job.arch, job.case.head_dim) in keep:
            selected.append(job)
    return selected


def run_gate(subset: str = "full", workers: int = 1, progress=None) -> dict:
    import triton

    spec = SUBSETS[subset]
    started = time.perf_counter()
    jobs = select_jobs(build_jobs(spec["cases"], spec["archs"], with_candidates=spec["candidates"]), spec.get("keep"))
    rows = run_jobs(jobs, workers, progress)
    failures = gate_failures(rows)
    compiled = [row for row in rows if "compile_cpu_s" in row and row["status"] in ("ok", "problem")]
    return {
        "subset": subset,
        "triton": triton.__version__,
        "host": f"{platform.machine()} {os.cpu_count()} CPUs",
        "workers": workers,
        "gated_archs": list(GATED_ARCHS),
        "probed_archs": list(PROBED_ARCHS),
        "block_size": CAPTURE_BLOCK_SIZE,
        "occupancy_model": _occupancy_model_text(),
        "wall_s": round(time.perf_counter() - started, 1),
        "compile_cpu_s_total": round(sum(row["compile_cpu_s"] for row in compiled), 1),
        "compiles": len(compiled),
        "passed": not failures,
        "failures": failures,
        "rows": rows,
    }


def _occupancy_model_text() -> str:
    from . import amd_resources

    doc = amd_resources.__doc__ or ""
    return doc.split("Occupancy model", 1)[-1].strip()


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _resource_cells(row: dict) -> str:
    if row["status"] not in ("ok", "problem"):
        return f"{row['status']}: {row.get('diagnostic') or row.get('error', '')} | | | | |"
    return (
        f"{row['arch_vgprs']}+{row['agprs']}={row['total_vgprs']} | {row['sgprs']} | {row['lds_bytes']} | "
        f"{row['scratch_bytes']} | {row['waves_per_simd']} ({row['limited_by']}) | {row['compiler_occupancy']}"
    )


def render_markdown(report: dict) -> str:
    rows = report["rows"]
    lines = [
        "# AMD compile gate: INT8 kernels for CDNA targets (compiled on a CPU)",
        "",
        f"Generated by `python -m govinda_patch amd-aot --subset {report['subset']}` with Triton {report['triton']} "
        f"on {report['host']} ({report['workers']} worker(s)): {report['compiles']} compiles, "
        f"{report['compile_cpu_s_total']} s of compile CPU time, {report['wall_s']} s wall. "
        f"Gate: {'PASSED' if report['passed'] else 'FAILED'}. Raw data: `aot_resources.json`.",
        "",
        "VGPRs are arch+AGPR=total (unified file); LDS is Triton's launch-time shared memory; waves are per SIMD "
        "from the model below; the last column is the compiler's own occupancy (registers only, it cannot see "
        "Triton's launch-time LDS).",
        "",
        "Occupancy model: " + " ".join(report["occupancy_model"].split()),
        "",
        "## rocm_gfx9 table entries",
        "",
        "| kernel | D | dtype | GQA | arch | config | VGPR arch+AGPR=total | SGPR | LDS B | scratch B | waves/SIMD (limit) | compiler occ. |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"store": 0, "decode_split": 1, "decode_write": 2, "decode_reduce": 3, "prefill": 4, "gather": 5}

    def sort_key(row):
        return (order.get(row["kernel"], 9), row["head_dim"], row["dtype"], -row["group"], row["arch"], row["config"])

    for row in sorted((r for r in rows if r["source"] == "table" and r["arch"] in GATED_ARCHS), key=sort_key):
        lines.append(
            f"| {row['kernel']} | {row['head_dim']} | {row['dtype']} | {row['group']} | {row['arch']} | "
            f"{row['config']} | {_resource_cells(row)} |"
        )
    candidates = [r for r in rows if r["source"] == "candidate" and r["arch"] in GATED_ARCHS]
    if candidates:
        lines += [
            "",
            "## Self-tuning candidates (bf16, GQA 6; other dtypes/groups in the JSON)",
            "",
            "| kernel | D | arch | config | VGPR arch+AGPR=total | SGPR | LDS B | scratch B | waves/SIMD (limit) | compiler occ. |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sorted((r for r in candidates if r["dtype"] == "bf16" and r["group"] == 6), key=sort_key):
            lines.append(
                f"| {row['kernel']} | {row['head_dim']} | {row['arch']} | {row['config']} | {_resource_cells(row)} |"
            )
    probes = [r for r in rows if r["arch"] not in GATED_ARCHS]
    if probes:
        lines += ["", "## Probed targets (not gated)", ""]
        for arch in sorted({r["arch"] for r in probes}):
            statuses = sorted({r["status"] for r in probes if r["arch"] == arch})
            detail = next((r.get("diagnostic") or r.get("error", "") for r in probes if r["arch"] == arch), "")
            lines.append(f"- {arch}: {', '.join(statuses)}" + (f" ({detail})" if detail else ""))
    if report["failures"]:
        lines += ["", "## Gate failures", ""]
        for row in report["failures"]:
            lines.append(
                f"- {row['arch']} {row['kernel']} D={row['head_dim']} {row['dtype']} GQA {row['group']} {row['config']}: "
                f"{row['status']} {row.get('problems') or row.get('error', '')}"
            )
    timings = [r["compile_cpu_s"] for r in rows if r["status"] in ("ok", "problem")]
    if timings:
        by_kernel = {}
        for row in rows:
            if row["status"] in ("ok", "problem"):
                by_kernel.setdefault(row["kernel"], []).append(row["compile_cpu_s"])
        cells = ", ".join(f"{k} {sum(v) / len(v):.1f} s" for k, v in sorted(by_kernel.items()))
        lines += ["", f"Mean compile CPU time per kernel (parse to linked code object): {cells}."]
    return "\n".join(lines) + "\n"


def write_report(report: dict, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "aot_resources.json", directory / "aot_resources.md"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path


def main(subset: str, workers: int, output: Optional[Path], quiet: bool = False) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("amd-aot needs compiled-mode Triton: unset TRITON_INTERPRET")
        return 2

    def progress(done, total, row):
        if not quiet and (done == total or done % 10 == 0 or row["status"] != "ok"):
            print(f"[{done}/{total}] {row['arch']} {row['kernel']} D={row['head_dim']} {row['dtype']} g{row['group']} "
                  f"{row['config']}: {row['status']}", flush=True)

    # A private, empty Triton cache: every kernel is compiled from scratch (the recorded times
    # are cold compiles) and nothing stale from another Triton build is reused.
    with tempfile.TemporaryDirectory(prefix="govinda-amd-aot-") as cache:
        previous = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            report = run_gate(subset, workers, progress)
        finally:
            if previous is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = previous
    if output is not None:
        json_path, md_path = write_report(report, output)
        print(f"wrote {json_path} and {md_path}")
    print(f"{report['compiles']} compiles, {report['compile_cpu_s_total']} s compile CPU, {report['wall_s']} s wall: "
          f"gate {'passed' if report['passed'] else 'FAILED'}")
    for row in report["failures"]:
        print(f"  FAIL {row['arch']} {row['kernel']} D={row['head_dim']} {row['dtype']} g{row['group']} {row['config']}: "
              f"{row['status']} {row.get('problems') or row.get('error', '')}")
    return 0 if report["passed"] else 1
