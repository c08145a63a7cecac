"""The overlay's global switches, read from ``GOVINDA_*`` environment variables.

Per-patch and per-group switches are declared in ``patches.yaml`` (``env:`` keys); this module
holds the switches that exist regardless of the table. Malformed values never raise: they produce
one warning that lists the valid choices and says what applies instead (strict mode turns the
warning into an error at apply time).

``current()`` is the one ``Settings`` of this process, parsed once from ``os.environ`` and shared by
every reader (sitecustomize, the loader, the feature); it keeps the raw ``GOVINDA_*`` variables too,
from which the planner reads the table's own switches. Stdlib only: sitecustomize may import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from .excerpt import excerpt

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SELFTEST_MODES = ("auto", "inline", "skip")
TUNE_MODES = ("auto", "off", "force")
DEFAULT_TUNE_BUDGET_S = 60.0
# Above this a budget is a mistake: the tuning child's timeout (budget + margin) overflows the
# millisecond poll timeout of subprocess at about 2.1e6 s, so every start's tuning would fail.
MAX_TUNE_BUDGET_S = 3600.0
PLATFORMS = ("rocm", "cuda")  # also the values patches.yaml accepts (config.py)
PREFIX = "GOVINDA_"
# Must equal kernels/kv_rotation.py ROTATIONS (tests check it); read here without importing torch.
KV_ROTATIONS = ("none", "hadamard")
# Off by default: the rotation is more accurate at no extra bytes, but costs 6-27% decode and 2-8%
# prefill attention time on the H200 (reports/h200/h200-kv-rotation.md), over the 3% budget.
DEFAULT_KV_ROTATION = "none"
PREFILL_KERNELS = ("auto", "triton", "fa3")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATCHES_FILE = REPO_ROOT / "patches.yaml"


@dataclass(frozen=True)
class GlobalSwitch:
    name: str
    values: str
    default: str
    effect: str


# The single list of global switches; `python -m govinda_patch env-doc` renders it.
GLOBAL_SWITCHES = (
    GlobalSwitch("GOVINDA_DISABLE", "0 | 1", "0", "Master kill switch: 1 leaves every process on stock vLLM (sitecustomize only chains)."),
    GlobalSwitch(
        "GOVINDA_PATCHES",
        "comma-separated patch or group names",
        "(unset: each patch's default)",
        "Apply exactly this set; everything else is disabled. Groups stay all-or-nothing.",
    ),
    GlobalSwitch("GOVINDA_PATCHES_FILE", "path to a YAML file (`~` expanded)", "<repo>/patches.yaml", "Use another patch table."),
    GlobalSwitch("GOVINDA_STRICT", "0 | 1", "0", "Any skip, failure or bad switch value raises instead of logging (tests, CI)."),
    GlobalSwitch("GOVINDA_FORCE", "0 | 1", "0", "Apply patches even outside their verified vLLM versions."),
    GlobalSwitch("GOVINDA_LOG_LEVEL", " | ".join(LOG_LEVELS), "INFO", "Verbosity of the overlay's own log lines (stderr, 'govinda LEVEL [pid N] ...')."),
    GlobalSwitch(
        "GOVINDA_SELFTEST",
        " | ".join(SELFTEST_MODES),
        "auto",
        "auto: run the kernel self-test once per kernel/device version before a kernel group takes effect, started in the "
        "background as soon as `vllm serve` launches and awaited before the engine initialises its GPU (on that first "
        "start the same background process then tunes the attention shape vLLM configures from the command line, "
        "with GOVINDA_TUNE=auto); "
        "inline: the same test, run only when the engine first needs the verdict (during model construction); "
        "skip: trust the kernels (CPU-only tests).",
    ),
    GlobalSwitch(
        "GOVINDA_SELFTEST_CHILD",
        "1",
        "(unset)",
        "Set by the overlay itself on the self-test's child processes, which run with GOVINDA_DISABLE=1 on purpose "
        "(bench/ab.py's environment check skips them). Do not set it.",
    ),
    GlobalSwitch(
        "GOVINDA_TUNE",
        " | ".join(TUNE_MODES),
        "auto",
        "auto: on a real GPU, time the launch-config candidates once per model shape (head_dim, heads, block size, "
        "dtype) in a child process and cache the fastest correct one, which every process of a server then uses; "
        "off: the hand-written table of kernels/launch_configs.py; force: tune again, ignoring the cache.",
    ),
    GlobalSwitch(
        "GOVINDA_TUNE_BUDGET_S",
        f"seconds (> 0, at most {MAX_TUNE_BUDGET_S:g})",
        f"{DEFAULT_TUNE_BUDGET_S:g}",
        "Time the self-tuner may spend per model shape on the first start (compiles included); "
        "candidates not reached keep the hand table's entry.",
    ),
    GlobalSwitch("GOVINDA_CACHE_DIR", "path (`~` expanded)", "~/.cache/govinda", "Where self-test verdicts, tuned launch configs and dispatch counters are kept."),
    GlobalSwitch(
        "GOVINDA_PLATFORM",
        " | ".join(PLATFORMS),
        "(detected from torch)",
        "Override platform detection, which decides the platform-specific patch targets (e.g. a simulated DCU in tests).",
    ),
    GlobalSwitch(
        "GOVINDA_KV_ROTATION",
        " | ".join(KV_ROTATIONS),
        DEFAULT_KV_ROTATION,
        "int8_kv group: rotate K/V rows (and the query and output to match) by an orthonormal Hadamard matrix before "
        "quantizing; none stores them as they are. Same bytes and page layout. Every process of a server reads it.",
    ),
    GlobalSwitch(
        "GOVINDA_PREFILL_KERNEL",
        " | ".join(PREFILL_KERNELS),
        "auto",
        "int8_kv group: the prefill kernel. auto: the launch table's choice (fa3 on Hopper: gather-dequantize the INT8 "
        "pages to bf16, then vLLM's FlashAttention-3) when FA3 is available, else triton; fa3 that is unavailable runs "
        "triton with a warning. Decode always runs Govinda's INT8 kernels.",
    ),
    GlobalSwitch(
        "GOVINDA_KERNEL_ARCH",
        "cuda_sm90 | cuda_default | rocm_gfx9 | rocm_default | interpreter",
        "(detected from the device)",
        "Force a launch-config table of kernels/launch_configs.py (experiments, or a DCU reporting an unknown gfx).",
    ),
)


def _read_flag(environ, name: str, warnings: list[str], meaning_of_default: str) -> bool:
    return bool(parse_switch(environ, name, warnings, fallback=f"using the default 0 ({meaning_of_default})"))


def _read_choice(environ, name: str, choices: tuple[str, ...], default: str, warnings: list[str], upper=False) -> str:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().upper() if upper else raw.strip().lower()
    if value in choices:
        return value
    warnings.append(f"{name}={excerpt(raw, 80)} is not a valid value; use one of {choices}; using {default!r}")
    return default


def _read_seconds(environ, name: str, default: float, warnings: list[str], maximum: float) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value > maximum:  # inf included
        warnings.append(f"{name}={excerpt(raw, 80)} is more than the {maximum:g} s allowed; using {maximum:g}")
        return maximum
    if value > 0:  # NaN compares false
        return value
    warnings.append(f"{name}={excerpt(raw, 80)} is not a positive number of seconds; using {default:g}")
    return default


def _read_explicit_set(environ) -> tuple[str, ...] | None:
    """The names of GOVINDA_PATCHES; () for a value that names none (the planner warns)."""
    raw = environ.get("GOVINDA_PATCHES")
    if raw is None or not raw.strip():
        return None
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def _path_from(raw: str) -> Path:
    try:
        return Path(raw).expanduser()
    except RuntimeError:  # "~" without a home directory
        return Path(raw)


def kv_rotation(environ=None) -> str:
    """The KV rotation every process of a server uses (``GOVINDA_KV_ROTATION``)."""
    return settings_for(environ).kv_rotation


def prefill_kernel(environ=None) -> str:
    """``GOVINDA_PREFILL_KERNEL``: auto | triton | fa3 (govinda_patch/int8/prefill_kernel.py resolves auto)."""
    return settings_for(environ).prefill_kernel


def parse_switch(environ, name: str, warnings: list[str], fallback: str) -> bool | None:
    """An on/off switch: True/False when set, None when unset or malformed.

    ``fallback`` says what applies instead of a malformed value (the warning must tell the truth).
    """
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    warnings.append(f"{name}={excerpt(raw, 80)} is not a valid value; use one of {TRUE_WORDS + FALSE_WORDS}; {fallback}")
    return None


@dataclass
class Settings:
    disabled: bool = False
    explicit_set: tuple[str, ...] | None = None
    patches_file: Path = DEFAULT_PATCHES_FILE
    strict: bool = False
    force: bool = False
    log_level: str = "INFO"
    selftest: str = "auto"
    tune: str = "auto"
    tune_budget_s: float = DEFAULT_TUNE_BUDGET_S
    cache_dir: Path | None = field(default_factory=lambda: default_cache_dir())
    platform_override: str | None = None
    kv_rotation: str = DEFAULT_KV_ROTATION
    prefill_kernel: str = "auto"
    warnings: list[str] = field(default_factory=list)
    # Every GOVINDA_* variable as set (the table's per-group and per-patch switches among them).
    switches: Mapping[str, str] = field(default_factory=dict)

    def cache_subdir(self, name: str) -> Path | None:
        """``<GOVINDA_CACHE_DIR>/<name>``; None without a cache directory (no home, variable unset)."""
        return None if self.cache_dir is None else Path(self.cache_dir) / name

    @classmethod
    def from_env(cls, environ=None) -> "Settings":
        environ = os.environ if environ is None else environ
        warnings: list[str] = []
        explicit = _read_explicit_set(environ)
        platform = _read_choice(environ, "GOVINDA_PLATFORM", PLATFORMS, "", warnings) or None
        return cls(
            disabled=_read_flag(environ, "GOVINDA_DISABLE", warnings, "the overlay stays on"),
            explicit_set=explicit,
            patches_file=_path_from(environ["GOVINDA_PATCHES_FILE"]) if environ.get("GOVINDA_PATCHES_FILE") else DEFAULT_PATCHES_FILE,
            strict=_read_flag(environ, "GOVINDA_STRICT", warnings, "not strict"),
            force=_read_flag(environ, "GOVINDA_FORCE", warnings, "verified vLLM versions only"),
            log_level=_read_choice(environ, "GOVINDA_LOG_LEVEL", LOG_LEVELS, "INFO", warnings, upper=True),
            selftest=_read_choice(environ, "GOVINDA_SELFTEST", SELFTEST_MODES, "auto", warnings),
            tune=_read_choice(environ, "GOVINDA_TUNE", TUNE_MODES, "auto", warnings),
            tune_budget_s=_read_seconds(environ, "GOVINDA_TUNE_BUDGET_S", DEFAULT_TUNE_BUDGET_S, warnings, MAX_TUNE_BUDGET_S),
            cache_dir=cache_dir_from(environ),
            platform_override=platform,
            kv_rotation=_read_choice(environ, "GOVINDA_KV_ROTATION", KV_ROTATIONS, DEFAULT_KV_ROTATION, warnings),
            prefill_kernel=_read_choice(environ, "GOVINDA_PREFILL_KERNEL", PREFILL_KERNELS, "auto", warnings),
            warnings=warnings,
            switches=_switches_of(environ),
        )


def default_cache_dir() -> Path | None:
    """``~/.cache/govinda``; None without a home directory (the self-test then runs uncached)."""
    try:
        return Path.home() / ".cache" / "govinda"
    except (RuntimeError, KeyError, OSError):  # HOME unset and no passwd entry (some containers)
        return None


def cache_dir_from(environ) -> Path | None:
    raw = environ.get("GOVINDA_CACHE_DIR")
    if not raw:
        return default_cache_dir()
    return _path_from(raw)


def _switches_of(environ) -> dict[str, str]:
    return {name: value for name, value in environ.items() if name.startswith(PREFIX)}


_current: Settings | None = None


def current() -> Settings:
    """This process's settings, parsed once from ``os.environ`` (a server's switches are set before
    it starts). A process that changes a ``GOVINDA_*`` variable later (tests, tools) gets them
    parsed again on its next read, never a stale answer."""
    global _current
    settings = _current
    if settings is None or settings.switches != _switches_of(os.environ):
        settings = _current = Settings.from_env(os.environ)
    return settings


def settings_for(environ=None) -> Settings:
    """``current()``, or the settings of an explicit environment mapping (tests, the CLI)."""
    return current() if environ is None else Settings.from_env(environ)
