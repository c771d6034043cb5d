"""The bits of TF32 outputs, one hash a row, to compare two trees (run it in each on the same GPU):
    python benchmarks/profile/tf32_bits.py LABEL
Every path that rounds float32 to TF32 on its way to the tensor cores: the layers suite's and conv1d's
rows in both layouts (the rules' plans: NCHW_A read in place on mma.sync and wgmma, NHWC inputs read in
place and rounded in registers or shared memory, copies rounded by nchw_to_nhwc), mma.sync's NCHW_A tile
forced on ResNet-50's 1x1 layers, the NCHW-gather GEMM forced, and the weight gradient. Operands from a
fixed seed, scaled by powers of two so that many values sit on a rounding tie, plus a row holding inf and
NaN; the output's sha1 (first 12 hex digits) per row."""
import dataclasses
import hashlib
import sys

import cupy

import cupyconv
from cupyconv.bench import CONV1D, LAYERS, MODE_DTYPE, Shape
from cupyconv.compiler import compute_capability
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import GEMM_KERNEL, NHWC_KERNEL, make_plan

#: Rows of fewer pixels than the suites', so that every row runs in well under a second.
SMALL = 4


def operands(shape_x, shape_w, seed: int):
    """float32 operands whose low mantissa bits are random and many ties: a uniform draw times 2^k."""
    rng = cupy.random.default_rng(seed)
    x = (rng.standard_normal(shape_x, dtype=cupy.float32) * 8).astype(cupy.float32)
    w = (rng.standard_normal(shape_w, dtype=cupy.float32) / 8).astype(cupy.float32)
    ties = rng.integers(0, 4, size=shape_x) == 0  # a quarter exactly halfway between two TF32 values
    x = cupy.where(ties, (x.view(cupy.uint32) & 0xFFFFE000 | 0x1000).view(cupy.float32), x)
    return x, w


def digest(a) -> str:
    return hashlib.sha1(cupy.ascontiguousarray(a).get().tobytes()).hexdigest()[:12]


def main(label: str) -> None:
    cc = compute_capability()
    rows = []
    for shape in LAYERS + CONV1D:
        small = dataclasses.replace(shape, n=max(1, shape.n // SMALL))
        for layout in ("nchw", "channels_last"):
            rows.append((f"{shape.name} {layout}", small.problem("float32", layout), None))
    for name, c, k, h, w in (("1x1_1024to256", 1024, 256, 14, 14), ("1x1_256to128", 256, 128, 28, 28)):
        problem = Shape(name, 4, c, k, h, w, 1, 1).problem("float32")
        rows.append((f"{name} mma.sync", problem, (NHWC_KERNEL, "nhwc_m128n64k16")))
        rows.append((f"{name} nchw gather", problem, (GEMM_KERNEL, None)))
    for i, (row, problem, forced) in enumerate(rows):
        x, w = operands(problem.x_array_shape, problem.weight_array_shape, i)
        plan = make_plan(problem, forced[1], forced[0], True, cc) if forced else \
            make_plan(problem, allow_tf32=True, compute_capability=cc)
        plan = dataclasses.replace(plan, layout=problem.layout, weight_layout=problem.weight_layout)
        out = cupy.full(problem.out_array_shape, cupy.nan, dtype=cupy.float32)
        conv2d_cupy(x, w, None, problem, out, plan, allow_tf32=True)
        print(f"{label} {row:40s} {plan.kernel:24s} {digest(out)}", flush=True)
    x, w = operands((4, 64, 28, 28), (128, 64, 3, 3), 99)
    x[0, 0, 0, :4] = cupy.array([cupy.inf, -cupy.inf, cupy.nan, 3.4e38], dtype=cupy.float32)
    y = cupyconv.conv2d(x, w, padding=1, allow_tf32=True)
    print(f"{label} {'inf and nan':40s} {'conv2d':24s} {digest(y)}")
    grad_out = cupy.random.default_rng(7).standard_normal(y.shape, dtype=cupy.float32)
    x[0, 0, 0, :4] = 1.0
    for layout in ("NCHW", "NHWC"):
        xl = x if layout == "NCHW" else cupy.ascontiguousarray(x.transpose(0, 2, 3, 1))
        gl = grad_out if layout == "NCHW" else cupy.ascontiguousarray(grad_out.transpose(0, 2, 3, 1))
        shape = (128, 64, 3, 3) if layout == "NCHW" else (128, 3, 3, 64)
        dw = cupyconv.grad.conv2d_weight(xl, shape, gl, padding=1, allow_tf32=True, layout=layout,
                                         weight_layout="KCHW" if layout == "NCHW" else "KHWC")
        print(f"{label} {'weight gradient ' + layout:40s} {'grad.conv2d_weight':24s} {digest(dw)}")


if __name__ == "__main__":
    main(sys.argv[1])
