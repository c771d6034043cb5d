"""A/B of converted models between trees in one call: each tree's own package runs the models suite, the
trees alternated round by round, and a table of every run's torch and cupyconv ms per tree.
    python benchmarks/profile/ab_models.py OLD=scratch/old NEW=. --model resnet50:8 --model resnet50:32 \
        [--rounds 2] [--dtype fp16] [--layout channels_last] [--timing graph] [--fuse] [--out DIR] [--dry-run]
Each run is `python -m cupyconv.bench --suite models` started inside its tree with the tree first on
PYTHONPATH: `python -m` puts the working directory first on sys.path, so a tree's runs started from another
directory would import that directory's package (NOTES.md, "Fewer launches for split-K calls"). Before any
run, each tree's `cupyconv` is imported the same way and must resolve inside that tree. --dry-run only checks
that and prints the commands."""
import argparse
import os
import pathlib
import subprocess
import sys


def tree_env(tree: pathlib.Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree)}


def package_of(tree: pathlib.Path) -> pathlib.Path:
    """Where ``import cupyconv`` resolves when started inside ``tree`` as the runs are."""
    found = subprocess.run([sys.executable, "-c", "import cupyconv; print(cupyconv.__file__)"], cwd=tree,
                           env=tree_env(tree), capture_output=True, text=True)
    if found.returncode:
        sys.exit(f"ab_models: no cupyconv to import in {tree}:\n{found.stderr.strip().splitlines()[-1]}")
    return pathlib.Path(found.stdout.strip()).resolve().parent


def bench_command(args, model: str, batch: str, label: str) -> list[str]:
    return [sys.executable, "-m", "cupyconv.bench", "--suite", "models", "--model", model, "--batch", batch,
            "--dtype", args.dtype, "--layout", args.layout, "--timing", args.timing,
            "--out", str(pathlib.Path(args.out).resolve() / label), "--commit", label] + \
        (["--fuse"] if args.fuse else [])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="+", metavar="LABEL=PATH")
    parser.add_argument("--model", action="append", required=True, metavar="MODEL:BATCH")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--layout", default="channels_last")
    parser.add_argument("--timing", default="graph")
    parser.add_argument("--out", default=os.environ.get("OUT", "ab_models_out"))
    parser.add_argument("--timeout", type=int, default=60, help="seconds a run")
    parser.add_argument("--fuse", action="store_true", help="convert(model, fuse=True) in every run")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    trees = {}
    for item in args.trees:
        label, _, path = item.partition("=")
        if not path:
            parser.error(f"{item!r}: trees are LABEL=PATH")
        trees[label] = pathlib.Path(path).resolve()
    for label, tree in trees.items():
        package = package_of(tree)
        if package != tree / "cupyconv":
            sys.exit(f"ab_models: {label}'s runs would import {package}, not {tree / 'cupyconv'}")
        print(f"{label}: {package}", flush=True)
    rows = {}
    for round_ in range(args.rounds):
        for item in args.model:
            model, _, batch = item.partition(":")
            for label, tree in trees.items():
                command = bench_command(args, model, batch or "8", label)
                if args.dry_run:
                    print(f"(cd {tree} && PYTHONPATH={tree} {' '.join(command)})")
                    continue
                try:
                    run = subprocess.run(command, cwd=tree, env=tree_env(tree), capture_output=True, text=True,
                                         timeout=args.timeout)
                    lines = [line for line in run.stdout.splitlines() if f"| {args.timing} |" in line]
                except subprocess.TimeoutExpired:
                    lines = []
                for line in lines or [f"| {model} | {batch} | no result (timeout or error) |"]:
                    print(f"{label} {line}", flush=True)
                    cells = [cell.strip() for cell in line.strip("|").split("|")]
                    if len(cells) > 9:  # model, dtype, layout, batch, timing, variant, torch ms, ours ms, ratio
                        rows.setdefault((model, batch), {}).setdefault(label, []).append(f"{cells[6]} / {cells[7]}")
    if rows:
        print(f"\n| model | batch | {' | '.join(trees)} |\n| --- | --- |{' --- |' * len(trees)}")
        for (model, batch), runs in rows.items():
            print(f"| {model} | {batch} | " + " | ".join(", ".join(runs.get(label, [])) for label in trees) + " |")


if __name__ == "__main__":
    main()
