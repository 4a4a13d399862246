"""``python -m bench``: the project's benchmarks, run the same way and recorded with the machine they ran on.

    python -m bench list                                  # the benchmarks, one line each
    python -m bench train_throughput --compare            # run one (its own flags follow its name)
    python -m bench --repeats 3 embedding_bag             # three runs, recorded as one result
    python -m bench table                                 # README tables from bench/results/

Each run is the script in a fresh interpreter; its output is shown as it comes and its figure lines
(``<name> <number>``) are recorded in ``bench/results/<machine>/<benchmark>-<time>.json`` with the CPU,
ISA, cores, memory, load average and versions (``harness``). ``--no-record`` only shows the output.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts' own sibling imports (machine, ...)

from harness import BENCH, RESULTS, Result, figures, load_results, now, record, this_machine, versions  # noqa: E402
from tables import TABLES, render  # noqa: E402


def _summary(script: Path) -> str:
    if not script.is_file():
        return "(missing from this checkout)"
    text = script.read_text()
    start = text.find('"""')
    return text[start + 3 :].split("\n", 1)[0].strip() if start >= 0 else ""


def _list() -> int:
    for name in TABLES:
        print(f"{name:<20} {_summary(BENCH / f'{name}.py')}")
    return 0


def _run(name: str, args: list[str], repeats: int, keep: bool, results: Path) -> int:
    script = BENCH / f"{name}.py"
    if name not in TABLES or not script.is_file():
        print(f"python -m bench: no benchmark {name!r}; `python -m bench list` names them", file=sys.stderr)
        return 2
    started, load, clock = now(), os.getloadavg()[0], time.perf_counter()
    runs, output, code = [], "", 0
    for repeat in range(repeats):
        if repeats > 1:
            print(f"== {name}: run {repeat + 1} of {repeats}", flush=True)
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, bufsize=1
        )
        lines = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        code = proc.wait()
        output = "".join(lines)
        if code != 0:
            break
        runs.append(figures(output))
    result = Result(
        benchmark=name,
        args=args,
        machine=this_machine(output),
        versions=versions(),
        started=started,
        seconds=round(time.perf_counter() - clock, 1),
        load_average=round(load, 2),
        exit_code=code,
        runs=runs,
    )
    asked_for_help = bool({"-h", "--help"} & set(args))  # a usage text is no result
    if keep and code == 0 and any(runs) and not asked_for_help:
        print(f"recorded {record(result, results)}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs of the benchmark (each recorded)")
    parser.add_argument("--no-record", dest="record", action="store_false", help="do not write a result")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder (bench/results)")
    parser.add_argument("name", help="a benchmark (see `list`), `list`, or `table`")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    a = parser.parse_args(argv)
    if a.name == "list":
        return _list()
    if a.name == "table":
        print(render(load_results(a.results)), end="")
        return 0
    if a.repeats < 1:
        parser.error("--repeats: expected >= 1")
    return _run(a.name, a.args, a.repeats, a.record, a.results)


if __name__ == "__main__":
    sys.exit(main())
