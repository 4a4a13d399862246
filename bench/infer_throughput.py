"""In-process inference throughput of exported packages on the standard workload (docs/benchmarks.md).

Exports the workload's DLRM (8 tables x 100,000 x 64, bottom 13-512-256-64, top 512-256-1; random init as in
the peer script) once per table dtype through ``recserve.export.export_package``, loads each package with
``Predictor.load`` and times ``predict`` (validation, quantized FBGEMM lookups, dense part, sigmoid) at each
batch size, on the peer script's request (ids per feature uniform 1..39, ids uniform over the table).

    .venv/bin/python bench/infer_throughput.py --dtype int8 --batch 512 [--dtypes int8,int4,fp16,fp32]
        [--batches 1,64,512,2048] [--seconds 1.0] [--repeats 3] [--no-peer] [--peer-python PATH]
        [--compile] [--device cpu|cuda]

The peer, ``bench/torchrec_reference.py infer`` (TorchRec's quantized DLRM, its venv built by
scripts/torchrec_venv.sh on first use, or ``--peer-python`` / ``$RECTRAIN_PEER_PYTHON``), runs ``--repeats``
times alternating with our run at ``--dtype`` and ``--batch``, on the same device; each side reports its best
run (on a shared machine other load only slows a run down).
``--device cuda`` loads the packages on GPU 0 (lookups and dense part); a request still arrives on the CPU and
its scores return there, as the server hands them over, so the copies count. The default batch sizes then
add 4096 and 16384, where a GPU starts to fill.
``--compile`` also times the dense part under ``torch.compile``; ``--dense-dtypes bf16`` (the default) also
times the ``--dtype`` package with a bf16 dense part (on CPUs with AVX512-BF16 or AMX, oneDNN runs it much
faster; it is not the peer's fp32 dense part, so it stays out of the ratio). Also prints package size and
accuracy per dtype. Last line:
``rectrain <dtype> infer examples/s <N>``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import print_machine
from torchrec_reference import check_gpus, peer_python

from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor, read_manifest
from rectrain import EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.models import build_model
from rectrain.models.config import ModelConfig

T, E, D, DENSE, L = 8, 100_000, 64, 13, 20
BENCH = Path(__file__).resolve().parent
DEFAULT_BATCHES = {"cpu": "1,64,512,2048", "cuda": "1,64,512,2048,4096,16384"}


def workload_config() -> ModelConfig:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=E, embedding_dim=D, feature_names=[f"f{i}"])
        for i in range(T)
    ]
    return ModelConfig(
        kind="dlrm",
        tables=tables,
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[512, 256, D],
        over_arch_layer_sizes=[512, 256, 1],
    )


def make_request(batch: int) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """The peer script's request, draw for draw."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 2 * L, (T * batch,), generator=g)
    values = torch.randint(0, E, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(T)], values=values, lengths=lengths
    )
    return torch.randn(batch, DENSE, generator=g), kjt


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work before a clock read (``predict`` returns CPU scores, so this is a guard)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def examples_per_second(predictor: Predictor, batch: int, seconds: float) -> float:
    dense, kjt = make_request(batch)
    for _ in range(3):
        predictor.predict(dense, kjt)
    synchronize(predictor.device)
    runs, start = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - start < seconds:
        predictor.predict(dense, kjt)
        runs += 1
    synchronize(predictor.device)
    return batch * runs / (time.perf_counter() - start)


def peer_examples_per_second(batch: int, device: str, python: str | None) -> float | None:
    command = ["infer", "--batch", str(batch)] + ([] if device == "cpu" else ["--device", device])
    try:
        out = subprocess.run(
            [peer_python(python), str(BENCH / "torchrec_reference.py"), *command],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (subprocess.CalledProcessError, OSError) as error:
        stderr = getattr(error, "stderr", None) or ""
        print(f"peer unavailable: {error}\n{stderr[-4000:]}", file=sys.stderr)
        return None
    return float(out.strip().splitlines()[-1].split()[-1])


def export_all(root: Path, dtypes: list[str], dense_dtype: str = "fp32") -> dict[str, Path]:
    cfg = workload_config()
    torch.manual_seed(0)
    state = build_model(cfg).state_dict()
    sample = synthetic_sample(cfg, num_examples=2048, ids_per_feature=(1, 2 * L - 1))
    packages = {}
    for dtype in dtypes:
        started = time.perf_counter()
        packages[dtype] = export_package(
            root / f"{dtype}-{dense_dtype}",
            model_config=cfg,
            state_dict=state,
            dtype=dtype,
            dense_dtype=dense_dtype,
            accuracy_sample=sample,
            force=True,
        )
        print(f"exported {dtype} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return packages


def print_packages(packages: dict[str, Path]) -> None:
    print(f"{'tables':<7} {'package MiB':>12} {'max|dlogit|':>12} {'mean|dlogit|':>13} {'AUC diff':>9}")
    for dtype, path in packages.items():
        manifest = read_manifest(path)
        size = sum(f["bytes"] for f in manifest.files.values()) / 2**20
        acc = manifest.accuracy["package"]
        print(
            f"{dtype:<7} {size:>12.1f} {acc['max_abs_logit_diff']:>12.2e} "
            f"{acc['mean_abs_logit_diff']:>13.2e} {acc['auc_diff']:>+9.5f}"
        )


def print_dense_variant(root: Path, args: argparse.Namespace, dense_dtype: str, fp32_best: float) -> None:
    """The ``--dtype`` package with a lower-precision dense part: speed and accuracy against fp32 weights.

    Not comparable with TorchRec's fp32 dense part; reported on its own line, never in the last line.
    """
    package = export_all(root, [args.dtype], dense_dtype)[args.dtype]
    predictor = Predictor.load(package, device=args.device)
    best = max(examples_per_second(predictor, args.batch, args.seconds) for _ in range(args.repeats))
    acc = read_manifest(package).accuracy["package"]
    print(
        f"{args.dtype} tables + {dense_dtype} dense, batch {args.batch}: {best:,.0f} examples/s "
        f"({best / fp32_best:.2f}x fp32 dense); max|dlogit| {acc['max_abs_logit_diff']:.2e}, "
        f"AUC diff {acc['auc_diff']:+.5f}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="int8")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--dtypes", default="int8,int4,fp16,fp32")
    parser.add_argument(
        "--batches",
        help=f"comma-separated (default {DEFAULT_BATCHES['cpu']}; on cuda {DEFAULT_BATCHES['cuda']})",
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per point")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the packages run")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument(
        "--peer-python",
        metavar="PATH",
        help="interpreter that imports torchrec (default $RECTRAIN_PEER_PYTHON, else the TorchRec venv)",
    )
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the dense part")
    parser.add_argument(
        "--dense-dtypes",
        default="bf16",
        help="also time the --dtype package with these dense dtypes (comma-separated; '' for none)",
    )
    args = parser.parse_args()
    problem = check_gpus(args.device, 1)
    if problem:
        parser.error(problem)
    return args


def main() -> None:
    args = parse_args()
    print_machine(args.device)
    torch.set_num_threads(os.cpu_count() or 1)
    dtypes = list(dict.fromkeys([args.dtype, *args.dtypes.split(",")]))
    batches = [int(b) for b in (args.batches or DEFAULT_BATCHES[args.device]).split(",")]
    with tempfile.TemporaryDirectory(prefix="recserve-bench-") as tmp:
        packages = export_all(Path(tmp), dtypes)
        print_packages(packages)
        predictors = {dtype: Predictor.load(path, device=args.device) for dtype, path in packages.items()}
        on = "" if args.device == "cpu" else f", on {args.device}"
        print(f"\nexamples/s (best of {args.repeats}), {torch.get_num_threads()} threads{on}")
        print(f"{'tables':<7}" + "".join(f"{f'batch {b}':>13}" for b in batches))
        for dtype, predictor in predictors.items():
            best = [
                max(examples_per_second(predictor, b, args.seconds) for _ in range(args.repeats))
                for b in batches
            ]
            print(f"{dtype:<7}" + "".join(f"{x:>13,.0f}" for x in best))
        ours, peer = [], []
        for _ in range(args.repeats):  # alternate, so both sides see the same machine load
            ours.append(examples_per_second(predictors[args.dtype], args.batch, args.seconds))
            if not args.no_peer:
                peer.append(peer_examples_per_second(args.batch, args.device, args.peer_python) or 0.0)
        print(f"\nbatch {args.batch}, {args.dtype}: rectrain {max(ours):,.0f} examples/s", end="")
        if peer and max(peer) > 0:
            print(f", TorchRec {max(peer):,.0f} examples/s, ratio {max(ours) / max(peer):.2f}x")
        else:
            print()
        if args.compile:
            compiled = Predictor.load(packages[args.dtype], device=args.device, compile_dense=True)
            started = time.perf_counter()
            examples_per_second(compiled, args.batch, 0.0)
            print(f"torch.compile of the dense part: {time.perf_counter() - started:.0f} s to compile")
            best = max(examples_per_second(compiled, args.batch, args.seconds) for _ in range(args.repeats))
            print(f"compiled dense: {best:,.0f} examples/s ({best / max(ours):.2f}x eager)")
        for dense_dtype in filter(None, args.dense_dtypes.split(",")):
            print_dense_variant(Path(tmp), args, dense_dtype, max(ours))
    if peer and max(peer) > 0:
        print(f"torchrec {args.dtype} infer examples/s {max(peer):.0f}")
        print(f"ratio vs torchrec {max(ours) / max(peer):.2f}")
    print(f"rectrain {args.dtype} infer examples/s {max(ours):.0f}")


if __name__ == "__main__":
    main()
