#!/usr/bin/env python3
"""Run TorchRec's own unit tests and example programs against rectrain, with only their imports changed.

Given a TorchRec source tree (``git clone https://github.com/meta-pytorch/torchrec``, tag v1.8.0; nothing of
it is copied into this repository), each chosen test file and example is copied into a temporary directory
with ``torchrec`` imports rewritten to ``rectrain`` (``import torchrec`` becomes ``import rectrain as
torchrec``, so attribute paths in the code still resolve; ``mock.patch("torchrec.x.y")`` targets, which mock
imports, point at ``rectrain.x.y``), then run; a line per file says what passed.

    python scripts/torchrec_conformance.py --torchrec-src ~/src/torchrec          # the default set
    python scripts/torchrec_conformance.py --torchrec-src ~/src/torchrec \
        --tests torchrec/optim/tests/test_keyed.py --examples
    python scripts/torchrec_conformance.py --torchrec-src ~/src/torchrec \
        --package torchrec --python <torchrec venv>/bin/python                   # TorchRec's own counts

``--package torchrec`` runs the same files unchanged (with TorchRec's venv as ``--python``): the reference
counts. Examples run with reduced sizes through their own arguments (``EXAMPLES`` below) on CPU and gloo.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Issue 46's measure: per file, the tests that pass under TorchRec on CPU (``--measure --package torchrec``).
REFERENCE = ROOT / "scripts" / "torchrec_reference_counts.json"

# The unit-test files of issue 36 (each passes under TorchRec 1.8.0 on CPU).
TESTS = [
    "torchrec/modules/tests/test_embedding_modules.py",
    "torchrec/modules/tests/test_crossnet.py",
    "torchrec/modules/tests/test_mlp.py",
    "torchrec/modules/tests/test_deepfm.py",
    "torchrec/modules/tests/test_mc_modules.py",
    "torchrec/modules/tests/test_mc_embedding_modules.py",
    "torchrec/modules/tests/test_hash_mc_modules.py",
    "torchrec/modules/tests/test_hash_mc_metrics.py",
    "torchrec/optim/tests/test_rowwise_adagrad.py",
    "torchrec/optim/tests/test_optim.py",
    "torchrec/optim/tests/test_warmup.py",
    "torchrec/optim/tests/test_clipping.py",
    "torchrec/optim/tests/test_keyed.py",
    "torchrec/distributed/planner/tests/test_enumerators.py",
    "torchrec/distributed/tests/test_embedding_sharding.py",
    "torchrec/distributed/tests/test_embedding_types.py",
    "torchrec/datasets/tests/test_criteo.py",
    "torchrec/datasets/tests/test_movielens.py",
    "torchrec/datasets/tests/test_random.py",
    "torchrec/datasets/tests/test_utils.py",
    # Issue 46: metrics (the value tests launch 4 gloo ranks per test: minutes per file on a small machine)
    "torchrec/metrics/tests/test_ne.py",
    "torchrec/metrics/tests/test_auc.py",
    "torchrec/metrics/tests/test_calibration.py",
    "torchrec/metrics/tests/test_ctr.py",
    "torchrec/metrics/tests/test_mse.py",
    "torchrec/metrics/tests/test_accuracy.py",
    "torchrec/metrics/tests/test_recall.py",
    "torchrec/metrics/tests/test_precision.py",
    "torchrec/metrics/tests/test_throughput.py",
    "torchrec/metrics/tests/test_recmetric.py",
    "torchrec/metrics/tests/test_metrics_namespace.py",
    # Issue 44: TorchRec's planner test files that pass under TorchRec 1.8.0 on CPU (docs/torchrec.md has
    # the counts and what fails). (test_shard_estimators imports torchrec.distributed.tests, which TorchRec's
    # package does not ship: it fails under TorchRec too.)
    "torchrec/distributed/planner/tests/test_perf_models.py",
    "torchrec/distributed/planner/tests/test_constants.py",
    "torchrec/distributed/planner/tests/test_storage_reservations.py",
    "torchrec/distributed/planner/tests/test_planners.py",
    "torchrec/distributed/planner/tests/test_types.py",
    "torchrec/distributed/planner/tests/test_utils.py",
    "torchrec/distributed/planner/tests/test_proposers.py",
    "torchrec/distributed/planner/tests/test_partitioners.py",
    "torchrec/distributed/planner/tests/test_stats.py",
    "torchrec/distributed/planner/tests/test_embedding_utils.py",
    "torchrec/distributed/planner/tests/test_embeddingbag_utils.py",
    "torchrec/distributed/tests/test_utils.py",
    # issue 46 (shard, multi_process, comm_ops): TorchRec's multi-process harness on gloo; the test that runs
    # on CPU (its other 6 need NCCL) all-gathers through comm_ops.all_gather_base_pooled.
    "torchrec/distributed/tests/test_comm.py",
    # issue 46's measure: files that pass whole against rectrain in seconds (the sparse types; lazy awaitables
    # as TorchRec's, proxied under torch.fx; gradient accumulation; SwishLayerNorm; utils.experimental)
    "torchrec/sparse/tests/test_jagged_tensor.py",
    "torchrec/sparse/tests/test_jagged_tensor_validator.py",
    "torchrec/sparse/tests/test_keyed_jagged_tensor.py",
    "torchrec/sparse/tests/test_keyed_tensor.py",
    "torchrec/distributed/tests/test_awaitable.py",
    "torchrec/distributed/tests/test_lazy_awaitable.py",
    "torchrec/fx/tests/test_tracer.py",
    "torchrec/distributed/train_pipeline/tests/test_gradient_accumulation.py",
    "torchrec/modules/tests/test_activation.py",
    "torchrec/utils/tests/test_experimental.py",
]

_SMALL = "num_embeddings=1000, embedding_dim=16, num_iterations=20"
# name -> (directory copied, ranks, python statement run in that directory's parent).
EXAMPLES = {
    "golden_training/train_dlrm.py@1": (
        "golden_training",
        1,
        f"from golden_training.train_dlrm import train; train({_SMALL})",
    ),
    "golden_training/train_dlrm.py@2": (
        "golden_training",
        2,
        f"from golden_training.train_dlrm import train; train({_SMALL})",
    ),
    "golden_training/train_dlrm_data_parallel.py@2": (
        "golden_training",
        2,
        f"from golden_training.train_dlrm_data_parallel import train; train({_SMALL})",
    ),
    "prediction/predict_using_torchrec.py": (
        "prediction",
        0,
        "from prediction.predict_using_torchrec import main; main()",
    ),
    "retrieval/two_tower_train.py@1": (
        "retrieval",
        1,
        "import sys, types; f = sys.modules.setdefault('faiss', types.ModuleType('faiss')); "
        "f.GpuIndexIVFPQ = f.IndexIVFPQ = object; "
        "sys.modules.setdefault('faiss.contrib', types.ModuleType('faiss.contrib')); "
        "sys.modules.setdefault('faiss.contrib.torch_utils', types.ModuleType('faiss.contrib.torch_utils')); "
        "import retrieval.two_tower_train as t; t.get_index = lambda **k: types.SimpleNamespace("
        "train=lambda x: None, add=lambda x: None); "
        "t.train(num_embeddings=1000, embedding_dim=16, num_iterations=20)",
    ),
    # The example's own main() path: save_dir quantizes (inference.modules.quantize_embeddings) and saves
    # model.pt, which recserve exports (tests/inference/test_two_tower_example.py serves it).
    "retrieval/two_tower_train.py save_dir@1": (
        "retrieval",
        1,
        "import os, sys, types; f = sys.modules.setdefault('faiss', types.ModuleType('faiss')); "
        "f.GpuIndexIVFPQ = f.IndexIVFPQ = object; "
        "f.write_index = lambda index, path: open(path, 'wb').close(); "
        "sys.modules.setdefault('faiss.contrib', types.ModuleType('faiss.contrib')); "
        "sys.modules.setdefault('faiss.contrib.torch_utils', types.ModuleType('faiss.contrib.torch_utils')); "
        "import retrieval.two_tower_train as t; t.get_index = lambda **k: types.SimpleNamespace("
        "train=lambda x: None, add=lambda x: None); os.makedirs('saved', exist_ok=True); "
        "t.train(num_embeddings=1000, embedding_dim=16, num_iterations=20, save_dir='saved'); "
        "assert os.path.getsize('saved/model.pt') > 0",
    ),
    "zch/main.py": (
        "zch",
        0,
        "import sys, runpy; sys.argv = ['main', '--num_iters', '20']; "
        "runpy.run_module('zch.main', run_name='__main__')",
    ),
    "zch/main.py --use_mpzch": (
        "zch",
        0,
        "import sys, runpy; sys.argv = ['main', '--num_iters', '20', '--use_mpzch']; "
        "runpy.run_module('zch.main', run_name='__main__')",
    ),
}

_FROM = re.compile(r"^(\s*)from torchrec(\.|\s)", re.MULTILINE)
_IMPORT_AS = re.compile(r"^(\s*)import torchrec(\.[\w.]+)? as ", re.MULTILINE)
_IMPORT = re.compile(r"^(\s*)import torchrec(\.[\w.]+)?\s*$", re.MULTILINE)
# unittest.mock imports its string targets: patch("torchrec.x.y") is an import of torchrec.x; so is a
# module-path constant that tests build targets from (``THROUGHPUT_PATH = "torchrec.metrics.throughput"``),
# and a module's logger that a test listens on (``assertLogs("torchrec.x.y")``, named by ``__name__``).
_PATCH = re.compile(
    r"""(\bpatch\(\s*["']|\bassertLogs\(\s*["']|^[A-Z_]+_PATH\s*=\s*["'])torchrec\.""", re.MULTILINE
)


def rewrite(source: str, package: str) -> str:
    """``source`` with its ``torchrec`` imports pointing at ``package`` (nothing else changes)."""
    if package == "torchrec":
        return source
    source = _FROM.sub(lambda m: f"{m.group(1)}from {package}{m.group(2)}", source)
    source = _PATCH.sub(lambda m: f"{m.group(1)}{package}.", source)
    source = _IMPORT_AS.sub(lambda m: f"{m.group(1)}import {package}{m.group(2) or ''} as ", source)
    # "import torchrec.x.y" binds the name torchrec: keep it bound, to the package.
    return _IMPORT.sub(
        lambda m: f"{m.group(1)}import {package}{m.group(2) or ''}; import {package} as torchrec", source
    )


def copy_rewritten(src: Path, dst: Path, package: str) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        for path in src.rglob("*.py"):
            copy_rewritten(path, dst / path.relative_to(src), package)
        return
    dst.write_text(rewrite(src.read_text(), package))


def _env(package: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", LOCAL_RANK="0")
    # The caller's PYTHONPATH stays behind this checkout (it may hold the test files' own imports, such as
    # pyre_extensions); a rectrain checkout on it must not shadow TorchRec in the reference runs.
    given = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    paths = ([str(ROOT)] if package == "rectrain" else []) + given
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _kill_group(process: subprocess.Popen) -> None:
    # Multi-process tests leave worker processes behind a killed pytest: end its whole session.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _run(command: list[str], env: dict[str, str], cwd: Path, timeout: int) -> tuple[int, str] | None:
    """The command's exit status and output, or None when it ran past ``timeout`` (its process group is
    killed)."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return None
    return process.returncode, output


def run_test(src: Path, relative: str, work: Path, python: str, package: str, timeout: int) -> dict:
    target = work / relative.replace("/", "_")
    copy_rewritten(src / relative, target, package)
    report = target.with_suffix(".xml")
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(target)]
    done = _run(command, _env(package), work, timeout)
    if done is None:
        return {"file": relative, "error": f"timed out after {timeout} s"}
    output = done[1]
    tail = output[-2000:]
    if not report.exists():
        return {"file": relative, "error": tail}
    if "ERROR collecting" in output:
        # The file did not import: count its tests (functions named test_*) as failed, name the cause.
        missing = re.findall(r"^E\s+(\w*Error: .*)$", output, re.MULTILINE)
        count = len(re.findall(r"^\s*def test_", (src / relative).read_text(), re.MULTILINE))
        return {
            "file": relative,
            "passed": 0,
            "failed": count,
            "skipped": 0,
            "failing": missing[:1],
            "import_error": (missing or ["collection error"])[0],
            "passing": [],
            "tail": tail,
        }
    suite = ElementTree.parse(report).getroot().find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed, passing = [], []
    for case in suite.iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name"))
        elif case.find("skipped") is None:
            passing.append(name)
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {
        "file": relative,
        "passed": passed,
        "failed": counts["failures"] + counts["errors"],
        "skipped": counts["skipped"],
        "failing": failed,
        "passing": passing,
        "tail": tail if not passed else "",
    }


def run_example(src: Path, name: str, work: Path, python: str, package: str, timeout: int) -> dict:
    folder, ranks, statement = EXAMPLES[name]
    run_dir = work / name.replace("/", "_").replace("@", "_")
    copy_rewritten(src / "examples" / folder, run_dir / folder, package)
    (run_dir / folder / "__init__.py").touch()
    if ranks:
        torchrun = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
        command = [*torchrun, "--no-python", python, "-c", statement]
    else:
        command = [python, "-c", statement]
    done = _run(command, _env(package), run_dir, timeout)
    if done is None:
        return {"file": name, "error": f"timed out after {timeout} s"}
    returncode, output = done
    return {
        "file": name,
        "passed": int(returncode == 0),
        "failed": int(returncode != 0),
        "tail": output[-3000:],
    }


def other_test_files(src: Path) -> list[str]:
    """The files of issue 46's measure: every test file under ``torchrec/`` but issue 36's list (the first 20
    of ``TESTS``), the planner's (issue 44 counts them) and the ``distributed/test_utils`` helpers."""
    found = sorted(
        str(path.relative_to(src))
        for pattern in ("test_*.py", "*_test.py")
        for path in (src / "torchrec").rglob(pattern)
    )
    skip = set(TESTS[:20])
    return [
        f
        for f in found
        if f not in skip and "/distributed/planner/" not in f and "/distributed/test_utils/" not in f
    ]


def _reference_entry(result: dict) -> dict:
    if "error" in result:
        return {"error": result["error"][-300:]}
    if "import_error" in result:
        return {"import_error": result["import_error"]}
    return {"passed": result["passing"], "failed": result["failed"], "skipped": result["skipped"]}


def write_reference(path: Path, results: list[dict], python: str, timeout: int) -> None:
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torchrec'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    old = json.loads(path.read_text())["files"] if path.exists() else {}
    old.update({r["file"]: _reference_entry(r) for r in results})
    reference = {
        "torchrec": version,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "timeout_s": timeout,
        "files": dict(sorted(old.items())),
    }
    path.write_text(json.dumps(reference, indent=1) + "\n")


def score(reference: dict, results: list[dict]) -> tuple[int, int]:
    """(tests passing under both, tests passing under TorchRec) over the files of ``reference``; a file
    not run here counts as failing."""
    ran = {r["file"]: set(r.get("passing", [])) for r in results}
    both = total = 0
    for file, entry in reference["files"].items():
        wanted = set(entry.get("passed", []))
        total += len(wanted)
        both += len(wanted & ran.get(file, set()))
    return both, total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--torchrec-src", type=Path, required=True, help="a TorchRec source tree (v1.8.0)")
    parser.add_argument(
        "--tests", nargs="*", default=None, help="test files relative to the tree (default: TESTS)"
    )
    parser.add_argument(
        "--examples", nargs="*", default=None, help=f"example names (default: all of {sorted(EXAMPLES)})"
    )
    parser.add_argument("--package", default="rectrain", choices=["rectrain", "torchrec"])
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs them")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per file")
    parser.add_argument("--jobs", type=int, default=1, help="files run at once")
    parser.add_argument(
        "--measure",
        action="store_true",
        help="issue 46's measure over other_test_files(): with --package torchrec, (re)write the reference "
        "counts; with rectrain, run the files with tests passing under TorchRec and score them",
    )
    parser.add_argument("--reference", type=Path, default=REFERENCE, help="the reference counts (JSON)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--verbose", action="store_true", help="print the output tail of failing files")
    args = parser.parse_args()
    src = args.torchrec_src.resolve()
    if not (src / "torchrec").is_dir():
        parser.error(f"--torchrec-src {src} holds no torchrec/ package")
    reference = None
    if args.measure and args.package == "rectrain":
        reference = json.loads(args.reference.read_text())
        default = [f for f, entry in reference["files"].items() if entry.get("passed")]
    else:
        default = other_test_files(src) if args.measure else TESTS
    tests = default if args.tests is None else args.tests
    examples = [] if args.measure else sorted(EXAMPLES) if args.examples is None else args.examples
    with tempfile.TemporaryDirectory(prefix="torchrec-conformance-") as tmp:
        work = Path(tmp)
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            jobs = [
                pool.submit(run_test, src, relative, work, args.python, args.package, args.timeout)
                for relative in tests
            ]
            jobs += [
                pool.submit(run_example, src, name, work, args.python, args.package, args.timeout)
                for name in examples
            ]
            results = []
            for job in as_completed(jobs):
                results.append(job.result())
                _print(results[-1], args.verbose)
                if args.measure and args.package == "torchrec":
                    # Written as each file ends: hours of reference runs survive an interruption.
                    write_reference(args.reference, results[-1:], args.python, args.timeout)
    passed = sum(r.get("passed", 0) for r in results if r["file"] in tests)
    total = sum(r.get("passed", 0) + r.get("failed", 0) for r in results if r["file"] in tests)
    print(
        f"unit tests: {passed}/{total} passed; examples: "
        f"{sum(r.get('passed', 0) for r in results if r['file'] in examples)}/{len(examples)} ran"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.measure and args.package == "torchrec":
        print(f"reference counts written to {args.reference}")
        return 0
    if reference is not None:
        both, of = score(reference, results)
        print(
            f"measure: {both} of the {of} tests passing under TorchRec {reference['torchrec']} pass "
            f"against rectrain ({100 * both / max(of, 1):.1f} %)"
        )
        return 0
    return 0 if all(not r.get("failed") and "error" not in r for r in results) else 1


def _print(result: dict, verbose: bool) -> None:
    if "error" in result:
        print(f"ERROR   {result['file']}: {result['error'][-300:]}")
        return
    status = "passed" if not result["failed"] else "FAILED"
    skipped = f", {result['skipped']} skipped" if result.get("skipped") else ""
    print(f"{status:7} {result['file']}: {result['passed']} passed, {result['failed']} failed{skipped}")
    if verbose and result.get("failing"):
        print("        failing: " + ", ".join(result["failing"]))
    if verbose and result["failed"] and result.get("tail"):
        print("        " + result["tail"][-1500:].replace("\n", "\n        "))


if __name__ == "__main__":
    sys.exit(main())
