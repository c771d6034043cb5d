"""Whether a ping-pong launch runs slower after another kernel than back to back with itself (ResNet-50's
ping-pong launches took ~7 % longer inside the converted model than alone; cuDNN's did not:
results/model_kernels_r50_b32_h200.txt). For some of ResNet-50's layers (fp16 channels_last), graph-timed
(graph_timing.graph_ms): the convolution alone, torch's eval BatchNorm + ReLU writing the convolution's input
alone, and the two in turn, for the rules' plan and for torch's F.conv2d. The convolution's cost in sequence is
the pair's time less the BatchNorm's; against its time alone, that is what running after another kernel adds.
Run from benchmarks/profile with PYTHONPATH=REPO:."""
import argparse

import torch

from cupyconv.arguments import make_problem
from cupyconv.executor import executable_for_plan
from cupyconv.planner import make_plan
from cupyconv.program import FLAG_COUNT
from cupyconv.tuning import label
from graph_timing import graph_ms

#: (batch, input channels, output channels, plane, kernel, stride) of ResNet-50 layers on the ping-pong tiles.
LAYERS = [(32, 256, 1024, 14, 1, 1), (32, 512, 256, 28, 1, 1), (32, 128, 512, 28, 1, 1), (32, 256, 256, 14, 3, 1),
          (32, 64, 64, 56, 3, 1), (8, 128, 128, 28, 3, 1)]


def ours(n, c, k, h, kh, s, x, w, out):
    """An enqueue(stream) of the rules' plan for the layer on torch tensors ``x``, ``w`` into ``out``."""
    problem = make_problem((n, h, h, c), (k, kh, kh, c), None, "float16", stride=s, padding=kh // 2, layout="NHWC",
                           weight_layout="KHWC")
    plan = make_plan(problem, compute_capability=torch.cuda.get_device_capability()[0] * 10)
    exe = executable_for_plan(plan, problem, 0)
    workspace = torch.empty(max(1, exe.workspace_bytes_for(False)), device="cuda", dtype=torch.uint8)
    flags = torch.zeros(FLAG_COUNT, device="cuda", dtype=torch.int32)
    prepared = torch.empty(max(1, exe.weight.nbytes if exe.weight else 0), device="cuda", dtype=torch.uint8)
    if exe.weight:
        exe.prepare_weight(w.data_ptr(), prepared.data_ptr(), torch.cuda.current_stream().cuda_stream)
    return label(plan), lambda stream: exe.launch(x.data_ptr(), w.data_ptr(), prepared.data_ptr(), 0, out.data_ptr(),
                                                  workspace.data_ptr(), False, stream,
                                                  flags=flags.data_ptr() if exe.uses_flags else 0)


def main(rounds: int) -> None:
    for n, c, k, h, kh, s in LAYERS:
        z = torch.randn(n, c, h, h, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        x = torch.empty_like(z)
        w = torch.randn(k, c, kh, kh, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        out = torch.empty(n, k, (h + 2 * (kh // 2) - kh) // s + 1, (h + 2 * (kh // 2) - kh) // s + 1, device="cuda",
                          dtype=torch.half).to(memory_format=torch.channels_last)
        mean, var = torch.randn(c, device="cuda"), torch.rand(c, device="cuda") + 0.5
        scale, shift = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")

        def bn(_stream):
            torch.clamp(torch.nn.functional.batch_norm(z, mean, var, scale, shift, False), min=0, out=x)

        name, conv = ours(n, c, k, h, kh, s, x, w, out)

        def theirs(_stream):
            torch.nn.functional.conv2d(x, w, None, s, kh // 2)

        for _ in range(rounds):
            alone_bn = graph_ms(bn)
            for who, run in (("cupyconv", conv), ("torch", theirs)):
                alone = graph_ms(run)
                pair = graph_ms(lambda stream, run=run: (bn(stream), run(stream)))
                print(f"N{n} {c}->{k} {h}^2 k{kh} s{s} {who:8s}: alone {alone * 1e3:6.1f} us, after BN+ReLU "
                      f"{(pair - alone_bn) * 1e3:6.1f} us (+{(pair - alone_bn - alone) / alone * 100:4.1f} %; BN+ReLU "
                      f"{alone_bn * 1e3:5.1f} us){'  ' + name if who == 'cupyconv' else ''}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    main(parser.parse_args().rounds)
