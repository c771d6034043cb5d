"""The channels-last GEMM's 128 x 128 wgmma tile with and without its producer warpgroup, in one process:
GPU time of each layers / large suite row whose fixed-rules plan takes the 128 x 128 pixel-row tile
(or of the rows named), that plan against the same tile fed by a producer warpgroup (or against the
tiles named by --config)
    python benchmarks/profile/producer.py [--dtype fp16 ...] [--layout channels_last ...] [--row NAME ...]
        [--config TILE ...] [--splits 1,2,3]
Medians of 50 runs each behind a spin kernel, interleaved (bench.alternating_ms), the weight prepared
in the call as the layers suite does; each row checked: the plans agree within the dtype's tolerance.
--splits times each tile at each split-K run count too (1: whole tiles; a count the row's grid or k tiles
cannot take is left out)."""
import argparse

from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS
from cupyconv.compiler import compute_capability
from cupyconv.families.implicit_gemm_nhwc import NHWC_CONFIGS, PIXEL_ROWS_CONFIG
from cupyconv.planner import NHWC_KERNEL, make_plan
from plan_timing import TOLERANCE, time_plans



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    parser.add_argument("--layout", action="append", choices=("nchw", "channels_last"))
    parser.add_argument("--row", action="append", help="rows to time whatever tile the rules take")
    parser.add_argument("--config", action="append", help="channels-last tiles to time instead of the producer's")
    parser.add_argument("--splits", default="1", help="split-K run counts to time each tile at")
    args = parser.parse_args()
    cc = compute_capability()
    tiles = args.config or [c.name for c in NHWC_CONFIGS["float16"] if c.producer_warps]
    splits = [int(s) for s in args.splits.split(",")]
    producers = [t if s == 1 else f"{t} split {s}" for t in tiles for s in splits]
    print("| row | mode | layout | rule's plan | tiles | rule ms | 128 x 128 ms |" + "".join(f" {p} ms |" for p in producers)
          + " best producer / rule |")
    print("| --- " * (7 + len(producers)) + "|")
    for shape in SEEDS + LAYERS + LARGE:
        for mode in args.dtype or ("fp16", "bf16", "tf32"):
            for layout in args.layout or ("channels_last", "nchw"):
                problem = shape.problem(MODE_DTYPE[mode], layout)
                plan = make_plan(problem, allow_tf32=True, compute_capability=cc)
                if (shape.name not in args.row) if args.row else plan.config.name != PIXEL_ROWS_CONFIG:
                    continue
                if plan.kernel != NHWC_KERNEL:
                    continue
                try:
                    plans = {"rule": plan, "plain": make_plan(problem, PIXEL_ROWS_CONFIG, NHWC_KERNEL, True, cc,
                                                              stream_k=False)}
                except ValueError:
                    continue
                for t in tiles:
                    for s in splits:
                        try:
                            plans[t if s == 1 else f"{t} split {s}"] = make_plan(problem, t, NHWC_KERNEL, True, cc,
                                                                                 splits=s)
                        except ValueError:  # a tile that cannot run this row (the producer's: groups, k tiles
                            pass            # across taps), or more runs than it takes
                if not set(producers) & set(plans):
                    continue
                ms = time_plans(problem, mode, plans, "plain", [p for p in producers if p in plans],
                                (shape.name, mode, layout))
                best = min(ms[p] for p in producers if p in ms)
                print(f"| {shape.name} | {mode} | {layout} | {plan.config.name}"
                      f"{' stream-K' if plan.stream_k_blocks else ''}{f' split {plan.splits}' if plan.splits > 1 else ''}"
                      f" | {plan.grid[0] * plan.grid[1] * plan.grid[2]} | {ms['rule']:.4f} | {ms['plain']:.4f} |"
                      + "".join(f" {ms[p]:.4f} |" if p in ms else " - |" for p in producers)
                      + f" {ms['rule'] / best:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
