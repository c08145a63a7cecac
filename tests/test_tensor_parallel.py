"""Tensor parallel against the real vLLM on the simulated DCU: what one rank sizes and who gets the
overlay.

One child builds vLLM's engine config at several ``tensor_parallel_size`` values and, for each, the
INT8 KV spec, page size and hybrid alignment one rank computes from its share of heads (vLLM's own
``get_num_attention_heads`` / ``get_num_kv_heads`` of the ParallelConfig), vLLM's page unification
and our metadata builder. It then starts two workers exactly as vLLM's multiprocess executor does
(``WorkerProc.make_worker_process``, vLLM's mp context, spawn as ``vllm serve`` sets it): each
worker is a fresh interpreter that must log its own overlay status line before it fails at device
initialisation (no GPU here).
"""

from __future__ import annotations


import pytest

from overlay_testing import REPO, child_env, run_child

from bench import ab, ab_side
from rank_layers import RANK_LAYERS

TP_SIZES = (1, 2, 4)

RANKS = RANK_LAYERS + f"""
import logging
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec
from govinda_patch.int8.backend import GovindaInt8MetadataBuilder

records = []
logging.getLogger("govinda").addHandler(type("Grab", (logging.Handler,), {{"emit": lambda self, r: records.append(r)}})())

def one_rank(name, tp):
    first_record = len(records)
    cfg, layer, spec, layers, groups = rank_layers(name, tensor_parallel_size=tp)
    mc, pc, cache = cfg.model_config, cfg.parallel_config, cfg.cache_config
    (unified,) = {{g.kv_cache_spec for g in groups if isinstance(g.kv_cache_spec, FullAttentionSpec)}}
    builder = GovindaInt8MetadataBuilder(unified, list(layers)[:1], cfg, torch.device("cpu"))
    return cfg, {{
        "tp": pc.tensor_parallel_size, "q": mc.get_num_attention_heads(pc), "kv": mc.get_num_kv_heads(pc),
        "head": mc.get_head_size(),
        "impl": type(layer.impl).__name__, "spec_dtype": str(spec.dtype), "spec_block": spec.block_size,
        "spec_page": spec.page_size_bytes, "mamba_page_padded": cache.mamba_page_size_padded,
        "unified_block": unified.block_size, "unified_pages": sorted({{g.kv_cache_spec.page_size_bytes for g in groups}}),
        "workspace_q_heads": builder.workspace.num_q_heads,
        "launch": [r.getMessage() for r in records if "launch configs for" in r.getMessage()][-1],
    }}, records[first_record:]

ranks, configs = [], {{}}
for name in models:
    for tp in {TP_SIZES!r}:
        cfg, result, rank_records = one_rank(name, tp)
        ranks.append(dict(result, model=name))
        configs[(name, tp)] = cfg
        if (name, tp) == ("qwen35", 2):
            # What each TP=2 rank's stderr shows: our lines, with vLLM's per-worker log prefix.
            # vLLM >= 0.33 tags only its own log records, not the streams: no prefix to check.
            import io
            import vllm.utils.system_utils as system_utils
            ours = next(h for h in logging.getLogger("govinda").handlers if getattr(h, "_govinda", False))
            worker_log = io.StringIO() if hasattr(system_utils, "_add_prefix") else None
            for tp_rank in range(2 if worker_log else 0):
                system_utils._add_prefix(worker_log, f"Worker_TP{{tp_rank}}", os.getpid())
                for record in rank_records:
                    worker_log.write(ours.format(record) + chr(10))

# Two workers of the TP=2 Qwen3.5 engine, started by vLLM's own executor code.
from vllm.utils.network_utils import get_distributed_init_method, get_open_port
from vllm.utils.system_utils import get_mp_context
from vllm.v1.executor.multiproc_executor import WorkerProc
cfg = configs[("qwen35", 2)]
lock = get_mp_context().Lock()
init = get_distributed_init_method("127.0.0.1", get_open_port())
handles = [WorkerProc.make_worker_process(cfg, rank, rank, init, None, lock, rank == 0) for rank in range(2)]
try:
    WorkerProc.wait_for_ready(handles)
    ready = True
except Exception:
    ready = False
for handle in handles:
    handle.proc.join(120)
report({{"ranks": ranks, "parent_pid": os.getpid(), "worker_pids": [h.proc.pid for h in handles],
        "worker_exitcodes": [h.proc.exitcode for h in handles], "workers_ready": ready,
        "start_method": get_mp_context().get_start_method(), "tp2_worker_log": worker_log and worker_log.getvalue()}})
"""


@pytest.fixture(scope="module")
def tp_run(cache_dir):
    # vllm serve sets spawn for its workers (cli_env_setup); the workers then start from scratch.
    env = dict(child_env(cache_dir, dcu=True), VLLM_WORKER_MULTIPROC_METHOD="spawn")
    result = run_child(RANKS, env, timeout=600)
    assert result.returncode == 0, result
    return result


def _rank(tp_run, model: str, tp: int) -> dict:
    (rank,) = [r for r in tp_run.result["ranks"] if r["model"] == model and r["tp"] == tp]
    return rank


@pytest.mark.parametrize("model,q,kv,head", [("qwen35", 24, 4, 256), ("dense", 32, 8, 128)])
@pytest.mark.parametrize("tp", TP_SIZES)
def test_a_rank_sizes_int8_pages_from_its_share_of_heads(tp_run, model, q, kv, head, tp):
    rank = _rank(tp_run, model, tp)
    assert (rank["q"], rank["kv"], rank["head"]) == (q // tp, kv // tp, head)
    assert rank["impl"] == "GovindaInt8AttentionImpl" and rank["spec_dtype"] == "torch.int8"
    token_bytes = 2 * rank["kv"] * (head + 4)  # INT8 K and V plus one fp32 scale each, per rank head
    assert rank["spec_page"] == rank["spec_block"] * token_bytes
    assert rank["unified_pages"] == [rank["unified_block"] * token_bytes]
    # The builder sizes its split-KV workspace and tuning shape for the rank's query heads.
    assert rank["workspace_q_heads"] == q // tp
    assert f"-q{q // tp}-kv{kv // tp}-b{rank['unified_block']}-" in rank["launch"], rank["launch"]


@pytest.mark.parametrize("tp", TP_SIZES[1:])
def test_hybrid_alignment_holds_for_a_ranks_pages(tp_run, tp):
    rank, single = _rank(tp_run, "qwen35", tp), _rank(tp_run, "qwen35", 1)
    token_bytes = 2 * rank["kv"] * (rank["head"] + 4)
    # The mamba page of the rank (its share of the linear-attention state) is padded to a whole
    # number of INT8 attention tokens, and every group's page is unified to it.
    assert rank["mamba_page_padded"] is None or rank["mamba_page_padded"] == rank["unified_block"] * token_bytes
    assert rank["unified_block"] % 16 == 0
    # Attention and mamba state both shrink with the rank's share, so the block holds as many
    # tokens as on one GPU while the page is 1/tp of it.
    assert rank["unified_block"] == single["unified_block"]
    assert rank["unified_pages"][0] * tp == single["unified_pages"][0]


def test_dense_pages_per_rank_keep_the_int8_saving(tp_run):
    for tp in TP_SIZES:
        rank = _rank(tp_run, "dense", tp)
        stock_token_bytes = 2 * rank["kv"] * rank["head"] * 2  # bf16 K and V
        int8_token_bytes = rank["spec_page"] // rank["spec_block"]
        assert int8_token_bytes * 2 * rank["head"] == stock_token_bytes * (rank["head"] + 4)


def test_workers_started_like_vllm_each_log_the_overlay_status(tp_run):
    r = tp_run.result
    assert r["start_method"] == "spawn"
    # No GPU here: each worker stops at device initialisation, after its interpreter started.
    assert r["workers_ready"] is False and None not in r["worker_exitcodes"], r
    lines = tp_run.govinda_lines()
    assert not [line for line in tp_run.stderr.splitlines() if line.startswith("govinda: ERROR")], lines
    for pid in [r["parent_pid"], *r["worker_pids"]]:
        status = [line for line in lines if f"[pid {pid}] status:" in line]
        assert len(status) == 1, (pid, lines)
        assert "int8_backend_registration=applied" in status[0] and "platform=rocm" in status[0], status
    assert len(set(r["worker_pids"]) | {r["parent_pid"]}) == 3


def test_tp2_sides_file_counts_both_ranks(tp_run, tmp_path):
    """scripts/h200/ab_qwen35_64layer_tp2.yaml: every side at TP=2, and its per-rank patterns
    match the lines our builder logs for a TP=2 rank, as vLLM prefixes a worker's output."""
    path = REPO / "scripts" / "h200" / "ab_qwen35_64layer_tp2.yaml"
    config = ab.parse_config(["--sides", str(path)])
    assert [s.name for s in config.sides] == ["triton_bf16", "govinda", "fa3_bf16"] and config.baseline_name() == "triton_bf16"
    assert config.bench["input_lens"] == [6144, 12288, 24576]
    for side in config.sides:
        args = config.server_args + side.server_args
        assert args[args.index("--tensor-parallel-size") + 1] == "2"
    govinda = config.sides[1]
    (status,) = [p for p in govinda.log_patterns if p.name == "govinda_status"]
    assert status.min == 4  # API server, engine core, two workers
    if tp_run.result["tp2_worker_log"] is None:
        pytest.skip("this vLLM does not prefix worker output (the sides file is for the H200's 0.26)")
    log = tmp_path / "workers.log"
    log.write_text(tp_run.result["tp2_worker_log"])
    counts = ab_side.count_log_patterns(log, [p for p in govinda.log_patterns if p.name.startswith("rank")])
    assert len(counts) == 4 and all(c["ok"] for c in counts.values()), counts
    # A rank's lines never count for the other rank.
    log.write_text("".join(l for l in tp_run.result["tp2_worker_log"].splitlines(True) if "Worker_TP0" in l))
    counts = ab_side.count_log_patterns(log, [p for p in govinda.log_patterns if p.name.startswith("rank1")])
    assert not any(c["ok"] for c in counts.values()), counts
