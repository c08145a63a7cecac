"""bench/startup_phases.py on log lines as vLLM 0.18.1 / 0.26 / 0.33 and the overlay write them
(copied from the committed H200 logs under reports/h200/, or built from vLLM's format strings)."""

from __future__ import annotations

from pathlib import Path

from bench import startup_phases

REPO_ROOT = Path(__file__).resolve().parent.parent
H200 = REPO_ROOT / "reports" / "h200"
OURS = startup_phases.our_kernel_names()

# Verbatim from reports/h200/decode_line/dense128_30k_govinda.server.log (vLLM 0.26, overlay on; the
# self-test line cut where the log's summary goes on).
DENSE_COLD = """\
(EngineCore pid=769) govinda INFO [pid 769] kernel self-test passed on NVIDIA H200 ({'none': {'store_exact': True, 'attention_max_error': 0.004328370094299316}})
(EngineCore pid=769) INFO 12-02 04:55:01 [model_runner.py:305] Model loading took 13.13 GiB and 25.771976 seconds
(EngineCore pid=769) INFO 12-02 04:55:08 [backends.py:1155] Dynamo bytecode transform time: 6.68 s
(EngineCore pid=769) INFO 12-02 04:55:19 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 10.20 s
(EngineCore pid=769) INFO 12-02 04:55:24 [monitor.py:53] torch.compile took 22.37 s in total
(EngineCore pid=769) INFO 12-02 04:55:25 [monitor.py:81] Initial profiling/warmup run took 0.59 s
(EngineCore pid=769) govinda INFO [pid 769] tune: tuning launch configs for d128-q32-kv8-b16-bf16 on NVIDIA H200|NVIDIA H200|cc9.0|132cu (budget 60 s)
govinda INFO [pid 1028] tune: chose decode m16n64w4s1ds128r128 pps 4/8, prefill m128n64w8s3 (21/21 candidates usable, 24.8 s)
(EngineCore pid=769) govinda INFO [pid 769] INT8 attention launch configs for d128-q32-kv8-b16-bf16: tuned (tuned in 24.8 s) decode m16n64w4s1ds128r128 pps 4/8, prefill m128n64w8s3; 21/21 candidates usable, 24.8 s
(EngineCore pid=769) INFO 12-02 04:56:09 [model_runner.py:747] Graph capturing finished in 11 secs, took 0.53 GiB
(EngineCore pid=769) INFO 12-02 04:56:27 [jit_monitor.py:79] Kernel JIT monitor activated; monitored JIT compilations during inference will use mode=warn.
(EngineCore pid=769) INFO 12-02 04:56:27 [core.py:340] init engine (profile, create kv cache, warmup model) took 85.71 s (compilation: 22.37 s)
(APIServer pid=638) govinda INFO [pid 638] kernel self-test passed on NVIDIA H200 ({'none': {'store_exact': True}})
"""
# Verbatim from reports/h200/serve64_bench_serve_govinda.log.
JIT_LINES = """\
(EngineCore pid=729) WARNING 12-01 13:37:57 [jit_monitor.py:135] Triton kernel JIT compilation during inference: _compute_slot_mapping_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.
(EngineCore pid=729) WARNING 12-01 13:37:57 [jit_monitor.py:135] Triton kernel JIT compilation during inference: _gather_kv_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.
"""
# vLLM 0.26's warm-start lines (vllm/compilation/backends.py, decorators.py: their format strings),
# the 0.33 tag before them, and the 0.18.1 init-engine line.
WARM_033 = """\
(EngineCore pid=90) INFO 12-03 10:00:01 [gpu_model_runner.py:5089] Model loading took 13.13 GiB memory and 2.402183 seconds
(EngineCore pid=90) INFO 12-03 10:00:02 [decorators.py:327] [backbone] Directly load AOT compilation from path /c/torch_compile_cache/torch_aot_compile/ab/rank_0_0/model
(EngineCore pid=90) INFO 12-03 10:00:03 [backends.py:311] [backbone] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.512 s
(EngineCore pid=90) INFO 12-03 10:00:03 [monitor.py:53] [backbone] torch.compile took 3.10 s in total
(EngineCore pid=90) govinda INFO [pid 90] INT8 attention launch configs for d128-q32-kv8-b16-bf16: tuned (cached) decode m16n64w4s1ds128r128 pps 4/8, prefill m128n64w8s3; 21/21 candidates usable, 24.8 s
(EngineCore pid=90) INFO 12-03 10:00:09 [gpu_model_runner.py:6517] Graph capturing finished in 5 secs, took 0.53 GiB
(EngineCore pid=90) INFO 12-03 10:00:10 [core.py:413] init engine (profile, create kv cache, warmup model) took 20.05 s (compilation: 3.10 s)
"""
INIT_018 = "(EngineCore_DP0 pid=12) INFO 12-03 10:00:10 [core.py:282] init engine (profile, create kv cache, warmup model) took 64.31 seconds\n"


def test_cold_start_phases_and_the_overlays_lines():
    parsed = startup_phases.parse_log(DENSE_COLD, OURS)
    assert parsed["phases"] == {
        "weights_load_s": None, "model_load_s": 25.771976, "dynamo_transform_s": 6.68, "graph_compile_s": 10.2,
        "graph_cache_load_s": None, "torch_compile_s": 22.37, "profile_warmup_s": 0.59, "cuda_graph_capture_s": 11.0,
        "init_engine_s": 85.71, "overlay_tune_s": 24.8, "overlay_selftest_background_s": None, "overlay_selftest_wait_s": None,
        "overlay_tune_background_s": None,
    }
    assert parsed["overlay"] == {"selftest": "passed", "selftest_lines": 2,
                                 "launch_configs": {"d128-q32-kv8-b16-bf16": {"origin": "tuned", "tuned_s": 24.8}}}
    assert parsed["compile_cache"] == {"aot_loads": 0, "graph_loads": 0, "graph_compiles": 1}
    # The monitor's activation line speaks of "JIT compilations during inference" but is none.
    assert parsed["jit"] == {"count": 0, "ours": 0, "kernels": [], "events": []}


def test_warm_start_lines_of_033_and_the_init_line_of_018():
    parsed = startup_phases.parse_log(WARM_033, OURS)
    phases = parsed["phases"]
    assert phases["graph_cache_load_s"] == 0.512 and phases["torch_compile_s"] == 3.1
    assert phases["model_load_s"] == 2.402183 and phases["cuda_graph_capture_s"] == 5.0 and phases["init_engine_s"] == 20.05
    assert phases["graph_compile_s"] is None and phases["overlay_tune_s"] is None  # cached: no tuning
    assert parsed["overlay"]["launch_configs"] == {"d128-q32-kv8-b16-bf16": {"origin": "cached", "tuned_s": None}}
    assert parsed["overlay"]["selftest"] is None
    assert parsed["compile_cache"] == {"aot_loads": 1, "graph_loads": 1, "graph_compiles": 0}
    assert startup_phases.parse_log(INIT_018, OURS)["phases"]["init_engine_s"] == 64.31
    loading = "(EngineCore pid=5) INFO 12-03 10:00:01 [default_loader.py:431] Loading weights took 12.34 seconds\n"
    assert startup_phases.parse_log(loading, OURS)["phases"]["weights_load_s"] == 12.34


def test_jit_lines_name_their_kernel_and_ours_are_told_apart():
    assert {"_gather_kv_kernel", "decode_split_kernel", "prefill_attention_kernel"} <= OURS
    verbose = ("(EngineCore pid=729) WARNING 12-01 13:37:58 [jit_monitor.py:136] Triton kernel JIT compilation during "
               "inference: decode_split_kernel (constexprs={BLOCK_N=64}; signature={q: '*bf16'}; key='x'). This causes a "
               "latency spike; consider extending warmup to cover this shape/config.")
    other = ("(EngineCore pid=729) WARNING 12-01 13:37:59 [jit_monitor.py:135] CuTeDSL JIT compilation during inference: "
             "fmha_fwd. This causes a latency spike; consider extending warmup to cover this shape/config.")
    parsed = startup_phases.parse_log(JIT_LINES + verbose + "\n" + other + "\n", OURS)
    jit = parsed["jit"]
    assert jit["count"] == 4 and jit["ours"] == 2
    assert jit["kernels"] == ["_compute_slot_mapping_kernel", "_gather_kv_kernel", "decode_split_kernel", "fmha_fwd"]
    first, second, third, fourth = jit["events"]
    assert (first["backend"], first["event"], first["kernel"], first["ours"], first["process"]) == (
        "Triton", "kernel JIT compilation", "_compute_slot_mapping_kernel", False, "729")
    assert second["ours"] and third["ours"] and third["kernel"] == "decode_split_kernel"
    assert (fourth["backend"], fourth["event"], fourth["kernel"]) == ("CuTeDSL", "JIT compilation", "fmha_fwd")
    # Some other wording is still counted, with whatever follows the colon as its name.
    odd = startup_phases.jit_event("WARNING something during inference: weird_kernel", OURS)
    assert odd["kernel"] == "weird_kernel" and odd["backend"] == "WARNING"
    assert startup_phases.jit_event("JIT compilation during inference", OURS)["kernel"] is None


def test_processes_and_compile_ranges_combine():
    lines = "\n".join([
        # Two tensor-parallel workers: the slower one counts.
        "(Worker_TP0 pid=11) INFO 12-03 10:00:01 [gpu_model_runner.py:5348] Model loading took 6.60 GiB memory and 10.5 seconds",
        "(Worker_TP1 pid=12) INFO 12-03 10:00:01 [gpu_model_runner.py:5348] Model loading took 6.60 GiB memory and 12.25 seconds",
        # Two compile ranges in one process add up; the other worker's total is smaller.
        "(Worker_TP0 pid=11) INFO 12-03 10:00:05 [backends.py:393] Compiling a graph for compile range (1, 512) takes 4.00 s",
        "(Worker_TP0 pid=11) INFO 12-03 10:00:09 [backends.py:393] Compiling a graph for compile range (513, 8192) takes 5.50 s",
        "(Worker_TP1 pid=12) INFO 12-03 10:00:09 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 7.00 s",
    ])
    parsed = startup_phases.parse_log(lines, OURS)
    assert parsed["phases"]["model_load_s"] == 12.25 and parsed["phases"]["graph_compile_s"] == 9.5
    assert parsed["phase_lines"]["graph_compile_s"] == 3


def test_missing_and_mangled_phases_read_none():
    mangled = "\n".join([
        "Model loading took 13.13 GiB and 1.2.3 seconds",
        "torch.compile took  s in total",
        "Graph capturing finished in NaN secs, took 0.53 GiB",
        "init engine (profile, create kv cache, warmup model) took",
        "govinda INFO [pid 7] INT8 attention launch configs for d128: something new",
        "\x00\x1b[2J" * 50,
    ])
    for text in ("", mangled):
        parsed = startup_phases.parse_log(text, OURS)
        assert set(parsed["phases"].values()) == {None}
        assert parsed["overlay"] == {"selftest": None, "selftest_lines": 0, "launch_configs": {}}
        assert parsed["jit"]["count"] == 0
    failed = ("(EngineCore pid=968) govinda ERROR [pid 968] group int8_kv reverted to stock vLLM: kernel self-test failed: "
              "store_exact=False attention max_error=0.00433 (tolerance 0.02)\n")
    assert startup_phases.parse_log(failed, OURS)["overlay"]["selftest"] == "failed"
    assert startup_phases.read_log(Path("/nonexistent/server.log"))["phases"]["init_engine_s"] is None


def test_committed_h200_logs():
    """Whole server logs of the H200 (vLLM 0.26): the overlay's first start of the 64-layer shape,
    and stock FA3 on the dense shape."""
    overlay = startup_phases.read_log(H200 / "serve64_bench_serve_govinda.log")
    assert overlay["phases"]["model_load_s"] == 26.354749 and overlay["phases"]["torch_compile_s"] == 44.9
    assert overlay["phases"]["cuda_graph_capture_s"] == 15.0 and overlay["phases"]["init_engine_s"] == 191.28
    assert overlay["phases"]["overlay_tune_s"] == 13.3 and overlay["overlay"]["selftest"] == "passed"
    assert overlay["jit"]["count"] == 2 and overlay["jit"]["ours"] == 1  # _gather_kv_kernel compiled on first use
    stock = startup_phases.read_log(H200 / "dense128_bench_serve_fa3_bf16.log")
    assert stock["phases"]["init_engine_s"] == 52.4 and stock["phases"]["overlay_tune_s"] is None
    assert stock["overlay"]["selftest_lines"] == 0 and stock["jit"]["count"] == 0


def test_the_background_self_test_and_the_wait_for_it_are_phases():
    log = "\n".join([
        "govinda INFO [pid 11] kernel self-test started in the background (pid 12), beside vLLM's start-up",
        "govinda INFO [pid 12] kernel self-test (background) passed on NVIDIA H200 in 14.2 s",
        "(EngineCore pid=13) govinda INFO [pid 13] kernel self-test passed on NVIDIA H200 ({'none': {}}); "
        "waited 3.1 s for the background self-test",
    ])
    parsed = startup_phases.parse_log(log, frozenset())
    assert parsed["phases"]["overlay_selftest_background_s"] == 14.2
    assert parsed["phases"]["overlay_selftest_wait_s"] == 3.1
    assert parsed["overlay"]["selftest"] == "passed" and parsed["overlay"]["selftest_lines"] == 1


def test_the_background_tuning_and_the_engine_wait_before_its_gpu_are_phases():
    log = "\n".join([
        "govinda INFO [pid 12] kernel self-test (background) passed on NVIDIA H200 in 14.2 s",
        "govinda INFO [pid 12] launch configs in the background, 12.9 s: d128-q32-kv8-b16-bf16: tuned (tuned in 11.0 s) "
        "decode m16n64w4s1ds128r128 pps 4/4",
        "(EngineCore pid=13) govinda INFO [pid 13] waited 2.5 s for the background self-test and tuning before the GPU's "
        "initialisation",
        "(EngineCore pid=13) govinda INFO [pid 13] INT8 attention launch configs for d128-q32-kv8-b16-bf16: tuned (cached) "
        "decode m16n64w4s1ds128r128 pps 4/4",
    ])
    parsed = startup_phases.parse_log(log, frozenset())
    assert parsed["phases"]["overlay_tune_background_s"] == 12.9
    assert parsed["phases"]["overlay_selftest_wait_s"] == 2.5
    assert parsed["phases"]["overlay_tune_s"] is None  # the engine read the cached choice
