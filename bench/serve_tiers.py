"""The scoring tiers through vLLM's own client: one ``vllm bench serve`` run per input length.

Workload: random dataset at each tier's input length, ``--random-output-len`` (256) tokens,
``--ignore-eos``, ``--max-concurrency 1``, ``--save-result --save-detailed``; the tier's entry in
our result is the JSON the tool saved (its field names, percentile definitions and counting),
plus ``requested_input_len``, ``requested_output_len``, ``completion_rate`` and ``bench_serve``
(the command line, exit code and the tail of its output).

The tool runs as a subprocess of the installed vLLM (``--vllm-command``, default
``sys.executable -m vllm.entrypoints.cli.main``), so it is the vLLM that serves; the client runs
with ``GOVINDA_DISABLE=1``: the overlay patches servers, never the measuring client.

Prompts: the random dataset (vLLM 0.18.1 and 0.26 alike) draws a run of consecutive token ids
from a random offset per request (``numpy.random.default_rng(--seed)``), decodes it to text,
re-encodes it and pads or trims until the text is the requested number of tokens; requests go
out as text, so the server tokenizes them again. ``input_lens`` of a saved result says what was
sent: the client's count on 0.18.1, the server's ``usage.prompt_tokens`` on 0.26.

No reuse of cached prefixes: the tool's own ``--num-warmups`` resends the first measured prompt,
whose prefill would then be a prefix-cache hit, so the warm-up is a separate run of the tool with
its own seed (not saved), and every tier gets a seed of its own: prompts of two tiers would
otherwise start with the same tokens. The same seed and tokenizer give the same prompts, so the
sides of an A/B run see identical inputs.

Client: ``client: process`` (default) runs the tool as a new process per tier; ``client: session``
runs every tier in one persistent process that imports vLLM's CLI once and calls it per tier
(bench/bench_serve_session.py: the same parser, client and saved JSON, minus ~25 s of start-up
per tier on the H200), for sweeps that must fit a time-limited device call.

Server state: with ``sample_metrics: true`` each tier also samples the server's Prometheus
``/metrics`` while it runs (requests running and waiting, preemptions, KV-cache usage;
bench/server_metrics.py) into its ``server_metrics``.

    python -m bench.serve_tiers --base-url http://127.0.0.1:8000 --tokenizer /path/to/model \
        --result-file out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from bench import server_metrics
from bench.bench_serve_session import Session

DEFAULT_INPUT_LENS = (6144, 12288, 24576)
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
SCHEMA = "govinda.serve_tiers/2"
OUTPUT_TAIL_LINES = 40
CLIENTS = ("process", "session")


@dataclass
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "/v1/completions"
    # None: the tool asks the server's /v1/models (first id).
    model: Optional[str] = None
    # The tokenizer the random dataset builds prompts with: the served model's directory.
    tokenizer: Optional[str] = None
    input_lens: List[int] = field(default_factory=lambda: list(DEFAULT_INPUT_LENS))
    output_len: int = 256
    num_prompts: int = 10  # per tier and concurrency slot: a tier at concurrency C sends num_prompts * C
    # One value, or a list: every input length is then measured at each concurrency, one server start.
    max_concurrency: Union[int, List[int]] = 1
    warmup_requests: int = 1  # in a separate run of the tool, before the first tier
    warmup_input_len: Optional[int] = None  # default: the first tier's input length
    seed: int = 0  # the warm-up's; tier k (from 0) uses seed + 1 + k
    # "point": tier (n, c) uses seed + 1 + 1000 n + c, the same whatever else a run measures, so a
    # sweep split over several calls (--input-lens) sends every side the same prompts per point.
    tier_seeds: str = "index"
    percentiles: List[float] = field(default_factory=lambda: list(DEFAULT_PERCENTILES))
    vllm_command: Optional[List[str]] = None  # default: this interpreter -m vllm.entrypoints.cli.main
    extra_args: List[str] = field(default_factory=list)  # appended to every `vllm bench serve`
    timeout_s: float = 3600.0  # per run of the tool
    work_dir: Optional[str] = None  # saved results and tool output; default: a temporary dir
    label: Optional[str] = None
    progress: bool = True
    client: str = "process"  # or "session": one persistent client process for every tier
    session_entry: Optional[str] = None  # the session's CLI entry point (tests: a stand-in)
    sample_metrics: bool = False  # sample the server's /metrics while each tier runs
    metrics_interval_s: float = 0.5

    def validate(self) -> None:
        if not self.tokenizer:
            raise ValueError("tokenizer: the random dataset needs the served model's tokenizer (a path)")
        if not self.input_lens or any(n < 1 for n in self.input_lens):
            raise ValueError("input_lens must be a non-empty list of lengths >= 1")
        if self.output_len < 1 or self.num_prompts < 1 or self.warmup_requests < 0:
            raise ValueError("output_len and num_prompts must be >= 1, warmup_requests >= 0")
        if not self.concurrencies() or any(c < 1 for c in self.concurrencies()):
            raise ValueError("max_concurrency must be >= 1 (or a non-empty list of such)")
        if self.tier_seeds not in ("index", "point"):
            raise ValueError(f"tier_seeds must be 'index' or 'point', not {self.tier_seeds!r}")
        if self.client not in CLIENTS:
            raise ValueError(f"client must be one of {CLIENTS}, not {self.client!r}")
        if self.metrics_interval_s <= 0:
            raise ValueError("metrics_interval_s must be > 0")

    def concurrencies(self) -> List[int]:
        values = self.max_concurrency if isinstance(self.max_concurrency, list) else [self.max_concurrency]
        return [int(c) for c in values]

    def tiers(self) -> List[Tuple[int, int]]:
        """(input length, concurrency) pairs in run order."""
        return [(n, c) for n in self.input_lens for c in self.concurrencies()]

    def tier_seed(self, k: int, input_len: int, concurrency: int) -> int:
        if self.tier_seeds == "point":
            return self.seed + 1 + 1000 * input_len + concurrency
        return self.seed + 1 + k


def log(message: str) -> None:
    print(f"[serve_tiers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _percentile_key(p: float) -> str:
    # The tool's own naming of p<N>_<metric>_ms.
    return str(int(p)) if int(p) == p else str(p)


def bench_serve_command(
    config: BenchConfig, input_len: int, num_prompts: int, seed: int, result_file: Optional[Path],
    concurrency: Optional[int] = None,
) -> List[str]:
    command = list(config.vllm_command or [sys.executable, "-m", "vllm.entrypoints.cli.main"])
    return command + ["bench", "serve"] + bench_serve_args(config, input_len, num_prompts, seed, result_file, concurrency)


def bench_serve_args(
    config: BenchConfig, input_len: int, num_prompts: int, seed: int, result_file: Optional[Path],
    concurrency: Optional[int] = None,
) -> List[str]:
    """The arguments after ``vllm bench serve``."""
    command = [
        "--backend", "openai",
        "--base-url", config.base_url.rstrip("/"),
        "--endpoint", config.endpoint,
        "--tokenizer", str(config.tokenizer),
        "--dataset-name", "random",
        "--random-input-len", str(input_len),
        "--random-output-len", str(config.output_len),
        "--num-prompts", str(num_prompts),
        "--max-concurrency", str(concurrency or config.concurrencies()[0]),
        "--ignore-eos",
        "--seed", str(seed),
        "--percentile-metrics", PERCENTILE_METRICS,
        "--metric-percentiles", ",".join(_percentile_key(p) for p in config.percentiles),
        "--disable-tqdm",
    ]
    if config.model:
        command += ["--model", config.model]
    if config.label:
        command += ["--label", config.label]
    if result_file is not None:
        command += ["--save-result", "--save-detailed", "--result-dir", str(result_file.parent),
                    "--result-filename", result_file.name]
    return command + list(config.extra_args)


def client_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["GOVINDA_DISABLE"] = "1"  # the measuring client stays stock vLLM
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_tool(command: List[str], output_path: Path, timeout_s: float) -> Dict[str, Any]:
    """Run one `vllm bench serve`; its stdout/stderr go to output_path."""
    started = time.monotonic()
    with open(output_path, "wb") as out:
        try:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=client_env(), timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = None
    lines = output_path.read_text(encoding="utf-8", errors="replace").splitlines()
    return {
        "command": command,
        "returncode": code,
        "seconds": round(time.monotonic() - started, 1),
        "output_file": str(output_path),
        "output_tail": lines[-OUTPUT_TAIL_LINES:],
    }


def run_bench_serve(config: BenchConfig, session: Optional[Session], input_len: int, num_prompts: int, seed: int,
                    result_file: Optional[Path], concurrency: int, output_path: Path) -> Dict[str, Any]:
    """One run of the tool, in its own process or in the session."""
    if session is not None:
        args = bench_serve_args(config, input_len, num_prompts, seed, result_file, concurrency)
        return session.run(args, output_path, config.timeout_s)
    command = bench_serve_command(config, input_len, num_prompts, seed, result_file, concurrency)
    return run_tool(command, output_path, config.timeout_s)


def run_tier(config: BenchConfig, work: Path, input_len: int, seed: int, concurrency: int = 1,
             session: Optional[Session] = None) -> Dict[str, Any]:
    stem = f"tier-{input_len}" if len(config.concurrencies()) == 1 else f"tier-{input_len}-c{concurrency}"
    result_file = work / f"{stem}.json"
    result_file.unlink(missing_ok=True)
    num_prompts = config.num_prompts * concurrency
    sampler = server_metrics.Sampler(config.base_url, config.metrics_interval_s).start() if config.sample_metrics else None
    try:
        run = run_bench_serve(config, session, input_len, num_prompts, seed, result_file, concurrency,
                              work / f"{stem}.log")
    finally:
        metrics = sampler.stop() if sampler is not None else None
    run["result_file"] = str(result_file)
    annotations = {"requested_input_len": input_len, "requested_output_len": config.output_len,
                   "requested_max_concurrency": concurrency, "seed": seed}
    if run["returncode"] != 0 or not result_file.exists():
        why = "timed out" if run["returncode"] is None else f"exit code {run['returncode']}"
        last = next((line for line in reversed(run["output_tail"]) if line.strip()), "")
        failed = dict(annotations, num_prompts=num_prompts, completed=0, completion_rate=0.0,
                      error=f"vllm bench serve {why}: {last[:300]}", bench_serve=run)
        if metrics is not None:
            failed["server_metrics"] = metrics
        return failed
    tier = json.loads(result_file.read_text(encoding="utf-8"))
    tier.update(annotations)
    tier["completion_rate"] = tier["completed"] / tier["num_prompts"] if tier.get("num_prompts") else 0.0
    tier["bench_serve"] = run
    if metrics is not None:
        tier["server_metrics"] = metrics
    return tier


def new_session(config: BenchConfig, log_path: Path) -> Session:
    """The persistent client (not yet started): the same environment as a client process."""
    return Session(client_env(), log_path, entry=config.session_entry, cwd=str(Path(__file__).resolve().parent.parent))


def run(config: BenchConfig, session: Optional[Session] = None) -> Dict[str, Any]:
    """Warm up, then one `vllm bench serve` per tier; returns {"tiers": [...], ...}.

    ``session``: a client session already started by the caller (``client: session``), which
    the caller closes; without one, a session client starts and closes its own."""
    config.validate()
    if config.work_dir:
        work = Path(config.work_dir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="serve_tiers-"))
    own_session = None
    if config.client == "session" and session is None:
        session = own_session = new_session(config, work / "session.log").start()
    try:
        return _run(config, work, session)
    finally:
        if own_session is not None:
            own_session.close()


def _run(config: BenchConfig, work: Path, session: Optional[Session]) -> Dict[str, Any]:
    output: Dict[str, Any] = {
        "schema": SCHEMA,
        "tool": "vllm bench serve",
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "label": config.label,
        "base_url": config.base_url,
        "config": dataclasses.asdict(config),
        "warmup": None,
        "tiers": [],
    }
    if config.warmup_requests:
        input_len = config.warmup_input_len or config.input_lens[0]
        if config.progress:
            log(f"warm-up: {config.warmup_requests} x ({input_len} in, {config.output_len} out), not counted")
        output["warmup"] = run_bench_serve(config, session, input_len, config.warmup_requests, config.seed, None,
                                           config.concurrencies()[0], work / "warmup.log")
        if output["warmup"]["returncode"] != 0 and config.progress:
            log(f"warm-up FAILED (exit {output['warmup']['returncode']}), see {work / 'warmup.log'}")
    tiers = config.tiers()
    for k, (input_len, concurrency) in enumerate(tiers):
        if config.progress:
            log(f"tier {k + 1}/{len(tiers)}: vllm bench serve, {config.num_prompts * concurrency} x "
                f"({input_len} in, {config.output_len} out), concurrency {concurrency}")
        tier = run_tier(config, work, input_len, config.tier_seed(k, input_len, concurrency), concurrency, session)
        if config.progress:
            state = tier.get("error") or (f"{tier['completed']}/{tier['num_prompts']} completed, "
                                          f"{tier['output_throughput']:.2f} tok/s, input tokens sent "
                                          f"{input_len_range(tier)}")
            log(f"tier {k + 1}: {state} ({tier['bench_serve']['seconds']:.0f} s)")
        output["tiers"].append(tier)
    return output


def input_len_range(tier: Dict[str, Any]) -> str:
    """The input lengths the tool reports as sent ('6144' or '6140-6144'), 'n/a' without them."""
    lens = [n for n in tier.get("input_lens") or [] if n]
    if not lens:
        return "n/a"
    low, high = min(lens), max(lens)
    return str(low) if low == high else f"{low}-{high}"


def format_summary(result: Dict[str, Any]) -> str:
    header = (f"{'input':>7} {'sent':>11} {'done':>7} {'out tok/s':>10} {'TTFT p99':>9} "
              f"{'TPOT p99':>9} {'ITL p99':>8}   (ms)")
    lines = [f"vllm bench serve against {result.get('base_url')}", header]
    for t in result["tiers"]:
        if t.get("error"):
            lines.append(f"{t['requested_input_len']:>7} {t['error']}")
            continue
        lines.append(
            f"{t['requested_input_len']:>7} {input_len_range(t):>11} {t['completed']:>3}/{t['num_prompts']:<3} "
            f"{t['output_throughput']:>10.2f} {t.get('p99_ttft_ms', float('nan')):>9.1f} "
            f"{t.get('p99_tpot_ms', float('nan')):>9.2f} {t.get('p99_itl_ms', float('nan')):>8.2f}"
        )
    return "\n".join(lines)


def parse_int_list(text: str) -> List[int]:
    """'6144,12288' or '6K,12K,24K' (K = 1024) -> [6144, 12288]."""
    values = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        if item[-1] in "kK":
            values.append(int(float(item[:-1]) * 1024))
        else:
            values.append(int(item))
    return values


# The tier flags the A/B runner passes on (with defaults None there: "not given, keep the file's").
TIER_FLAGS = ("input_lens", "output_len", "num_prompts", "max_concurrency", "warmup_requests", "seed")


def add_tier_arguments(p: argparse.ArgumentParser, defaults: Optional[BenchConfig]) -> None:
    """The workload flags of TIER_FLAGS; defaults None: every one defaults to None."""
    def default(name):
        if defaults is None:
            return None
        value = getattr(defaults, name)
        return [value] if name == "max_concurrency" and not isinstance(value, list) else value

    p.add_argument("--input-lens", type=parse_int_list, default=default("input_lens"),
                   help="comma list of input lengths in tokens, K = 1024 (default 6K,12K,24K)")
    p.add_argument("--output-len", type=int, default=default("output_len"))
    p.add_argument("--num-prompts", type=int, default=default("num_prompts"), help="requests per tier")
    p.add_argument("--max-concurrency", type=int, nargs="+", default=default("max_concurrency"),
                   help="one or more; each input length runs at each (num_prompts per slot)")
    p.add_argument("--warmup-requests", type=int, default=default("warmup_requests"),
                   help="requests of the warm-up run of the tool (default 1)")
    p.add_argument("--seed", type=int, default=default("seed"))


def build_arg_parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=d.base_url, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--endpoint", default=d.endpoint)
    p.add_argument("--model", default=None, help="model name for requests (default: first of /v1/models)")
    p.add_argument("--tokenizer", required=True, help="the served model's directory (prompts are built with it)")
    add_tier_arguments(p, defaults=d)
    p.add_argument("--warmup-input-len", type=int, default=None)
    p.add_argument("--percentiles", default="50,90,99", help="comma list, reported as pNN_<metric>_ms")
    p.add_argument("--vllm-command", default=None, help="how to run vLLM's CLI (shell words)")
    p.add_argument("--work-dir", default=None, help="the tool's saved results and output")
    p.add_argument("--label", default=None)
    p.add_argument("--result-file", default=None, help="write the JSON result here")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        base_url=args.base_url,
        endpoint=args.endpoint,
        model=args.model,
        tokenizer=args.tokenizer,
        input_lens=args.input_lens,
        output_len=args.output_len,
        num_prompts=args.num_prompts,
        max_concurrency=args.max_concurrency[0] if len(args.max_concurrency) == 1 else args.max_concurrency,
        warmup_requests=args.warmup_requests,
        warmup_input_len=args.warmup_input_len,
        seed=args.seed,
        percentiles=[float(x) for x in args.percentiles.split(",") if x.strip()],
        vllm_command=shlex.split(args.vllm_command) if args.vllm_command else None,
        work_dir=args.work_dir,
        label=args.label,
        progress=not args.quiet,
    )


def main(argv: Optional[List[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    result = run(config_from_args(args))
    print(format_summary(result))
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(result, indent=1), encoding="utf-8")
        log(f"wrote {args.result_file}")
    bad = [t for t in result["tiers"] if t.get("error") or t["failed"]]
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
