"""The benchmarks ``python -m bench`` runs, the figures of each that the README shows, and their tables.

``render`` makes one Markdown table per machine class from the recorded results (``harness``): for each
benchmark and each set of flags, its newest result, each shown figure as the median over that result's runs
with the range beside it, and the run's date, commit and load average. The README's results section is this
output, pasted as it is (``tests/bench/test_harness.py`` checks that it still matches the results).
"""

from __future__ import annotations

import statistics

from harness import Result

# benchmark -> the figures the README shows (empty: the benchmark prints tables of its own; run it to see).
TABLES: dict[str, list[str]] = {
    "train_throughput": ["ratio vs torchrec", "rectrain train examples/s", "torchrec train examples/s"],
    "infer_throughput": [
        "ratio vs torchrec",
        "rectrain int8 infer examples/s",
        "torchrec int8 infer examples/s",
    ],
    "embedding_bag": ["rectrain ebc (auto kernel) fwd+bwd vs raw fbgemm", "auto vs the faster forced kernel"],
    "serve_vs_triton": ["capacity vs triton", "p99 at half load vs triton", "served vs in-process"],
    "serve_throughput": ["recserve served examples/s", "served vs in-process"],
    "serve_cpu_cost": ["served vs in-process by CPU cost", "server CPU-s per 1k examples served"],
    "memory_scale": [],
    "compute_bound": ["compute bound examples/s"],
    "checkpoint_io": [],
    "data_pipeline": [],
    "overload_burst": [],
    "hostile": [
        "held streams normal client errors",
        "idle rest connections normal client errors",
        "max-size requests worker 0 VmHWM growth MiB",
        "at rest server CPU-s per minute",
    ],
    "foreign_criteo": [],
    "freshness": [
        "freshness p50 s",
        "freshness p99 s",
        "apply p99 / steady p99",
        "train throughput publishing / not",
    ],
    "delta_overlay": ["overlay vs plain lookups", "overlay vs plain predict"],
    "delta_apply": [],
    "prune": [
        "pruned / unpruned package bytes",
        "pruned auc drop",
        "pruned / unpruned load time",
        "pruned / unpruned capacity",
    ],
    "recommend": [
        "recommend p99 ms at 100 rps",
        "recommend capacity rps",
        "ann recall@100",
        "index build s",
    ],
    "larger_than_memory": [
        "capped / uncapped train throughput zipf",
        "capped / uncapped train throughput uniform",
        "capped / uncapped serve p99 zipf",
        "oom kills",
    ],
}


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _cell(values: list[float]) -> str:
    middle = _number(statistics.median(values))
    if len(values) == 1 or min(values) == max(values):
        return middle
    return f"{middle} ({_number(min(values))}–{_number(max(values))})"


def _newest(results: list[Result]) -> dict[tuple[str, str, str], Result]:
    newest: dict[tuple[str, str, str], Result] = {}
    for result in results:  # oldest first: a later run of the same flags replaces an earlier one
        newest[(result.machine.slug, result.benchmark, " ".join(result.args))] = result
    return newest


def render(results: list[Result]) -> str:
    """Markdown: per machine class, a table of every benchmark's shown figures from its newest results."""
    newest = _newest(results)
    out = []
    for slug in sorted({key[0] for key in newest}):
        rows = [(key, r) for key, r in sorted(newest.items()) if key[0] == slug]
        machine = rows[0][1].machine
        out.append(f"**{machine.line or machine.cpu}** ({machine.cores} cores, {machine.memory_gib:g} GiB)\n")
        out.append("| benchmark | flags | figure | median (range) | runs | recorded | load |")
        out.append("|---|---|---|---|---|---|---|")
        for (_, name, flags), result in rows:
            for figure in TABLES.get(name, []):
                values = [run[figure] for run in result.runs if figure in run]
                if not values:
                    continue
                when = f"{result.started[:10]}, {result.versions.get('commit', '?')}"
                out.append(
                    f"| {name} | `{flags or '-'}` | {figure} | {_cell(values)} | {len(values)} | {when} | "
                    f"{result.load_average:g} |"
                )
        out.append("")
    return "\n".join(out)
