"""Per-block phase times of the ping-pong kernel, from a copy stamped by stamp_pingpong.py:
    python benchmarks/profile/stamp_pingpong.py /tmp/stamped
    cd /tmp/stamped && PYTHONPATH=$PWD python /path/to/benchmarks/profile/pingpong_timeline.py
Each plan below runs five times, then once more with the stamps cleared; for that launch it prints the median,
least and most of each phase over the blocks (clock64 cycles at the clock rate the globaltimer shows), the
blocks' start spread and the span from the first start to the last consumer's end. fp16 channels_last."""
import dataclasses

import cupy
import numpy as np
import torch

from cupyconv import compiler
from cupyconv.arguments import make_problem
from cupyconv.executor import executable_for_plan
from cupyconv.program import FLAG_COUNT
from cupyconv.tuning import candidates, label

CLUSTER = "pingpong_m128n128_cluster split-K "
#: ((batch, in channels, out channels, plane, kernel, stride), the plans timed: labels after "nhwc_wgmma_").
CASES = [((8, 1024, 256, 14, 1, 1), ["pingpong_m128n128", "pingpong_m128n64", "pingpong_m64n128", "pingpong_m64n64",
                                     "pingpong_m128n128 split-K 4", CLUSTER + "2"]),
         ((8, 256, 256, 14, 3, 1), ["pingpong_m128n128 split-K 5", CLUSTER + "2", CLUSTER + "4"]),
         ((32, 512, 512, 7, 3, 1), ["pingpong_m128n128 split-K 2", CLUSTER + "2"]),
         ((32, 2048, 512, 7, 1, 1), ["pingpong_m128n128", "pingpong_m128n64", CLUSTER + "2"])]
SLOTS = 16
#: (slot order, phase names): the producer thread's stamps, then consumer 0's (clusters: three epilogue parts).
PHASES = ([0, 1, 8, 13, 14, 9, 10, 2, 3, 4], ["init + sync", "setmaxnreg.dec", "item_of, m0 n0", "corner, first tap",
                                            "empty wait", "expect_tx + A copy", "B copy", "first stage landed",
                                            "mainloop"])
ENDS = {False: ([5], ["epilogue"]), True: ([11, 12, 5], ["sums staged", "copied, ready", "finish"])}


def stamps(module) -> cupy.ndarray:
    return cupy.ndarray((4096, SLOTS), cupy.uint64, module.get_global("cc_timeline"))


def report(name: str, t: np.ndarray, cluster: bool) -> None:
    t = t[t[:, 6] != 0].astype(np.int64)
    order = PHASES[0] + ENDS[cluster][0]
    ghz = np.median((t[:, 5] - t[:, 0]) / np.maximum(1, t[:, 7] - t[:, 6]))
    phases = np.diff(t[:, order], axis=1) / ghz / 1e3
    start, end = (t[:, 6] - t[:, 6].min()) / 1e3, (t[:, 7] - t[:, 6].min()) / 1e3
    print(f"{name}: blocks {len(t)}, {ghz:.2f} GHz, kernel span {end.max():.2f} us, starts 0..{start.max():.2f} us, "
          f"ends {end.min():.2f}..{end.max():.2f}")
    for column, phase in zip(phases.T, PHASES[1] + ENDS[cluster][1]):
        print(f"    {phase:22s} median {np.median(column):6.2f}  min {column.min():6.2f}  max {column.max():6.2f} us")


def main() -> None:
    for (n, c, k, h, kh, s), wanted in CASES:
        problem = make_problem((n, h, h, c), (k, kh, kh, c), None, "float16", stride=s, padding=kh // 2,
                               layout="NHWC", weight_layout="KHWC")
        plans = {label(p).split("nhwc_wgmma_")[-1]: p for _, p in candidates(problem, compute_capability=90)}
        x = torch.randn(n, c, h, h, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, kh, kh, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        for name in wanted:
            plan = dataclasses.replace(plans[name], layout="NHWC", weight_layout="KHWC")
            out = torch.empty(problem.out_array_shape, device="cuda", dtype=torch.half)
            exe = executable_for_plan(plan, problem, 0)
            workspace = torch.empty(max(1, exe.workspace_bytes_for(False)), device="cuda", dtype=torch.uint8)
            flags = torch.zeros(FLAG_COUNT, device="cuda", dtype=torch.int32)
            stream = torch.cuda.current_stream().cuda_stream

            def launch():
                exe.launch(x.data_ptr(), w.data_ptr(), 0, 0, out.data_ptr(), workspace.data_ptr(), False, stream,
                           flags=flags.data_ptr() if exe.uses_flags else 0)
            for _ in range(5):
                launch()
            modules = {e: m for e, m in compiler.MODULES.items() if "pingpong" in e}
            for module in modules.values():
                stamps(module).fill(0)
            torch.cuda.synchronize()
            launch()
            torch.cuda.synchronize()
            for expression, module in modules.items():
                t = stamps(module).get()
                if t[:, 6].any():
                    report(f"N{n} {c}->{k} {h}^2 k{kh} {name}", t, "cluster" in expression)


if __name__ == "__main__":
    main()
