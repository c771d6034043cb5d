"""Fit the TMA weight-gradient tiles' rates (wgrad_tensor_cores.TMA_CONFIGS' sm_tflops, or with --mode tf32
TF32_TMA_CONFIGS') and the timing model's FILL_TILES and REDUCE_LAUNCH_US to sweeps of profile/wgrad_tiles.py,
on the CPU:
    python benchmarks/profile/wgrad_fit.py [--mode tf32|tf32-nchw] benchmarks/results/wgrad_tiles_tma_h200.txt [MORE.txt ...]
(tf32-nchw: the K-major tiles, TF32_K_MAJOR_CONFIGS, from a sweep of wgrad_tiles.py --layout nchw.)
A later file's times replace an earlier one's for the same layer, tile and run count. For every combination on
the grid below, the model (wgrad_tensor_cores._model_us) picks each layer's tile and run count as make_plan
would; the score is the sum over layers of log(measured time of the pick / fastest time measured), the pick's
time taken at the nearest run count measured. Prints the current constants' score and picks, then the best
combination's. FILL_TILES is every tile's (the cp.async tiles' choices move with it too): TF32's fit holds it and
REDUCE_LAUNCH_US, fitting its tiles' rates alone. Feed it sweeps of the
code as it is: benchmarks/results/wgrad_tiles_tma_clusters_h200.txt timed runs added in clusters, since
removed, at every even run count."""
import argparse
import dataclasses
import itertools
import math
import re

from cupyconv import wgrad_tensor_cores as tc
from cupyconv.bench import LAYERS

RATES = {"16-bit": (2.2, 2.4, 2.6, 3.0, 3.4), "tf32": (1.0, 1.2, 1.4, 1.6, 1.8, 2.0),
         "tf32-nchw": (1.0, 1.3, 1.6, 1.8, 2.0, 2.4, 2.8)}
#: Each fit's modes (as wgrad_tiles.py names them), tiles, problem dtype and layout.
FITS = {"16-bit": (("fp16", "bf16"), tc.TMA_CONFIGS, "float16", "channels_last"),
        "tf32": (("tf32",), tc.TF32_TMA_CONFIGS, "float32", "channels_last"),
        "tf32-nchw": (("tf32",), tc.TF32_K_MAJOR_CONFIGS, "float32", "nchw")}
FILLS = (1, 2, 3)
REDUCE_LAUNCHES = (0.0, 2.0)


def sweeps(paths, modes) -> dict:
    """{layer: {tile: {runs: ms}}} from wgrad_tiles.py's output in ``modes`` (stream-K's time under tc.STREAM_K),
    later files first."""
    times: dict = {}
    for path in paths:
        layer = None
        for line in open(path):
            if m := re.match(r"(\S+) (\S+): torch", line):
                layer = m.group(1) if m.group(2) in modes else None
            elif (m := re.match(r"  (tc_tma_\S+)\s+model.*err \S+\s+(.*)", line)) and layer:
                runs = times.setdefault(layer, {}).setdefault(m.group(1), {})
                runs.update({tc.STREAM_K if s == "sk" else int(s): float(ms)
                             for s, ms in (t.split(":") for t in m.group(2).split())})
    return times


def score(times: dict, rates: dict, fit: str, verbose: bool = False) -> float:
    """The sum over layers of log(pick / fastest) with ``rates`` ({tile name: sm_tflops}); a tile whose
    schedule the model makes stream-K counts its stream-K time where the sweep has one."""
    shapes = {shape.name: shape for shape in LAYERS}
    _, tiles, dtype, layout = FITS[fit]
    configs = {cfg.name: dataclasses.replace(cfg, sm_tflops=rates[cfg.name]) for cfg in tiles}
    total = 0.0
    for layer, per_tile in times.items():
        per_tile = {name: runs for name, runs in per_tile.items() if name in configs}  # not other families' tiles
        if not per_tile:
            continue
        problem = shapes[layer].problem(dtype, layout)
        fastest = min(min(runs.values()) for runs in per_tile.values())
        picks = []
        for name, runs in per_tile.items():
            cfg = configs[name]
            splits = tc._best_schedule(problem, cfg, None if tc.STREAM_K in runs else False)
            counts = [s for s in runs if s != tc.STREAM_K]
            nearest = splits if splits == tc.STREAM_K else min(counts, key=lambda s: abs(math.log(s / splits)))
            picks.append((tc._schedule_us(problem, cfg, splits), runs[nearest], name, splits))
        modelled, measured, name, splits = min(picks, key=lambda pick: pick[0])  # ties as _choose: the first
        total += math.log(measured / fastest)
        if verbose:
            print(f"  {layer:22s} {name}/{splits}: {measured:.4f} ms (fastest {fastest:.4f}, {measured / fastest:.2f}x)")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("fp16", "tf32", "tf32-nchw"), default="fp16",
                        help="fp16: the 16-bit tiles (fp16 and bf16 sweeps); tf32: TF32's; tf32-nchw: the K-major ones")
    parser.add_argument("sweeps", nargs="+")
    args = parser.parse_args()
    fit = "16-bit" if args.mode == "fp16" else args.mode
    modes, tiles, _, _ = FITS[fit]
    times = sweeps(args.sweeps, modes)
    names = [cfg.name for cfg in tiles]
    current = {cfg.name: cfg.sm_tflops for cfg in tiles}
    print(f"current: rates {current}, FILL_TILES {tc.FILL_TILES}, REDUCE_LAUNCH_US {tc.REDUCE_LAUNCH_US}: "
          f"{score(times, current, fit, True):.3f}")
    best = (score(times, current, fit), current, tc.FILL_TILES, tc.REDUCE_LAUNCH_US)  # kept unless beaten
    held = fit != "16-bit"
    for fill, launch in itertools.product((tc.FILL_TILES,) if held else FILLS,
                                          (tc.REDUCE_LAUNCH_US,) if held else REDUCE_LAUNCHES):
        tc.FILL_TILES, tc.REDUCE_LAUNCH_US = fill, launch  # read by _model_us at each call
        for rates in itertools.product(RATES[fit], repeat=len(names)):
            value = score(times, dict(zip(names, rates)), fit)
            if value < best[0] - 1e-9:
                best = (value, dict(zip(names, rates)), fill, launch)
    value, rates, tc.FILL_TILES, tc.REDUCE_LAUNCH_US = best
    print(f"best: rates {rates}, FILL_TILES {tc.FILL_TILES}, REDUCE_LAUNCH_US {tc.REDUCE_LAUNCH_US}: "
          f"{score(times, rates, fit, True):.3f}")


if __name__ == "__main__":
    main()
