"""GPU time of suite rows on forced channels-last GEMM tiles, one line per row and tile, for A/B runs of
two trees (run it with each tree's package on PYTHONPATH, alternately):

    PYTHONPATH=$PWD python3 benchmarks/profile/forced_tiles.py tf32 channels_last r50_l1_3x3_64 ... \\
        --config=nhwc_m128n64k32 ...

Rows are named as in cupyconv/bench.py; each is planned on each tile (split-K and stream-K as the
rules decide), timed by plan_timing.time_plans (interleaved runs behind a spin kernel, NaN-poisoned
outputs checked against the first tile's), and printed with whether x was read in place (round_a)."""
import sys

from plan_timing import time_plans

from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS
from cupyconv.compiler import compute_capability
from cupyconv.planner import NHWC_KERNEL, make_plan


def main() -> None:
    mode, layout, *names = sys.argv[1:]
    configs = [n.split("=", 1)[1] for n in names if n.startswith("--config=")]
    names = [n for n in names if not n.startswith("--config=")]
    shapes = {s.name: s for s in SEEDS + LAYERS + LARGE}
    for name in names:
        problem = shapes[name].problem(MODE_DTYPE[mode], layout)
        plans = {c: make_plan(problem, config=c, kernel=NHWC_KERNEL, allow_tf32=mode == "tf32",
                              compute_capability=compute_capability()) for c in configs}
        times = time_plans(problem, mode, plans, configs[0], configs[1:], (name,))
        for c, ms in times.items():
            print(f"{name} {mode} {c} round_a={plans[c].round_a} splits={plans[c].splits} {ms:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
