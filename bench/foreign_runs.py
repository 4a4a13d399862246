"""docs/training.md's command on bench/foreign_criteo.py's rules, beside each rule's best AUC and plain model.

    python bench/foreign_runs.py run RECIPE RULE
    python bench/foreign_runs.py table [--ranks 1,2] [--recipes A.toml,B.toml] [--set K=V ...] [RULE ...]

A run trains ``examples/RECIPE`` with ``rectrain train`` (``torchrun --nproc-per-node N -m rectrain train``
for N ranks): one epoch, the held-out file as ``data.eval_paths``, every held-out row scored at the end.
``table`` prints one line per (recipe, rule, ranks) with the rule's best AUC, bench/recipes.py's plain model
(one epoch at batch 1,024, seed 0) and the recipe's held-out AUC, then a summary. A run passes when it is
within 0.02 of the best AUC (issue 14's criterion). ``--set`` overrides go to every recipe run (to try a
change on all rules at once). The training output of each run is in /tmp/foreign/<rule>/<recipe>-<N>r/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import foreign_criteo as fc
from machine import machine_line

# probe (the earlier sessions' rule) and the rules calibrated like the issue's file.
TABLE_RULES = ("probe", "latent", "few", "trees", "hashed", "mixed")
TABLE_RECIPES = ("dlrm_criteo.toml", "dcn_criteo.toml")
MARGIN = 0.02


def recipe_auc(recipe: str, facts: dict, out: Path, ranks: int = 1, extra: tuple[str, ...] = ()) -> float:
    """docs/training.md's command line on the rule's files; the final held-out AUC from its metrics log."""
    out = out / f"{Path(recipe).stem}-{ranks}r"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: no checkpoint of an earlier one to resume
    out.mkdir(parents=True)
    log = out / "metrics.jsonl"
    sets = [
        f'data.paths=["{facts["train"]}"]',
        f'data.eval_paths=["{facts["test"]}"]',
        # Every held-out row whatever the recipe's batch size (evaluation ends with the file): a count
        # sized for 512-row batches scored a recipe at 128 on a quarter of them.
        f"train.eval_batches={facts['rule']['test_rows']}",
        f'train.metrics_log="{log}"',
        f'checkpoint.dir="{out / "checkpoints"}"',
        *extra,
    ]
    launch = [sys.executable, "-m", "rectrain"]
    if ranks > 1:  # torchrun; --standalone picks a free port
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
        launch += ["-m", "rectrain"]
    command = [*launch, "train", "--config", f"examples/{recipe}", "--no-progress", "--overwrite"]
    command += [arg for s in sets for arg in ("--set", s)]
    with open(out / "train.log", "w") as output:
        done = subprocess.run(
            command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    if done.returncode:
        tail = (out / "train.log").read_text().splitlines()[-20:]
        raise SystemExit("\n".join([f"{' '.join(command)} failed ({done.returncode}):", *tail]))
    evals = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "eval"]
    return evals[-1]["auc"]


def plain_reference(facts: dict) -> float:
    """bench/recipes.py's plain PyTorch model, one epoch at batch 1,024."""
    import recipes

    train, test = recipes.read(Path(facts["train"])), recipes.read(Path(facts["test"]))
    return recipes.plain_auc(train, test, steps=math.ceil(len(train[0]) / 1024))


def table(rules, recipes, ranks, extra: tuple[str, ...] = ()) -> None:
    print(machine_line(), flush=True)
    if extra:
        print("with --set " + " --set ".join(extra))
    passed, runs, plain_close = 0, 0, 0
    for name in rules:
        facts = fc.generate(fc.RULES[name])
        best, plain = facts["best_auc"], plain_reference(facts)
        plain_close += best - plain <= MARGIN
        for recipe in recipes:
            for n in ranks:
                start = time.monotonic()
                ours = recipe_auc(recipe, facts, fc.OUT / name, n, extra)
                ok = best - ours <= MARGIN
                passed, runs = passed + ok, runs + 1
                print(
                    f"{recipe:<17} {name:<7} {n} rank{'s' if n > 1 else ' '}  best {best:.4f}  "
                    f"plain {plain:.4f} (-{best - plain:.4f})  ours {ours:.4f} (-{best - ours:.4f})  "
                    f"{'pass' if ok else 'FAIL'}  {time.monotonic() - start:.0f} s",
                    flush=True,
                )
    print(
        f"summary: {passed} of {runs} runs within {MARGIN} of the best AUC; "
        f"the plain model within {MARGIN} on {plain_close} of {len(rules)} rules"
    )


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="foreign_runs.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = ap.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="one recipe on one rule, 1 rank")
    one.add_argument("recipe")
    one.add_argument("rule", choices=list(fc.RULES))
    many = commands.add_parser("table", help="every recipe on every rule")
    many.add_argument("--ranks", default="1", help="comma-separated rank counts")
    many.add_argument("--recipes", default=",".join(TABLE_RECIPES))
    many.add_argument("--set", dest="extra", action="append", default=[], help="override for every run")
    many.add_argument("rules", nargs="*", help=f"default: {' '.join(TABLE_RULES)}")
    args = ap.parse_args(argv)
    if args.command == "run":
        print(machine_line())
        facts = fc.generate(fc.RULES[args.rule])
        ours, plain = recipe_auc(args.recipe, facts, fc.OUT / args.rule), plain_reference(facts)
        print(
            f"{args.recipe} on {args.rule}: held-out AUC {ours:.4f}; plain model {plain:.4f}; "
            f"best possible {facts['best_auc']:.4f} (gap {facts['best_auc'] - ours:.4f})"
        )
        return
    unknown = [r for r in args.rules if r not in fc.RULES]
    if unknown:  # not choices=: argparse rejects an empty nargs="*" list against choices
        many.error(f"unknown rule(s) {', '.join(unknown)}; rules: {', '.join(fc.RULES)}")
    ranks = [int(n) for n in args.ranks.split(",")]
    table(args.rules or TABLE_RULES, args.recipes.split(","), ranks, tuple(args.extra))


if __name__ == "__main__":
    main(sys.argv[1:])
