"""``python -m govinda_patch <command>``: status | doctor | counters | selftest | tune | amd-aot | capacity | env-doc | patch-doc.

A bad patch table, or any failure in strict mode, is one ``govinda: error: ...`` line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from . import docs
from .config import PatchConfigError
from .excerpt import clip, quote
from .manager import GovindaStrictError
from .settings import REPO_ROOT


def _status(args) -> int:
    from .manager import Overlay

    overlay = Overlay.from_environment()
    if overlay.settings.disabled:
        print("GOVINDA_DISABLE=1: overlay off, every process runs stock vLLM")
        return 0
    print(f"patch table: {quote(overlay.settings.patches_file, 400)}")
    print(" ".join(f"{k}={v or 'missing'}" for k, v in overlay.versions.items()) + f" platform={overlay.platform or 'unknown'}")
    for warning in overlay.warnings:
        print(f"warning: {warning}")
    for error in overlay.errors:
        print(f"error: {error}")
    for entry in overlay.entries.values():
        state = "enabled (applies when its module is imported)" if entry.state == "pending" else entry.state
        print(f"  {entry.spec.name:32s} [{entry.spec.group}] {state}{': ' + entry.reason if entry.reason else ''}")
        for target in entry.active_targets:
            print(f"      -> {target.label}")
    return 1 if overlay.errors else 0


def _doctor(args) -> int:
    import importlib

    from .manager import Overlay
    from .patching import resolve_owner

    overlay = Overlay.from_environment()
    for error in overlay.errors:
        print(f"  ERROR    {error}")
    problems = len(overlay.errors)
    from vllm.platforms import current_platform  # doctor may import vLLM

    from .vllm_platform import describe

    print(f"vLLM platform: {describe(type(current_platform))}; planned platform: {overlay.platform}")
    for group in overlay.table.groups:
        mismatch = overlay.platform_problem(group.name)
        if mismatch:
            problems += 1
            print(f"  ERROR    group {group.name} would stay stock: {clip(mismatch, 1000)}")
    for entry in overlay.entries.values():
        for target in entry.active_targets:
            try:
                module = importlib.import_module(target.module)
                resolve_owner(module, target.attribute)
                print(f"  ok       {entry.spec.name}: {target.label}")
            except Exception as exc:
                problems += 1
                print(f"  MISSING  {entry.spec.name}: {target.label}: {type(exc).__name__}: {clip(exc)}")
    from .guards import run_guard

    checking = replace(overlay.settings, selftest="auto")  # doctor runs the checks GOVINDA_SELFTEST=skip trusts
    for group in overlay.table.groups:
        if group.guard is not None:
            verdict = run_guard(group.guard, checking)
            outcome = "passed" if verdict.ok else "FAILED"
            print(f"  self-test for group {group.name}: {outcome} (guard {group.guard}) {clip(verdict.message, 1000)}")
            problems += 0 if verdict.ok else 1
    return 1 if problems else 0


MAX_IGNORED_SHOWN = 20


def _counters(args) -> int:
    from .int8.counters import read_all

    snapshots, ignored = read_all()
    for line in ignored[:MAX_IGNORED_SHOWN]:
        print(f"warning: {clip(line, 1000)}")
    if len(ignored) > MAX_IGNORED_SHOWN:
        print(f"warning: {len(ignored) - MAX_IGNORED_SHOWN} more files ignored")
    if not snapshots:
        print("no dispatch counters recorded (no process ran Govinda kernels with this GOVINDA_CACHE_DIR)")
        return 1
    for snap in snapshots:
        print(f"pid {snap['pid']}: " + " ".join(f"{quote(k, 80)}={v}" for k, v in sorted(snap["counters"].items())[:64]))
    return 0


def _selftest(args) -> int:
    from .int8.selftest import main_json, run_selftest

    from .settings import KV_ROTATIONS

    rotations = KV_ROTATIONS if args.all_rotations else None
    if args.prefetch:
        from .int8.selftest_prefetch import run_prefetch
        from .settings import current

        launch = json.loads(args.launch_argv) if args.launch_argv else None
        return run_prefetch(current(), 0 if args.device_index is None else args.device_index, launch)
    if args.json:
        return main_json(args.device_index, rotations)
    verdict = run_selftest(args.device_index, rotations)
    print(json.dumps(verdict, indent=2))
    return 0 if verdict.get("ok") else 1


def _tune(args) -> int:
    from .int8.tuner import main_cached, main_json

    if args.cached:
        return main_cached(args.shape, args.device_index)
    return main_json(args.shape, args.device_index, args.budget_s)


def _amd_aot(args) -> int:
    from pathlib import Path

    from .amd_aot import DEFAULT_REPORT_DIR, main

    output = None if args.no_report else Path(args.output or DEFAULT_REPORT_DIR)
    return main(args.subset, args.jobs, output)


def _capacity(args) -> int:
    from .capacity import main as capacity_main

    return capacity_main(args)


def _generated(args, path, render) -> int:
    text = render()
    if args.check:
        current = path.read_text() if path.exists() else ""
        if current != text:
            print(f"{path} is stale: run python -m govinda_patch {args.command}", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m govinda_patch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="print the effective patch plan (does not import vLLM)")
    commands.add_parser("doctor", help="import vLLM, resolve every target, run each group's guard (the kernel self-test)")
    commands.add_parser("counters", help="print the dispatch counters written by vLLM processes")
    selftest = commands.add_parser("selftest", help="run the INT8 kernel self-test in this process")
    selftest.add_argument("--json", action="store_true", help="one JSON line (used by the cached self-test)")
    selftest.add_argument("--device-index", type=int, default=None, help="the GPU to test (default: the current one)")
    selftest.add_argument("--prefetch", action="store_true",
                          help="test the first visible GPU in a child and cache the verdict (started by `vllm serve`)")
    selftest.add_argument("--launch-argv", help="with --prefetch: the server's command line (JSON list), whose "
                          "attention shape is tuned in the background too")
    selftest.add_argument("--all-rotations", action="store_true", help="test every KV rotation, not only GOVINDA_KV_ROTATION's")
    tune = commands.add_parser("tune", help="time the launch-config candidates for one model shape (the tuning child)")
    tune.add_argument("--json", action="store_true", help="tune now, print one JSON line (the tuning child; the default)")
    tune.add_argument("--cached", action="store_true", help="what a server would use: the cached choice, else tune here (no child) and cache")
    tune.add_argument("--shape", required=True, help='JSON: {"head_dim", "num_q_heads", "num_kv_heads", "block_size", "dtype"}')
    tune.add_argument("--device-index", type=int, default=0)
    tune.add_argument("--budget-s", type=float, default=60.0)
    aot = commands.add_parser("amd-aot", help="compile every kernel for gfx90a/gfx942 on the CPU; report registers/LDS/scratch")
    aot.add_argument("--subset", choices=("full", "ci"), default="full")
    aot.add_argument("--jobs", type=int, default=1, help="parallel compile processes")
    aot.add_argument("--output", help="report folder (default reports/amd)")
    aot.add_argument("--no-report", action="store_true", help="only the exit status and summary")
    capacity = commands.add_parser("capacity", help="KV tokens and requests that fit on a card, stock bf16 vs the overlay "
                                   "(reads the model's config; no GPU, no weights)")
    from .capacity import add_arguments as capacity_arguments

    capacity_arguments(capacity)
    for name, help_text in (("env-doc", "write reports/env-vars.md"), ("patch-doc", "write docs/patches.md")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    args = parser.parse_args(argv)
    if args.command == "env-doc":
        return _generated(args, REPO_ROOT / "reports" / "env-vars.md", docs.render_env_doc)
    if args.command == "patch-doc":
        return _generated(args, REPO_ROOT / "docs" / "patches.md", docs.render_patch_doc)
    handler = {
        "status": _status, "doctor": _doctor, "counters": _counters, "selftest": _selftest, "tune": _tune, "amd-aot": _amd_aot,
        "capacity": _capacity,
    }[args.command]
    try:
        return handler(args)
    except (PatchConfigError, GovindaStrictError) as exc:
        print(f"govinda: error: {clip(exc, 1000)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
