"""Plans for layers of few output channels or few input channels, timed against each other in one process
(plan_timing.time_plans: spin-hidden GPU time, interleaved, each checked against the rule's output):
EfficientNet-B0's squeeze-excitation reductions (1x1 planes, 4-6 output channels) and its stem (3 input
channels), and a 3-channel output head on a large plane (where the direct kernel is meant to win).
    python benchmarks/profile/narrow_out.py
Columns: the rule's plan, then the direct kernel and the channels-last GEMM's tiles forced."""
from cupyconv.arguments import make_problem
from cupyconv.planner import DIRECT_KERNEL, NHWC_KERNEL
from plan_timing import rule_against_forced

#: name -> (x NHWC, weight KCHW, stride, padding)
SHAPES = {
    "effnet_se_96to4": ((32, 1, 1, 96), (4, 96, 1, 1), 1, 0),
    "effnet_se_144to6": ((32, 1, 1, 144), (6, 144, 1, 1), 1, 0),
    "effnet_stem_3to32": ((32, 224, 224, 3), (32, 3, 3, 3), 2, 1),
    "head_64to3_256sq": ((8, 256, 256, 64), (3, 64, 3, 3), 1, 1),
}
FORCED = {"direct": (DIRECT_KERNEL, None), "gemm": (NHWC_KERNEL, None), "n32": (NHWC_KERNEL, "nhwc_m128n32k32"),
          "n64": (NHWC_KERNEL, "nhwc_m128n64k32")}


def main() -> None:
    print("| layer | rule's plan | rule ms |" + "".join(f" {name} ms |" for name in FORCED))
    print("| --- " * (3 + len(FORCED)) + "|")
    for name, (xs, ws, stride, padding) in SHAPES.items():
        problem = make_problem(xs, ws, (ws[0],), "float16", stride, padding, layout="NHWC", weight_layout="KCHW")
        plans, ms = rule_against_forced(problem, "fp16", FORCED, (name,))
        print(f"| {name} | {plans['rule'].kernel} {plans['rule'].config.name} | {ms['rule']:.4f} |"
              + "".join(f" {ms[k]:.4f} |" if k in ms else " - |" for k in FORCED), flush=True)


if __name__ == "__main__":
    main()
