"""1x1 NCHW layers read in place: mma.sync's NCHW_A tile (the rules' choice off compute capability 9.0)
against wgmma's pixel-row tile with the input's fragments in registers (forced), in one process, and
which of the two the rules choose here:
    python benchmarks/profile/nchw_a_wgmma.py [--dtype tf32 ...] [--batch 1 ...] [--mobile]
ResNet-50's stride-1 1x1 layers (with --mobile, MobileNetV2's and EfficientNet-B0's widest 1x1 layers
instead), the layers suite's MobileNetV2 expansion and the Conformer's pointwise conv1d. GPU time: medians of 50 interleaved runs each behind a spin kernel (plan_timing.time_plans),
the wgmma plan checked against mma.sync's within the dtype's tolerance. Rows the wgmma tile cannot read
in place (16-bit 7 x 7 planes) or where it does not apply (fewer than 128 output channels, less than one
k row of 128 bytes) are left out."""
import argparse

from cupyconv import planner
from cupyconv.bench import CONV1D, LAYERS, MODE_DTYPE, Shape
from cupyconv.compiler import compute_capability
from cupyconv.families import implicit_gemm_nhwc
from plan_timing import TOLERANCE, time_plans

#: (name, C, K, H, W) of ResNet-50's stride-1 1x1 layers (torchvision: the stride sits on the 3x3).
RESNET50_1X1 = [("r50_l1_64to64", 64, 64, 56, 56), ("r50_l1_64to256", 64, 256, 56, 56),
                ("r50_l1_256to64", 256, 64, 56, 56), ("r50_l2_256to128", 256, 128, 56, 56),
                ("r50_l2_128to512", 128, 512, 28, 28), ("r50_l2_512to128", 512, 128, 28, 28),
                ("r50_l3_512to256", 512, 256, 28, 28), ("r50_l3_256to1024", 256, 1024, 14, 14),
                ("r50_l3_1024to256", 1024, 256, 14, 14), ("r50_l4_1024to512", 1024, 512, 14, 14),
                ("r50_l4_512to2048", 512, 2048, 7, 7), ("r50_l4_2048to512", 2048, 512, 7, 7)]
#: MobileNetV2's and EfficientNet-B0's 1x1 layers of at least 192 output channels and 32 input channels
#: (torchvision; expansions, and the heads to 1280).
MOBILE_1X1 = [("mbv2_32to192", 32, 192, 28, 28), ("mbv2_64to384", 64, 384, 14, 14), ("mbv2_96to576", 96, 576, 14, 14),
              ("mbv2_160to960", 160, 960, 7, 7), ("mbv2_320to1280", 320, 1280, 7, 7),
              ("effnet_40to240", 40, 240, 28, 28), ("effnet_80to480", 80, 480, 14, 14),
              ("effnet_112to672", 112, 672, 14, 14), ("effnet_192to1152", 192, 1152, 7, 7)]


def plans(problem) -> tuple:
    """mma.sync's plan (the tile the rules choose without wgmma, on this GPU), the wgmma pixel-row plan
    (forced; split-K by the rules) and the rules' own choice here."""
    here = compute_capability()
    without_wgmma = planner.make_plan(problem, allow_tf32=True, compute_capability=80).config.name
    mma_sync = planner.make_plan(problem, allow_tf32=True, compute_capability=here, config=without_wgmma)
    wgmma = planner.make_plan(problem, allow_tf32=True, compute_capability=here,
                              config=implicit_gemm_nhwc.PIXEL_ROWS_CONFIG)
    return mma_sync, wgmma, planner.make_plan(problem, allow_tf32=True, compute_capability=here)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    parser.add_argument("--batch", action="append", type=int, help="the models' batches (default 1, 8, 32)")
    parser.add_argument("--mobile", action="store_true", help="MobileNetV2's and EfficientNet-B0's layers, not ResNet-50's")
    args = parser.parse_args()
    shapes = [Shape(f"{name}_b{n}", n, c, k, h, w, 1, 1) for n in args.batch or (1, 8, 32)
              for name, c, k, h, w in (MOBILE_1X1 if args.mobile else RESNET50_1X1)]
    shapes += [s for s in LAYERS + CONV1D if (s.kh, s.kw, s.stride, s.padding, s.groups) == (1, 1, 1, 0, 1)]
    print("| row | mode | mma.sync plan | wgmma plan | mma.sync ms | wgmma ms | mma.sync / wgmma | rules |")
    print("| --- " * 8 + "|")
    for shape in shapes:
        for mode in args.dtype or ("tf32", "fp16", "bf16"):
            problem = shape.problem(MODE_DTYPE[mode])
            old, new, chosen = plans(problem)
            deep = problem.c * (4 if problem.dtype == "float32" else 2) >= 128
            if not (old.a_from_nchw and new.a_from_nchw and deep) or \
                    problem.k // problem.groups < implicit_gemm_nhwc.NCHW_A_WGMMA_MIN_CHANNELS[2]:
                continue
            ms = time_plans(problem, mode, {"mma.sync": old, "wgmma": new}, "mma.sync", ["wgmma"], (shape.name, mode))
            label = lambda p: f"{p.config.name}{f' split {p.splits}' if p.splits > 1 else ''}"
            print(f"| {shape.name} | {mode} | {label(old)} | {label(new)} | {ms['mma.sync']:.4f} | {ms['wgmma']:.4f} "
                  f"| {ms['mma.sync'] / ms['wgmma']:.2f}x | {'wgmma' if chosen.config.wgmma else 'mma.sync'} |", flush=True)


if __name__ == "__main__":
    main()
