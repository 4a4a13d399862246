"""The one table of a GPU device check: read what scripts/device_check.sh's stages wrote, print the figures.

``device_check.sh`` runs each stage under ``timeout`` with its output in ``WORK/<stage>.log`` and a line
``name<TAB>status<TAB>exit code<TAB>seconds`` in ``WORK/stages.tsv``; this reads them back, picks each
benchmark's figure and its baseline out of the lines the benchmarks end with (the same lines the README's
tables quote), and prints one table: the GPU and the versions, then per stage its status, time, figure,
baseline, ratio and the issue's goal. It also writes ``device_check.txt`` (the table), ``device_check.json``
(the same, for scripts) and ``device_check.log`` (every stage's log, its tail where long) into ``--out``.
Standard library only: it must print a table even when nothing could be installed.

    python scripts/device_check_report.py table WORK --out DIR
    python scripts/device_check_report.py versions     # the versions stage: GPU, driver, packages
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

LOG_TAIL_LINES = 400  # per stage in device_check.log


@dataclass
class Row:
    """One stage's line of the table."""

    stage: str
    status: str = "not run"
    seconds: str = ""
    figure: str = ""
    baseline: str = ""
    ratio: str = ""
    goal: str = ""


def last_float(text: str, pattern: str) -> float | None:
    """The number captured by the last match of ``pattern`` (commas allowed), or None."""
    found = re.findall(pattern, text, flags=re.MULTILINE)
    return float(found[-1].replace(",", "")) if found else None


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else ""


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f} ex/s"


def _versus_torchrec(ours: float | None, peer: float | None) -> dict:
    return {
        "figure": _rate(ours),
        "baseline": f"TorchRec {_rate(peer)}" if peer else "",
        "ratio": _ratio(ours, peer),
    }


def parse_train(text: str) -> dict:
    ours = last_float(text, r"^rectrain train examples/s ([\d.]+)")
    return _versus_torchrec(ours, last_float(text, r"^torchrec train examples/s ([\d.]+)"))


def parse_infer(text: str) -> dict:
    ours = last_float(text, r"^rectrain \w+ infer examples/s ([\d.]+)")
    return _versus_torchrec(ours, last_float(text, r"TorchRec ([\d,.]+) examples/s, ratio"))


def parse_ebc(text: str) -> dict:
    ours = last_float(text, r"^\s*rectrain ebc: +([\d.]+) ms/step")
    raw = last_float(text, r"^\s*raw fbgemm tbe: +([\d.]+) ms/step")
    return {
        "figure": "" if ours is None else f"{ours:.3f} ms/step",
        "baseline": "" if raw is None else f"raw FBGEMM {raw:.3f} ms/step",
        "ratio": f"{ours / raw:.3f}" if ours and raw else "",
    }


def parse_serve(text: str) -> dict:
    match = re.findall(r"^recserve served examples/s ([\d.]+) p99_ms ([\d.na]+) ratio ([\d.]+)", text, re.M)
    inproc = last_float(text, r"^in-process int8 predict at batch 512 on \S+: ([\d,.]+) examples/s")
    if not match:
        return {"baseline": f"in process {_rate(inproc)}" if inproc else ""}
    capacity, p99, ratio = match[-1]
    return {
        "figure": f"capacity {float(capacity):,.0f} ex/s, p99 {p99} ms at 50 %",
        "baseline": f"in process {_rate(inproc)}" if inproc else "",
        "ratio": f"{float(ratio):.2f}",
    }


def parse_pytest(text: str) -> dict:
    lines = [line for line in text.splitlines() if re.search(r"\b(passed|failed|error|skipped)\b", line)]
    summary = lines[-1].strip("= ") if lines else ""
    return {"figure": re.sub(r" in [\d.]+s.*$", "", summary)}


def parse_main_job(text: str, work: Path) -> dict:
    summary_file = work / "main" / "summary.json"
    if not summary_file.exists():
        return {}
    s = json.loads(summary_file.read_text())
    served = f"served {s['served_rows']} rows on {s.get('serving_device', '?')}"
    return {
        "figure": f"AUC {s['eval_auc']:.3f} after {s['train_steps']} steps; {served} "
        f"(max diff {s['served_max_abs_diff']:.1e}); load test "
        f"{s['throughput_examples_per_s']:,.0f} ex/s, p99 {s['latency_p99_ms']:.1f} ms",
    }


def parse_versions(text: str) -> dict:
    """``key=value`` lines written by the versions stage."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith(" "))


# stage -> (what it measures, goal, parser)
STAGES = {
    "install": ("carried wheels installed, stubs generated", "", None),
    "gpu_tests": ("pytest -m gpu", "all pass", parse_pytest),
    "main_job": ("recserve main --device cuda (train, export on GPU, serve, query, load test)", "ends", None),
    "train_2048": ("training, batch 2048, 1 GPU", ">= 1.1x", parse_train),
    "infer_512": ("int8 inference, batch 512", ">= 1.2x", parse_infer),
    "ebc_step": ("fused embedding step (fwd+bwd+update)", "<= 1.05", parse_ebc),
    "serve": ("recserve serve --device cuda, 32 clients x 64", "report", parse_serve),
    "train_16384": ("training, batch 16384, 1 GPU", ">= 1.1x", parse_train),
    "nccl_2": ("training, NCCL, 2 ranks, batch 2048/rank", "runs", parse_train),
}


def read_rows(work: Path) -> list[Row]:
    """One row per known stage, in table order, filled from ``stages.tsv`` and the stage logs."""
    rows = {name: Row(name, goal=goal) for name, (_, goal, _) in STAGES.items()}
    tsv = work / "stages.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        name, status, _, seconds = (line.split("\t") + ["", "", "", ""])[:4]
        row = rows.setdefault(name, Row(name))
        row.status, row.seconds = status, seconds
        log = work / f"{name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        parser = STAGES.get(name, ("", "", None))[2]
        found = parse_main_job(text, work) if name == "main_job" else parser(text) if parser else {}
        for key, value in found.items():
            setattr(row, key, value)
    versions = rows.pop("versions", None)  # shown in the table's head; a row only when it failed
    return list(rows.values()) + ([versions] if versions and versions.status != "ok" else [])


def format_table(rows: list[Row], versions: dict) -> str:
    head = [
        "== GPU device check ==",
        f"GPU: {versions.get('gpu', 'unknown')} ({versions.get('gpus', '?')} visible), "
        f"driver {versions.get('driver', '?')}",
        "versions: "
        + ", ".join(
            f"{k} {versions[k]}"
            for k in ("python", "torch", "cuda", "fbgemm_gpu", "torchrec", "rectrain")
            if k in versions
        ),
        "",
    ]
    columns = ["stage", "status", "s", "figure", "baseline", "ratio", "goal"]
    cells = [[r.stage, r.status, r.seconds, r.figure, r.baseline, r.ratio, r.goal] for r in rows]
    widths = [max(len(c[i]) for c in [columns, *cells]) for i in range(len(columns))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [columns, *cells]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    what = [f"  {name}: {STAGES[name][0]}" for name in STAGES]
    return "\n".join(head + lines + ["", "stages:", *what])


def write_outputs(work: Path, out: Path, table: str, rows: list[Row], versions: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_check.txt").write_text(table + "\n")
    report = {"versions": versions, "stages": [asdict(r) for r in rows]}
    (out / "device_check.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "device_check.log", "w") as log:
        for name in ["versions", *STAGES]:
            path = work / f"{name}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()
                cut = f" (last {LOG_TAIL_LINES} of {len(lines)} lines)" if len(lines) > LOG_TAIL_LINES else ""
                log.write(f"===== {name}{cut}\n" + "\n".join(lines[-LOG_TAIL_LINES:]) + "\n")


def print_versions() -> None:
    """``key=value`` lines: the GPU, its driver and the versions the check ran with (imports torch)."""
    import importlib.metadata as md
    import os
    import platform
    import subprocess

    import torch

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    def output(command: list[str]) -> str:
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    smi = os.environ.get("NVIDIA_SMI", "nvidia-smi")
    rev = output(["git", "rev-parse", "--short", "HEAD"])
    found = {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "driver": output([smi, "--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "fbgemm_gpu": version("fbgemm-gpu"),
        "torchrec": version("torchrec"),
        "rectrain": version("rectrain") + (f" (tree {rev})" if rev else ""),
    }
    for key, value in found.items():
        print(f"{key}={value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    table = commands.add_parser("table", help="print (and save) the table of a check's stage logs")
    table.add_argument("work", type=Path, help="the stage logs and stages.tsv")
    table.add_argument("--out", type=Path, help="also write the table, JSON and logs here")
    commands.add_parser("versions", help="print the GPU and the versions (key=value lines)")
    args = parser.parse_args(argv)
    if args.command == "versions":
        print_versions()
        return 0
    versions_log = args.work / "versions.log"
    versions = parse_versions(versions_log.read_text()) if versions_log.exists() else {}
    rows = read_rows(args.work)
    table = format_table(rows, versions)
    print(table)
    if args.out is not None:
        write_outputs(args.work, args.out, table, rows, versions)
    # "not run": left out on purpose (--only, --no-install); a stage skipped for time counts as failed.
    return 0 if all(r.status in ("ok", "skipped (1 GPU)", "not run") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
