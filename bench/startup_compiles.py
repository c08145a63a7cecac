"""Which of the overlay's Triton kernels a server start compiled, and whether before or after its
engine started (issue #29: the background process should compile what the engine launches, so the
engine only loads it from the on-disk cache).

Triton writes one ``<kernel>.json`` metadata file per compiled specialization (``<cache>/<hash>/``)
when the compile ends. After a start, every such file of one of ``kernels/``'s kernels under the
side's cache roots whose modification time is at or after the launch was compiled by that start;
one older than the launch was loaded. The engine's start comes from vLLM's first
"Initializing a V1 LLM engine" line: its ``MM-DD HH:MM:SS`` is local time on the same machine,
so the launch's year completes it. A compile that ended before that line was the background
process's (the API server compiles none of ours); one after it, the engine's.

Each compile also carries its specialization as far as the cache shows it: the kernel's argument
types with Triton's ``tt.divisibility`` marks (from the ``.ttir`` beside the metadata; an integer
equal to 1 is folded and drops out of the list) and the metadata's warps and stages. An engine
compile is compared with the same kernel's background compiles, so a report names the argument
the background got wrong.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Dict, FrozenSet, Iterable, List, Optional

ENGINE_START = re.compile(r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] Initializing a V1 LLM engine")
GROUP_PREFIX = "__grp__"  # Triton's per-compile group file, beside the metadata
# One argument of the kernel's ``tt.func`` line in the .ttir: name, type, optional attributes.
TTIR_ARGUMENT = re.compile(r"%(?P<name>[\w.$-]+): (?P<type>[^{]+?)(?: \{(?P<attrs>[^}]*)\})? loc\(")
DIVISIBILITY = re.compile(r"tt\.divisibility = (\d+)")
OPTIONS = ("num_warps", "num_stages")


def engine_start_epoch(log_text: str, launched_epoch: float) -> Optional[float]:
    """The engine's first start line as seconds since the epoch, in the launch's year; None without one."""
    match = ENGINE_START.search(log_text)
    if match is None:
        return None
    year = time.localtime(launched_epoch).tm_year
    try:
        return time.mktime(time.strptime(f"{year}-{match.group('stamp')}", "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def specialization(directory: str, kernel: str) -> Optional[Dict[str, Any]]:
    """``{"args": {name: "type" or "type/16"}, "num_warps", "num_stages"}`` of one compile, or None
    when its files cannot be read."""
    try:
        with open(os.path.join(directory, kernel + ".json"), encoding="utf-8") as handle:
            metadata = json.load(handle)
        with open(os.path.join(directory, kernel + ".ttir"), encoding="utf-8", errors="replace") as handle:
            head = next((line for line in handle if f"tt.func public @{kernel}(" in line), None)
    except (OSError, ValueError):
        return None
    if head is None or not isinstance(metadata, dict):
        return None
    args = {}
    for match in TTIR_ARGUMENT.finditer(head):
        divisible = DIVISIBILITY.search(match.group("attrs") or "")
        args[match.group("name")] = match.group("type").strip() + (f"/{divisible.group(1)}" if divisible else "")
    return dict({"args": args}, **{key: metadata.get(key) for key in OPTIONS})


def differences(engine: Dict[str, Any], background: Dict[str, Any]) -> List[str]:
    """How one specialization differs from another, e.g. ``["stride_k: i32 -> i32/16", "num_warps 4 -> 8"]``."""
    found = []
    for name in sorted(set(engine["args"]) | set(background["args"])):
        theirs, ours = background["args"].get(name, "folded (== 1)"), engine["args"].get(name, "folded (== 1)")
        if theirs != ours:
            found.append(f"{name}: {theirs} -> {ours}")
    found += [f"{key} {background.get(key)} -> {engine.get(key)}" for key in OPTIONS if background.get(key) != engine.get(key)]
    return found


def compiled_kernels(roots: Iterable[str], ours: FrozenSet[str], launched_epoch: float) -> List[Dict[str, Any]]:
    """``{"kernel", "at_s", "spec"}`` for each of our specializations compiled at or after the launch
    (seconds after it), sorted by time; files that vanish or cannot be read are skipped."""
    found = []
    for root in roots:
        for directory, _dirs, names in os.walk(root):
            for name in names:
                kernel, ext = os.path.splitext(name)
                if ext != ".json" or kernel.startswith(GROUP_PREFIX) or kernel not in ours:
                    continue
                try:
                    mtime = os.lstat(os.path.join(directory, name)).st_mtime
                except OSError:
                    continue
                if mtime >= launched_epoch:
                    found.append((mtime, {"kernel": kernel, "at_s": round(mtime - launched_epoch, 2),
                                          "spec": specialization(directory, kernel)}))
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]


def unlike_background(late: Dict[str, Any], earlier: List[Dict[str, Any]]) -> str:
    """Why an engine compile was not loaded from the background's: the fewest differences from one
    of the same kernel's background compiles."""
    same = [entry for entry in earlier if entry["kernel"] == late["kernel"]]
    if not same:
        return "no background compile of this kernel"
    if late.get("spec") is None or all(entry.get("spec") is None for entry in same):
        return "specialization not readable"
    fewest = min((differences(late["spec"], entry["spec"]) for entry in same if entry.get("spec") is not None), key=len)
    return "; ".join(fewest) or "same arguments and options (a constexpr or the source differs)"


def summary(roots: Iterable[str], ours: FrozenSet[str], launched_epoch: float, log_text: str) -> Dict[str, Any]:
    """What a start compiled of ours: ``{"engine_start_s", "before_engine", "in_engine", "compiles"}``
    (counts split at the engine's start line; both None when the log has no such line)."""
    compiles = compiled_kernels(roots, ours, launched_epoch)
    engine = engine_start_epoch(log_text, launched_epoch)
    if engine is None:
        return {"engine_start_s": None, "before_engine": None, "in_engine": None, "compiles": compiles}
    # The log's stamp has whole seconds: a compile inside the start line's second counts as the engine's.
    engine_s = round(engine - launched_epoch, 2)
    in_engine = [entry for entry in compiles if entry["at_s"] >= engine_s]
    background = [entry for entry in compiles if entry["at_s"] < engine_s]
    for entry in in_engine:
        entry["unlike_background"] = unlike_background(entry, background)
    return {"engine_start_s": engine_s, "before_engine": len(compiles) - len(in_engine),
            "in_engine": len(in_engine), "compiles": compiles}
