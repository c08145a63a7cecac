"""Fixtures and markers for the overlay tests (helpers live in overlay_testing.py: a module name of
our own, since tests/kernels has a conftest too).

Markers are assigned here, from the tables below, not in the test files: ``scripts/test.sh`` runs
every case on its first vLLM line and only the ``vllm`` ones (plus ``gpu_interpreter`` where the
line's Triton differs) on the others, so a case that needs vLLM but is missing here would silently
run on one line only. The ``_vllm_marker_is_honest`` guard fails such a case when it imports vLLM
in this process.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

import interpreter_device_calls
from overlay_testing import child_env, run_child, warm_python

TESTS = Path(__file__).resolve().parent

# vLLM >= 0.26 imports the humming kernels with its model classes, and importing them starts a
# detached interpreter that builds humming's CUDA launcher (torch, then an -O3 C++ compile, then a
# link against libcuda). Every child that resolves a model class started one, and without a CUDA
# driver the link fails, so nothing was ever cached: seconds of CPU per child on a 2-core machine.
# No case runs a humming kernel; children inherit this through the environment.
os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")

# Cases that import vLLM (here or in a child) or whose outcome depends on the installed vLLM,
# transformers or the package metadata of a line: whole modules, then fixtures that imply it.
VLLM_MODULES = {
    "test_overlay_core.py", "test_hardening.py", "test_hardening_fuzz.py", "test_int8_integration.py",
    "test_vllm_lines.py", "test_tensor_parallel.py", "test_scope.py", "test_capacity_calculator.py",
    "test_selected_backend.py",
}
VLLM_FIXTURES = {"dcu_env", "overlay_env"}  # a simulated DCU imports vLLM's ROCm platform
VLLM_CASES = {
    # The kernel benches call the installed vLLM's Triton attention as contenders. (The decode
    # tuning sweep runs only our kernels; it imports vLLM just to record its version.)
    "test_kernel_bench_smoke.py::test_bench_smoke_structure_and_our_outputs",
    "test_kernel_bench_smoke.py::test_fa3_line_smoke_skips_fa3_off_gpu_and_measures_our_error",
    "test_kernel_bench_smoke.py::test_accuracy_smoke_errors_are_finite_and_small",
    # The installed vLLM's own `vllm bench serve` client, against the fake server.
    "test_serve_bench.py::test_serve_tiers_runs_vllm_bench_serve",
    "test_serve_bench.py::test_ab_two_sides_caches_log_counts_sla_and_report",
    "test_serve_bench.py::test_ab_refuses_side_whose_server_env_differs",
    "test_capacity_sweep.py::test_capacity_sweep_end_to_end_and_split_over_calls",
}
# Cases that run our Triton kernels under TRITON_INTERPRET=1 (their result depends on Triton).
INTERPRETER_DIRS = {TESTS / "kernels"}
INTERPRETER_MODULES = {"test_kernel_bench_smoke.py"}
INTERPRETER_CASES = {
    "test_accuracy_int8_kv.py::test_our_kernels_on_a_text_slice",
    "test_int8_integration.py::test_forward_and_kv_update_with_real_vllm_metadata",
    "test_int8_integration.py::test_selftest_passes_with_the_triton_interpreter",
    "test_vllm_lines.py::test_cache_views_laid_out_by_vllm_hold_our_pages",
    "test_kv_rotation_switch.py::test_selftest_checks_the_rotation_in_force_and_all_on_request",
}
# Cases under INTERPRETER_DIRS that launch no Triton kernel (pure-Python tables, argument checks,
# torch references): they do not depend on the line's Triton. ``_interpreter_marker_is_honest``
# fails one of them that launches a kernel in this process.
# (Counted per case on 0.18.1 and 0.33.0: every other case under tests/kernels launches kernels.)
NO_KERNEL_CASES = {
    "test_int8_kv_gather.py::test_gather_rejects_mismatched_outputs",
    "test_int8_paged_attention.py::test_split_policy_fills_the_gpu_and_can_differ_for_batched_steps",
    "test_kv_rotation.py::test_reference_is_the_orthonormal_sylvester_hadamard_matrix",
    "test_kv_rotation.py::test_unknown_rotation_and_odd_head_dim_are_clear_errors",
    "test_tuner.py::test_bad_shape_is_refused",
    "test_tuner.py::test_choice_is_cached_per_shape_and_force_retunes",
    "test_tuner.py::test_failed_tuning_is_not_cached",
    "test_tuner.py::test_a_choice_wrong_at_the_shape_fails_the_self_test_and_the_guard_keeps_vllm_stock",
    "test_tuner.py::test_with_choice_builds_a_new_table_and_changes_the_launch",
    "test_tuner.py::test_worker_lookup_falls_back_to_the_hand_table_without_a_gpu",
}
# Cases that take over ~20 s on a quiet 2-core CI machine (pytest --durations=0 of main on 0.26.0:
# over 40 s on the shared one), or sit behind such a module fixture.
SLOW_CASES = {
    "test_accuracy_int8_kv.py",
    "test_kv_rotation_switch.py::test_selftest_checks_the_rotation_in_force_and_all_on_request",
    "test_kernel_bench_smoke.py",
    "test_tensor_parallel.py",
    "test_int8_integration.py::test_qwen35_alignment_spec_and_unification",
    "test_int8_integration.py::test_selection_resolves_to_our_backend_class",
    "test_int8_integration.py::test_forward_and_kv_update_with_real_vllm_metadata",
    "test_int8_integration.py::test_failed_kernel_selftest_reverts_the_group",
    "test_int8_integration.py::test_selftest_passes_with_the_triton_interpreter",
    "test_kv_rotation_switch.py::test_rotation_changes_the_compile_cache_key",
    "test_hardening.py::test_unwritable_cache_dir_degrades_to_an_uncached_selftest",
    "test_serve_bench.py::test_serve_tiers_runs_vllm_bench_serve",
    "test_serve_bench.py::test_ab_two_sides_caches_log_counts_sla_and_report",
    "test_capacity_sweep.py::test_capacity_sweep_end_to_end_and_split_over_calls",
    # The calculator's cases behind its module fixtures (two fresh vLLM interpreters per model).
    "test_capacity_calculator.py::test_qwen35_pages_padding_and_capacity",
    "test_capacity_calculator.py::test_dense_pages_and_capacity_through_the_cli",
    "test_capacity_calculator.py::test_weights_counted_from_the_config_match_what_vllm_loaded",
    "test_capacity_calculator.py::test_token_counts_match_the_h200_logs",
    "test_capacity_calculator.py::test_the_launch_shape_is_the_tuner_key_the_h200_logged",
    "test_int8_integration.py::test_a_server_launch_tests_the_kernels_in_the_background_before_the_worker_starts",
    "test_decode_l2_prefetch.py::test_sm90_decode_prefetches_only_when_asked_without_spills",
}

# scripts/test.sh sets this on the lines after the first: there every case also counts as slow, as
# those runs repeat the first line's cases, so the inner loop (-m "not slow") runs the first line only.
LATER_LINE = os.environ.get("GOVINDA_TEST_LATER_LINE") == "1"

# Cases whose children must be new interpreters, not forks of the warm one (tests/warm_interpreter.py,
# which holds torch and transformers): they look at what start-up imports or finds on the path.
FRESH_CHILD_CASES = {
    "test_overlay_core.py::test_python_startup_imports_neither_torch_nor_vllm",
    "test_overlay_core.py::test_status_command_prints_plan_without_importing_vllm",
    "test_overlay_core.py::test_hugging_face_kernels_probe_is_not_fooled",
}


def _case(item) -> str:
    return f"{Path(str(item.path)).name}::{getattr(item, 'originalname', None) or item.name}"


def markers_for(item) -> set[str]:
    path = Path(str(item.path)).resolve()
    case = f"{path.name}::{getattr(item, 'originalname', None) or item.name}"
    marks = set()
    if path.name in VLLM_MODULES or case in VLLM_CASES or VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
        marks.add("vllm")
    if (path.parent in INTERPRETER_DIRS and case not in NO_KERNEL_CASES) or path.name in INTERPRETER_MODULES \
            or case in INTERPRETER_CASES:
        marks.add("gpu_interpreter")
    if path.name in SLOW_CASES or case in SLOW_CASES or LATER_LINE:
        marks.add("slow")
    return marks


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in sorted(markers_for(item)):
            item.add_marker(name)


@pytest.fixture(autouse=True)
def _vllm_marker_is_honest(request):
    before = "vllm" in sys.modules
    yield
    if not before and "vllm" in sys.modules and request.node.get_closest_marker("vllm") is None:
        pytest.fail(f"{request.node.nodeid} imports vLLM but is not marked vllm: add it to tests/conftest.py's tables")


class _KernelLaunches:
    """Counts Triton interpreter launches in this process (``InterpretedFunction.run``) once
    Triton's interpreter is imported; a case not marked gpu_interpreter must launch none."""

    count = 0
    wrapped = False

    @classmethod
    def now(cls) -> int:
        interpreter = sys.modules.get("triton.runtime.interpreter")
        if interpreter is not None and not cls.wrapped:
            original = interpreter.InterpretedFunction.run

            def run(self, *args, **kwargs):
                cls.count += 1
                return original(self, *args, **kwargs)

            interpreter.InterpretedFunction.run = run
            cls.wrapped = True
        return cls.count


@pytest.fixture(autouse=True)
def _interpreter_marker_is_honest(request):
    before = _KernelLaunches.now()
    yield
    if _KernelLaunches.now() != before and request.node.get_closest_marker("gpu_interpreter") is None:
        pytest.fail(f"{request.node.nodeid} launches Triton kernels but is not marked gpu_interpreter: "
                    "take it out of NO_KERNEL_CASES (tests/conftest.py)")


@pytest.fixture(autouse=True)
def _interpreter_device_calls_share_the_launch_patch():
    """tests/interpreter_device_calls.py, once this process runs Triton's interpreter (it must not
    import triton.language before TRITON_INTERPRET is set: triton.jit reads it at decoration)."""
    if os.environ.get("TRITON_INTERPRET") == "1" and "triton.language" in sys.modules:
        interpreter_device_calls.install()
    yield


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("govinda-cache")


@pytest.fixture
def base_env(cache_dir) -> dict:
    """Environment for a child: the repo on PYTHONPATH, no inherited GOVINDA_* switches."""
    return child_env(cache_dir)


@pytest.fixture
def dcu_env(cache_dir) -> dict:
    """A simulated Hygon DCU: vLLM's ROCm platform activates; kernels are trusted (CPU only)."""
    return child_env(cache_dir, dcu=True)


@pytest.fixture
def overlay_env(cache_dir) -> dict:
    """Switches for ``govinda_patch.scope.overlay_scope`` in this process: none but the cache."""
    return {"GOVINDA_CACHE_DIR": str(cache_dir)}


@pytest.fixture
def child(request):
    """``run_child``; a fresh interpreter for the cases in FRESH_CHILD_CASES."""
    return functools.partial(run_child, fresh=_case(request.node) in FRESH_CHILD_CASES)


@pytest.fixture
def warm_bench_clients(monkeypatch):
    """``vllm bench serve`` clients of bench/serve_tiers.py (a process per run, or the session's one)
    start through the warm interpreter's launcher instead of this interpreter: each still imports
    the installed vLLM's CLI itself, but not torch and transformers again (~8 s a client)."""
    from bench import serve_tiers

    launcher = warm_python(serve_tiers.client_env())
    if launcher is None:
        return
    command, new_session = serve_tiers.bench_serve_command, serve_tiers.new_session

    def warm_command(*args, **kwargs):
        words = command(*args, **kwargs)
        return [launcher if words[0] == sys.executable else words[0]] + words[1:]

    def warm_session(*args, **kwargs):
        session = new_session(*args, **kwargs)
        if session.command[0] == sys.executable:
            session.command[0] = launcher
        return session

    monkeypatch.setattr(serve_tiers, "bench_serve_command", warm_command)
    monkeypatch.setattr(serve_tiers, "new_session", warm_session)
