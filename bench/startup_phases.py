"""Start-up phases read from a vLLM server's log: what each phase took, the overlay's self-test and
tuning, and every JIT compilation vLLM's monitor saw during inference.

Lines read (vLLM 0.18.1 / 0.26 / 0.33; 0.33 may put a tag such as ``[backbone] `` before some):
  ``Loading weights took 12.34 seconds``
  ``Model loading took 13.13 GiB and 25.771976 seconds``             (0.26: ``GiB memory and``)
  ``Dynamo bytecode transform time: 6.68 s``
  ``Compiling a graph for compile range (1, 8192) takes 10.20 s``     (cold: one per range)
  ``Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.512 s``   (warm)
  ``Directly load AOT compilation from path ...``                    (warm, counted)
  ``torch.compile took 22.37 s in total``                            (older lines: ``takes``)
  ``Initial profiling/warmup run took 0.59 s``
  ``Graph capturing finished in 11 secs, took 0.53 GiB``
  ``init engine (profile, create kv cache, warmup model) took 85.71 s (compilation: 22.37 s)``
                                                                     (0.18: ``took 85.71 seconds``)
and the overlay's (govinda_patch/int8/guard.py, tuner.py):
  ``kernel self-test passed on NVIDIA H200 (...)`` / ``group int8_kv reverted to stock vLLM: kernel
  self-test failed: ...``                                            (no duration logged)
  ``kernel self-test (background) passed on NVIDIA H200 in 14.2 s``  (GOVINDA_SELFTEST=auto, a server launch)
  ``...; waited 3.1 s for the background self-test``                 (the engine's guard, when it waited)
  ``waited 3.1 s for the background self-test and tuning before ...`` (the engine, before its worker's GPU)
  ``launch configs in the background, 12.9 s: d128-...: tuned (...)`` (the same background process, after the test)
  ``tune: chose ... (21/21 candidates usable, 24.8 s)``               (the tuning child)
  ``INT8 attention launch configs for SHAPE: tuned (tuned in 24.8 s) ...`` / ``tuned (cached) ...`` / ``hand table ...``
and vLLM's JIT monitor (vllm/utils/jit_monitor.py, 0.26 and later):
  ``Triton kernel JIT compilation during inference: _gather_kv_kernel. This causes a latency spike; ...``

Every line is matched on its own and a number that does not parse skips its line, so a missing or
mangled phase reads None, never an error. Several processes (API server, engine core, tensor-
parallel workers, told apart by ``pid=N`` / ``[pid N]``) may log one phase each: the slowest
counts, since start-up waits for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Pattern

REPO_ROOT = Path(__file__).resolve().parent.parent
LINE_CHARS = 300  # a kept line is cut to this; vLLM's config line alone is ~5,000 characters
_NUMBER = r"(?P<s>\d+(?:\.\d+)?)"
_PID = re.compile(r"\bpid[= ](\d+)")


@dataclass(frozen=True)
class Phase:
    name: str
    regex: Pattern
    # How several lines of one process combine: "sum" where vLLM logs one line per compile range.
    within: str = "max"


PHASES = (
    Phase("weights_load_s", re.compile(r"Loading weights took " + _NUMBER + r" ?s")),
    Phase("model_load_s", re.compile(r"Model loading took [\d.]+ GiB (?:memory )?and " + _NUMBER + r" ?s")),
    Phase("dynamo_transform_s", re.compile(r"Dynamo bytecode transform time: " + _NUMBER + r" ?s")),
    Phase("graph_compile_s", re.compile(r"Compiling a graph for compile range .*? takes " + _NUMBER + r" ?s"), within="sum"),
    Phase("graph_cache_load_s", re.compile(r"Directly load the compiled graph\(s\) for compile range .*? from the cache, took "
                                           + _NUMBER + r" ?s"), within="sum"),
    Phase("torch_compile_s", re.compile(r"(?:torch\.compile (?:took|takes) " + _NUMBER + r" ?s in total"
                                        r"|Compilation finished in (?P<s2>\d+(?:\.\d+)?) ?s)")),
    Phase("profile_warmup_s", re.compile(r"Initial profiling/warmup run took " + _NUMBER + r" ?s")),
    Phase("cuda_graph_capture_s", re.compile(r"Graph capturing finished in " + _NUMBER + r" ?secs?")),
    Phase("init_engine_s", re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUMBER + r" ?s")),
    # The overlay's tuning child: its total (the candidates timed, their compiles included).
    Phase("overlay_tune_s", re.compile(r"govinda \w+ \[pid \d+\] tune: chose .*[(,] " + _NUMBER + r" s(?:,|\))")),
    # GOVINDA_SELFTEST=auto: the self-test started beside vLLM's start-up, and what the engine waited for it.
    Phase("overlay_selftest_background_s", re.compile(r"govinda \w+ \[pid \d+\] kernel self-test \(background\) \w+ on .* in "
                                                      + _NUMBER + r" s")),
    Phase("overlay_selftest_wait_s", re.compile(r"waited " + _NUMBER + r" s for the background self-test")),
    # ... and the launch's attention shape tuned after it, in the same background process.
    Phase("overlay_tune_background_s", re.compile(r"govinda \w+ \[pid \d+\] launch configs in the background, " + _NUMBER + r" s:")),
)
PHASE_NAMES = tuple(phase.name for phase in PHASES)

AOT_LOAD = re.compile(r"Directly load AOT compilation from path")
SELFTEST = re.compile(r"govinda \w+ \[pid \d+\] (?:.*: )?kernel self-test (?P<verdict>passed|failed)")
LAUNCH_CONFIGS = re.compile(
    r"INT8 attention launch configs for (?P<shape>\S+): (?:tuned \((?:tuned in " + _NUMBER + r" s|(?P<cached>cached))\)|(?P<hand>hand table))"
)
JIT_LINE = re.compile(r"(?P<backend>\w+) (?P<event>[\w ]+?) during inference: (?P<rest>.*)")
JIT_LOOSE = re.compile(r"JIT compilation during inference|during inference: ")
JIT_TAIL = ". This causes a latency spike"
# Triton's @triton.jit functions of kernels/: a JIT line naming one of them is the overlay's.
_JIT_DEF = re.compile(r"^@triton\.jit\b[^\n]*\n(?:@[^\n]*\n)*def\s+(\w+)", re.MULTILINE)


def our_kernel_names(kernels_dir: Optional[Path] = None) -> FrozenSet[str]:
    """The names of the overlay's Triton kernels (read from the sources, without importing Triton)."""
    names = set()
    for path in sorted(Path(kernels_dir or REPO_ROOT / "kernels").glob("*.py")):
        try:
            names.update(_JIT_DEF.findall(path.read_text(encoding="utf-8", errors="replace")))
        except OSError:
            continue
    return frozenset(names)


def _process(line: str) -> str:
    match = _PID.search(line)
    return match.group(1) if match else ""


def _seconds(match) -> Optional[float]:
    text = match.groupdict().get("s") or match.groupdict().get("s2")
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def jit_event(line: str, ours: FrozenSet[str]) -> Optional[Dict[str, Any]]:
    """One JIT-during-inference line as {backend, event, kernel, ours, process, line}; None otherwise.
    The monitor's "activated; monitored JIT compilations during inference will use ..." is not one."""
    if not JIT_LOOSE.search(line) or "monitor activated" in line:
        return None
    match = JIT_LINE.search(line)
    if match:
        backend, event, rest = match.group("backend"), match.group("event"), match.group("rest")
    else:  # some other wording: keep the line, name what follows the colon if anything
        backend, event = None, None
        rest = line.split("during inference:", 1)[1] if "during inference:" in line else ""
    # The kernel name ends at the monitor's tail, or at the verbose detail " (constexprs=...)".
    kernel = rest.split(JIT_TAIL, 1)[0].split(" (", 1)[0].strip().rstrip(".") or None
    return {"backend": backend, "event": event, "kernel": kernel, "ours": kernel in ours,
            "process": _process(line), "line": line[:LINE_CHARS]}


def parse_log(text: str, ours: Optional[FrozenSet[str]] = None) -> Dict[str, Any]:
    """What a server log says about its start-up (see the module docstring).

    Returns {"phases": {name: seconds or None}, "phase_lines": {name: count}, "overlay": {...},
    "compile_cache": {"aot_loads", "graph_loads", "graph_compiles"}, "jit": {"count", "ours",
    "kernels", "events"}}.
    """
    ours = our_kernel_names() if ours is None else ours
    per_process: Dict[str, Dict[str, float]] = {name: {} for name in PHASE_NAMES}
    lines_seen = {name: 0 for name in PHASE_NAMES}
    selftest: List[str] = []
    launch_configs: Dict[str, Dict[str, Any]] = {}
    aot_loads = 0
    events: List[Dict[str, Any]] = []
    for line in text.splitlines():
        for phase in PHASES:
            match = phase.regex.search(line)
            if not match:
                continue
            seconds = _seconds(match)
            if seconds is None:
                continue
            lines_seen[phase.name] += 1
            values = per_process[phase.name]
            key = _process(line)
            if key in values and phase.within == "sum":
                values[key] += seconds
            else:
                values[key] = max(seconds, values.get(key, seconds))
        if AOT_LOAD.search(line):
            aot_loads += 1
        match = SELFTEST.search(line)
        if match:
            selftest.append(match.group("verdict"))
        match = LAUNCH_CONFIGS.search(line)
        if match:
            origin = "cached" if match.group("cached") else "hand table" if match.group("hand") else "tuned"
            launch_configs[match.group("shape")] = {"origin": origin, "tuned_s": _seconds(match)}
        event = jit_event(line, ours)
        if event is not None:
            events.append(event)
    phases = {name: (round(max(values.values()), 6) if values else None) for name, values in per_process.items()}
    if phases["overlay_tune_s"] is None:  # the child's own line missing: the worker's summary line
        tuned = [entry["tuned_s"] for entry in launch_configs.values() if entry["tuned_s"] is not None]
        phases["overlay_tune_s"] = max(tuned) if tuned else None
    return {
        "phases": phases,
        "phase_lines": lines_seen,
        "overlay": {
            # The self-test line carries no duration; its verdict and how many processes logged it.
            "selftest": ("failed" if "failed" in selftest else "passed") if selftest else None,
            "selftest_lines": len(selftest),
            "launch_configs": launch_configs,
        },
        "compile_cache": {"aot_loads": aot_loads, "graph_loads": lines_seen["graph_cache_load_s"],
                          "graph_compiles": lines_seen["graph_compile_s"]},
        "jit": {
            "count": len(events),
            "ours": sum(1 for e in events if e["ours"]),
            "kernels": sorted({e["kernel"] for e in events if e["kernel"]}),
            "events": events,
        },
    }


def read_log(path: Path, ours: Optional[FrozenSet[str]] = None) -> Dict[str, Any]:
    """parse_log of a file; an unreadable file parses as an empty log (every phase None)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return parse_log(text, ours)
