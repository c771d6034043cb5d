"""Host cost of one call, per kernel family and entry point, with the GPU kept busy so that only the
host's time is measured (the calls queue behind a spin kernel; none waits for the GPU).

    PYTHONPATH=$PWD python3 benchmarks/profile/host_cost.py [--row ROW ...]   # the table
    PYTHONPATH=$PWD python3 benchmarks/profile/host_cost.py --profile simt_fp32   # cProfile of one row
    PYTHONPATH=$PWD python3 benchmarks/profile/host_cost.py --train [--profile ROW]  # forward and backward

Entry points: cupyconv.conv2d on CuPy arrays (a plain weight, and a PreparedWeight), the torch
adapter's functional conv2d and Conv2d.forward (the module keeps the prepared weight), against
torch's F.conv2d and nn.Conv2d. The row's shape is ResNet-50-like at batch 1 unless it names
another; the kernel family is the planner's choice on this GPU (printed). --train times what a
training step asks of a module instead: its forward with autograd recording, and forward plus
backward (input, weight and bias gradients), nn.Conv2d against cupyconv.torch.Conv2d with
cupyconv's gradient kernels and with torch's (set_backward), at the row's shape with batch 32.
"""
from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import statistics
import time

import cupy
import torch

import cupyconv
from cupyconv.torch import Conv2d
from cupyconv.torch import conv2d as torch_adapter_conv2d

F = torch.nn.functional

# name: (x shape, weight shape, conv kwargs, dtype, TF32 on)
ROWS = {
    "winograd_fp32": ((1, 64, 56, 56), (64, 64, 3, 3), {"padding": 1}, torch.float32, False),
    "simt_fp32": ((1, 256, 14, 14), (1024, 256, 1, 1), {}, torch.float32, False),
    "nhwc_tf32": ((1, 64, 56, 56), (64, 64, 3, 3), {"padding": 1}, torch.float32, True),
    "nhwc_fp16": ((1, 64, 56, 56), (64, 64, 3, 3), {"padding": 1}, torch.float16, False),
    "nhwc_1x1_bf16": ((1, 256, 14, 14), (1024, 256, 1, 1), {}, torch.bfloat16, False),
    # Channels-last at batch 32, the rules' producer tile: its TMA maps follow the input's address,
    # so the row alternates two inputs, as a model's layers of one shape do.
    "producer_fp16_b32": ((32, 256, 14, 14), (256, 256, 3, 3), {"padding": 1}, torch.float16, False),
    "depthwise_fp16": ((1, 144, 56, 56), (144, 1, 3, 3), {"padding": 1, "groups": 144}, torch.float16, False),
    "column_fp32": ((1, 384, 14, 14), (384, 1, 3, 3), {"padding": 1, "groups": 384}, torch.float32, False),
    "direct_fp64": ((1, 64, 28, 28), (64, 64, 3, 3), {"padding": 1}, torch.float64, False),
}
#: Rows run in channels_last, on two inputs taken in turn.
ALTERNATING_CHANNELS_LAST = {"producer_fp16_b32"}
CALLS, LOOPS = 200, 7
#: --train: calls per loop (each queues about ten launches; CUDA's queue holds about a thousand) and batch.
TRAIN_CALLS, TRAIN_BATCH = 50, 32
#: GPU clock cycles of the spin ahead of each loop: longer than the loop takes on the host.
SPIN_CYCLES = 400_000_000


def host_us(fn, calls: int = CALLS) -> float:
    """Median over LOOPS of host microseconds per call, ``calls`` calls per loop queued behind a spin."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(LOOPS):
        torch.cuda._sleep(SPIN_CYCLES)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def entry_points(name: str) -> dict:
    x_shape, w_shape, kwargs, dtype, tf32 = ROWS[name]
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    fmt = torch.channels_last if name in ALTERNATING_CHANNELS_LAST else torch.contiguous_format
    xs = [torch.randn(x_shape, device="cuda").to(dtype).to(memory_format=fmt)
          for _ in range(2 if name in ALTERNATING_CHANNELS_LAST else 1)]
    x = itertools.cycle(xs).__next__
    theirs = torch.nn.Conv2d(x_shape[1], w_shape[0], w_shape[2:], bias=True, device="cuda", dtype=dtype,
                             **kwargs).to(memory_format=fmt)
    ours = Conv2d(x_shape[1], w_shape[0], w_shape[2:], bias=True, device="cuda", dtype=dtype,
                  **kwargs).to(memory_format=fmt)
    ours.load_state_dict(theirs.state_dict())
    w, b = theirs.weight.detach(), theirs.bias.detach()
    points = {"torch F.conv2d": lambda: F.conv2d(x(), w, b, **kwargs), "torch nn.Conv2d": lambda: theirs(x()),
              "cupyconv.torch.conv2d": lambda: torch_adapter_conv2d(x(), w, b, **kwargs),
              "cupyconv.torch.Conv2d": lambda: ours(x())}
    if dtype != torch.bfloat16:  # CuPy has no bfloat16 arrays
        layout = "NHWC" if fmt == torch.channels_last else "NCHW"
        cxs = [cupy.from_dlpack(t.permute(0, 2, 3, 1) if layout == "NHWC" else t) for t in xs]
        cx = itertools.cycle(cxs).__next__
        cw, cb = cupy.from_dlpack(w), cupy.from_dlpack(b)
        extra = {"layout": layout} if layout == "NHWC" else {}
        prepared = cupyconv.prepare_weight(cw)
        points["cupyconv.conv2d (CuPy)"] = lambda: cupyconv.conv2d(cx(), cw, cb, allow_tf32=tf32, **kwargs, **extra)
        points["cupyconv.conv2d (CuPy, prepared)"] = lambda: cupyconv.conv2d(cx(), prepared, cb, allow_tf32=tf32,
                                                                             **kwargs, **extra)
    return points


def train_points(name: str) -> dict:
    """The --train entry points of row ``name``: forward (autograd recording) and forward + backward."""
    from cupyconv.torch import set_backward

    x_shape, w_shape, kwargs, dtype, tf32 = ROWS[name]
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    fmt = torch.contiguous_format if dtype in (torch.float32, torch.float64) else torch.channels_last
    x = torch.randn((TRAIN_BATCH, *x_shape[1:]), device="cuda").to(dtype).to(memory_format=fmt).requires_grad_()
    theirs = torch.nn.Conv2d(x_shape[1], w_shape[0], w_shape[2:], bias=True, device="cuda", dtype=dtype,
                             **kwargs).to(memory_format=fmt)
    ours = Conv2d(x_shape[1], w_shape[0], w_shape[2:], bias=True, device="cuda", dtype=dtype,
                  **kwargs).to(memory_format=fmt)
    ours.load_state_dict(theirs.state_dict())
    grad = torch.randn_like(theirs(x))

    def both(module, kind=None):
        def step():
            if kind:
                set_backward(kind)
            module(x).backward(grad)
        return step
    return {"torch forward": lambda: theirs(x), "cupyconv forward": lambda: ours(x),
            "torch forward+backward": both(theirs), "cupyconv forward+backward": both(ours, "cupyconv"),
            "cupyconv forward, torch backward": both(ours, "torch")}


def primitives() -> dict:
    """Host microseconds of the steps a call is made of: the floor under any entry point."""
    from cupy.cuda import driver

    from cupyconv.compiler import get_kernel

    kernel = get_kernel("nchw_to_nhwc_narrow", "cupyconv::nchw_to_nhwc_narrow<float,false>")
    src, dst = cupy.zeros(256, cupy.float32), cupy.zeros(256, cupy.float32)
    import ctypes
    values = (ctypes.c_uint64 * 5)(src.data.ptr, dst.data.ptr, 1, 1, 1)
    params = (ctypes.c_void_p * 5)(*(ctypes.addressof(values) + 8 * i for i in range(5)))
    function, address = kernel.kernel.ptr, ctypes.addressof(params)
    stream = cupy.cuda.get_current_stream().ptr
    return {
        # (the argument block stays alive with the lambda: cuLaunchKernel reads it at each call)
        "cuLaunchKernel (driver.launchKernel)": lambda keep=(values, params): driver.launchKernel(
            function, 1, 1, 1, 256, 1, 1, 0, stream, address, 0),
        "CuPy RawKernel call": lambda: kernel((1,), (256,), (src, dst, 1, 1, 1)),
        "cupy.empty((1, 64, 56, 56))": lambda: cupy.empty((1, 64, 56, 56), cupy.float32),
        "cupy.cuda.get_current_stream().ptr": lambda: cupy.cuda.get_current_stream().ptr,
        "torch.empty((1, 64, 56, 56))": lambda: torch.empty((1, 64, 56, 56), device="cuda"),
        "torch._C._cuda_getCurrentRawStream(0)": lambda: torch._C._cuda_getCurrentRawStream(0),
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "torch.cuda.current_device()": torch.cuda.current_device,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(ROWS), help="cProfile the cupyconv entry points of one row")
    parser.add_argument("--primitives", action="store_true", help="time the steps a call is made of")
    parser.add_argument("--train", action="store_true", help="forward and backward of a module, batch 32")
    parser.add_argument("--row", action="append", choices=sorted(ROWS), help="the table's rows (default: all)")
    args = parser.parse_args()
    if args.train:
        return train(args)
    with torch.no_grad():
        if args.primitives:
            for what, fn in primitives().items():
                print(f"{what}: {host_us(fn):.2f} us")
            return
        if args.profile:
            for point, fn in entry_points(args.profile).items():
                if point.startswith("cupyconv"):
                    host_us(fn)
                    profiler = cProfile.Profile()
                    profiler.runcall(lambda: [fn() for _ in range(2000)])
                    print(f"--- {point}")
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
            return
        names = args.row or list(ROWS)
        columns = list(entry_points(names[0]))
        print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, CuPy {cupy.__version__}; host us per "
              f"call (median of {LOOPS} loops of {CALLS}), GPU kept busy\n")
        print("| row | kernel | " + " | ".join(columns) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in columns) + " |")
        for name in names:
            points = entry_points(name)
            x_shape, w_shape, kwargs, dtype, tf32 = ROWS[name]
            plan_x = torch.empty(x_shape, dtype=torch.float16 if dtype == torch.bfloat16 else dtype)
            plan_w = torch.empty(w_shape, dtype=plan_x.dtype)
            layout = {}
            if name in ALTERNATING_CHANNELS_LAST:
                plan_x, layout = plan_x.permute(0, 2, 3, 1), {"layout": "NHWC"}
            kernel = cupyconv.plan(plan_x.numpy(), plan_w.numpy(), allow_tf32=tf32, **kwargs, **layout).kernel
            cells = [f"{host_us(points[c]):.1f}" if c in points else "-" for c in columns]
            print(f"| {name} | {kernel} | " + " | ".join(cells) + " |", flush=True)


def train(args) -> None:
    from cupyconv.torch import set_backward

    if args.profile:
        fn = train_points(args.profile)["cupyconv forward+backward"]
        host_us(fn, TRAIN_CALLS)
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [fn() for _ in range(500)])
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
        return
    columns = list(train_points("simt_fp32"))
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; host us per call (median of {LOOPS} loops "
          f"of {TRAIN_CALLS}), GPU kept busy; batch {TRAIN_BATCH}, 16-bit rows channels_last\n")
    print("| row | " + " | ".join(columns) + " |")
    print("| --- | " + " | ".join("---" for _ in columns) + " |")
    for name in ROWS:
        if ROWS[name][3] == torch.float64:  # the direct kernel at batch 32 takes longer than the spin hides
            continue
        points = train_points(name)
        print(f"| {name} | " + " | ".join(f"{host_us(points[c], TRAIN_CALLS):.1f}" for c in columns) + " |", flush=True)
        set_backward("cupyconv")


if __name__ == "__main__":
    main()
