"""Stream-K on and off in one process: GPU time of every layers / large suite row whose fixed-rules plan
takes stream-K (or of the rows named), with the same tile forced to whole tiles and to stream-K on
one block per SM (and on the block counts asked), in the modes and layouts asked; and the blocks of
each kernel resident per SM (the driver's occupancy calculator)
    python benchmarks/profile/stream_k.py [--dtype fp16 ...] [--layout channels_last ...] [--row NAME ...]
        [--blocks N ...]
Medians of 50 runs each behind a spin kernel, interleaved (bench.alternating_ms: the GPU's time
alone), the weight prepared in the call as the layers suite does; each row checked: the plans agree
within the dtype's tolerance."""
import argparse

from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS
from cupyconv.compiler import compute_capability, get_kernel
from cupyconv.planner import NHWC_KERNEL, make_plan, program
from plan_timing import TOLERANCE, time_plans



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    parser.add_argument("--layout", action="append", choices=("nchw", "channels_last"))
    parser.add_argument("--row", action="append", help="rows to time whether or not the rules take stream-K")
    parser.add_argument("--blocks", action="append", type=int, default=[], help="more stream-K block counts to time")
    args = parser.parse_args()
    cc = compute_capability()
    print("| row | mode | layout | tile | tiles | stream-K blocks | whole tiles ms | stream-K ms | speed-up | "
          "one block per SM ms | resident per SM (whole / stream-K) |"
          + "".join(f" {n} blocks ms |" for n in args.blocks))
    print("| --- " * (11 + len(args.blocks)) + "|")
    for shape in SEEDS + LAYERS + LARGE:
        for mode in args.dtype or ("fp16", "bf16", "tf32"):
            for layout in args.layout or ("channels_last", "nchw"):
                problem = shape.problem(MODE_DTYPE[mode], layout)
                plan = make_plan(problem, allow_tf32=True, compute_capability=cc)
                if args.row:
                    if shape.name not in args.row or not plan.config.wgmma or plan.splits > 1:
                        continue
                    plan = make_plan(problem, plan.config.name, NHWC_KERNEL, True, cc, stream_k=True)
                elif not plan.stream_k_blocks:
                    continue
                plans = {"whole": make_plan(problem, plan.config.name, NHWC_KERNEL, True, cc, stream_k=False),
                         "rule": plan, "sms": make_plan(problem, plan.config.name, NHWC_KERNEL, True, cc, stream_k=132),
                         **{n: make_plan(problem, plan.config.name, NHWC_KERNEL, True, cc, stream_k=n)
                            for n in args.blocks}}
                ms = time_plans(problem, mode, plans, "whole", ("rule", "sms"), (shape.name, mode, layout))
                resident = "/".join(str(resident_blocks(plans[k], problem)) for k in ("whole", "rule"))
                print(f"| {shape.name} | {mode} | {layout} | {plan.config.name} | {plan.grid[0] * plan.grid[1]} | "
                      f"{plan.stream_k_blocks} | {ms['whole']:.4f} | {ms['rule']:.4f} | "
                      f"{ms['whole'] / ms['rule']:.2f}x | {ms['sms']:.4f} | {resident} |"
                      + "".join(f" {ms[n]:.4f} |" for n in args.blocks), flush=True)


def resident_blocks(plan, problem) -> int:
    """Blocks of ``plan``'s GEMM launch resident per SM at once, as the driver computes it."""
    from cupy.cuda import driver

    (launch,) = [launch for launch in program(plan, problem).launches if launch.kernel.startswith(NHWC_KERNEL)]
    function = get_kernel(launch.kernel, launch.name_expression, launch.arch)
    return driver.occupancyMaxActiveBlocksPerMultiprocessor(function.kernel.ptr, launch.block[0], launch.shared_bytes)


if __name__ == "__main__":
    main()
