"""The FMA weight gradient's runs model (wgrad._run_time) against sweeps of wgrad_fma_tiles.py, on the CPU:
    PYTHONPATH=$repo python benchmarks/profile/wgrad_fma_fit.py LAYOUT=SWEEP.txt [LAYOUT=SWEEP.txt ...]
(LAYOUT channels_last or nchw.) For each (layer, way, tile) of the sweeps and each pair of the model's constants
(BLOCK_FIXED_ITERATIONS, REDUCE_ITERATIONS_PER_MILLION) on a grid: how much slower the run count the model picks
among those measured is than the fastest measured (the mean of the logs of the ratios), and the three worst."""
import math
import re
import sys

from cupyconv import wgrad, wgrad_winograd
from cupyconv.bench import LAYERS

FIXED = (0, 1, 2, 3, 4, 8)
REDUCE = (0, 1, 2, 3, 4, 6, 8)


def rows(path: str, layout: str):
    """(problem of the GEMM, tile, {runs: ms}) of each tile line of a sweep."""
    shapes = {s.name: s for s in LAYERS}
    layer = None
    for line in open(path):
        head = re.match(r"(\S+) fp32 \S+:", line)
        if head:
            layer = head.group(1)
            continue
        tile = re.match(r"\s+(?:(d|w4|w2)\s+)?(wgrad_\S+)\s+rules.*?err \S+\s+(.*)", line)
        if tile and layer and tile.group(2) in wgrad.CONFIG_NAMES:
            problem = shapes[layer].problem("float32", layout)
            way = tile.group(1) or "d"
            if way != "d":
                problem = wgrad_winograd.gemm_problem(problem, int(way[1]), problem.n)
            cfg = next(c for c in wgrad.WGRAD_CONFIGS if c.name == tile.group(2))
            yield f"{layer} {way} {cfg.name}", problem, cfg, {int(s): float(ms) for s, ms in
                                                             re.findall(r"(\d+):([\d.]+)", tile.group(3))}


def main() -> None:
    measured = [row for arg in sys.argv[1:] for row in rows(arg.split("=", 1)[1], arg.split("=", 1)[0])]
    for fixed in FIXED:
        for reduce in REDUCE:
            wgrad.BLOCK_FIXED_ITERATIONS, wgrad.REDUCE_ITERATIONS_PER_MILLION = fixed, reduce
            losses = []
            for name, problem, cfg, times in measured:
                pick = min(times, key=lambda s: wgrad._run_time(problem, cfg, s))
                losses.append((math.log(times[pick] / min(times.values())), name, pick, min(times, key=times.get)))
            print(f"fixed {fixed} reduce {reduce}: mean {sum(l[0] for l in losses) / len(losses):.4f} over "
                  f"{len(losses)}; worst " + ", ".join(f"{n} {p} runs (best {b}) +{math.exp(l) - 1:.0%}"
                                                      for l, n, p, b in sorted(losses)[-3:]))


if __name__ == "__main__":
    main()
