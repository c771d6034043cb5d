"""torch's conv2d of one 1x1 layer in fp16 channels_last, warmed up, then once between
cudaProfilerStart and Stop, so that ncu --profile-from-start off profiles the kernel cuDNN (or cuBLAS,
which torch calls for 1x1 layers) runs, and nothing of the setup:
    ncu --profile-from-start off --section LaunchStats python3 benchmarks/profile/torch_conv.py N C K H W
The kernel's name tells its tile, stages and cluster (H200: 256 -> 1024 on 14^2 at batch 32 ran
nvjet_sm90_hsh_128x192_64x5_2x1_v_bz_coopB_TNN, 132 blocks of 384 threads; benchmarks/NOTES.md)."""
import sys

import torch

n, c, k, h, w = (int(v) for v in sys.argv[1:6])
x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
weight = torch.randn(k, c, 1, 1, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
for _ in range(3):
    torch.nn.functional.conv2d(x, weight)
torch.cuda.synchronize()
torch.cuda.profiler.start()
torch.nn.functional.conv2d(x, weight)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
