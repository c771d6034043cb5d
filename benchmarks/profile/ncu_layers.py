"""ncu's target for comparing kernels with cuDNN's: each layer's torch conv, then the converted one, once each inside
a profiler range, after warm-up calls outside it (channels_last, 16-bit):
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        python3 benchmarks/profile/ncu_layers.py [--dtype fp16|bf16] --only N,C,K,H,KH [--only ...]
KH is the (square, stride-1, 'same'-padded) kernel. The layers of benchmarks/results/pointwise_ncu_mbv2_b32_h200.txt
(24,144,56,1; 16,96,112,1; 144,24,56,1 at N 32) and ncu_losing_layers_6919671_h200.txt were run this way."""
import argparse
import copy

import torch
from torch import nn

import cupyconv.torch as ct

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", required=True, metavar="N,C,K,H,KH")
    parser.add_argument("--dtype", choices=DTYPES, default="fp16")
    args = parser.parse_args()
    dtype, cl = DTYPES[args.dtype], torch.channels_last
    torch.manual_seed(0)
    runs = []
    for spec in args.only:
        n, c, k, h, kh = (int(v) for v in spec.split(","))
        conv = nn.Conv2d(c, k, kh, padding=kh // 2, bias=False).cuda().to(dtype).to(memory_format=cl).eval()
        converted = ct.convert(nn.Sequential(copy.deepcopy(conv)))[0]
        x = torch.randn(n, c, h, h, device="cuda").to(dtype).contiguous(memory_format=cl)
        runs.append((conv, converted, x))
    with torch.no_grad():
        for conv, converted, x in runs:  # compiles, plans and prepared weights outside the range
            for _ in range(3):
                conv(x)
                converted(x)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for conv, converted, x in runs:
            conv(x)
            converted(x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
