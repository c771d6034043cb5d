"""Plans for layers of few output channels or few input channels, timed against each other in one process
(plan_timing.time_plans: spin-hidden GPU time, interleaved, each checked against the rule's output):
EfficientNet-B0's squeeze-excitation layers at batch 32 (1x1 planes: reductions to 4-48 channels and
expansions from them; GEMMs of 32 pixels), its stem and other RGB stems (3 input channels), and a
3-channel output head on a large plane (where the direct kernel is meant to win).
    python benchmarks/profile/narrow_out.py [--dtype fp16 --dtype tf32] [--layer NAME_PART ...]
Columns: the rule's plan, then the direct kernel, the channels-last GEMM's tiles (mma.sync and wgmma)
and its split-K runs forced, and the NCHW-gather GEMM on each of its tiles (its NHWC instance, in place,
no channel padding)."""
import argparse

from cupyconv.arguments import make_problem
from cupyconv.bench import MODE_DTYPE
from cupyconv.planner import DIRECT_KERNEL, NHWC_KERNEL
from plan_timing import GEMM_TILES, gemm_tiles, rule_against_forced

#: name -> (x NHWC, weight KCHW, stride, padding)
#: EfficientNet-B0's squeeze-excitation pairs (channels, reduced channels), each a reduction and an expansion.
SE_PAIRS = ((32, 8), (96, 4), (144, 6), (240, 10), (480, 20), (672, 28), (1152, 48))
SHAPES = {
    **{f"effnet_se_{c}to{r}": ((32, 1, 1, c), (r, c, 1, 1), 1, 0) for c, r in SE_PAIRS},
    **{f"effnet_se_{r}to{c}": ((32, 1, 1, r), (c, r, 1, 1), 1, 0) for c, r in SE_PAIRS},
    "effnet_stem_3to32": ((32, 224, 224, 3), (32, 3, 3, 3), 2, 1),
    "r50_conv1_3to64_7x7s2": ((32, 224, 224, 3), (64, 3, 7, 7), 2, 3),
    "alexnet_conv1_3to96_11x11s4": ((256, 224, 224, 3), (96, 3, 11, 11), 4, 2),
    "vgg_conv1_1_3to64": ((32, 224, 224, 3), (64, 3, 3, 3), 1, 1),
    "head_64to3_256sq": ((8, 256, 256, 64), (3, 64, 3, 3), 1, 1),
}
FORCED = {"direct": (DIRECT_KERNEL, None), "gemm": (NHWC_KERNEL, None), "n32": (NHWC_KERNEL, "nhwc_m128n32k32"),
          "n64": (NHWC_KERNEL, "nhwc_m128n64k32"), "wgmma n64": (NHWC_KERNEL, "nhwc_wgmma_ch_m256n64"),
          **{f"gemm split {s}": (NHWC_KERNEL, None, {"splits": s}) for s in (2, 4, 8)}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=("fp16", "bf16", "tf32"))
    parser.add_argument("--layer", action="append", help="rows whose name contains this (default: all)")
    args = parser.parse_args()
    modes = args.dtype or ("fp16",)
    columns = [*FORCED, *(f"gemm_nchw {tile}" for tile in GEMM_TILES)]
    print("| layer | mode | rule's plan | rule ms |" + "".join(f" {name} ms |" for name in columns))
    print("| --- " * (4 + len(columns)) + "|")
    for name, (xs, ws, stride, padding) in SHAPES.items():
        if args.layer and not any(part in name for part in args.layer):
            continue
        for mode in modes:
            problem = make_problem(xs, ws, (ws[0],), MODE_DTYPE[mode], stride, padding, layout="NHWC",
                                   weight_layout="KCHW")
            plans, ms = rule_against_forced(problem, mode, {**FORCED, **gemm_tiles(MODE_DTYPE[mode])}, (name, mode))
            print(f"| {name} | {mode} | {plans['rule'].kernel} {plans['rule'].config.name} | {ms['rule']:.4f} |"
                  + "".join(f" {ms[k]:.4f} |" if k in ms else " - |" for k in columns), flush=True)


if __name__ == "__main__":
    main()
