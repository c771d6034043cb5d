"""A copy of the tree whose ping-pong kernel (kernels/implicit_gemm_nhwc.cu, pingpong_tiles) stamps its phases,
for pingpong_timeline.py:
    python benchmarks/profile/stamp_pingpong.py DEST
Each block writes clock64() at its phases into the device array cc_timeline[block][16] (slot 6 and 7: the
globaltimer at its start and end, for the clock rate), and the copy's compiler keeps each module in
compiler.MODULES so that the array can be read back. The stamps are placed by the lines they follow: where
one is not found the script stops, naming it (the kernel changed: move the anchor)."""
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLOTS = 16
HEADER = (f"__device__ unsigned long long cc_timeline[4096 * {SLOTS}];\n"
          "__device__ __forceinline__ unsigned long long cc_globaltimer() {\n"
          "    unsigned long long t;\n"
          "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
          "    return t;\n"
          "}\n"
          f"#define TL(slot) (cc_timeline[blockIdx.x * {SLOTS} + (slot)] = clock64())\n")
#: (line the stamp follows, stamp): slots 0-5 and 8-14 (pingpong_timeline.PHASES names them).
STAMPS = [
    ("const int tid = threadIdx.x, warpgroup = tid >> 7;\n",
     f"    if (tid == 0) {{ TL(0); cc_timeline[blockIdx.x * {SLOTS} + 6] = cc_globaltimer(); }}\n"),
    ("        __syncthreads();\n    }\n", "    if (tid == 0) TL(1);\n"),
    ("        asm volatile(\"setmaxnreg.dec.sync.aligned.u32 40;\\n\" ::: \"memory\");\n", "        if (tid == 0) TL(8);\n"),
    ("                const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;\n", "                if (seq == 0) TL(13);\n"),
    ("                    const int stage = seq % STAGES;\n", "                    if (seq == 0) TL(14);\n"),
    ("                    if (seq >= STAGES) mbarrier_wait(empty + stage, (seq / STAGES - 1) & 1);\n",
     "                    if (seq == 0) TL(9);\n"),
    ("                                           tap.r * dh, full + stage);\n", "                    if (seq == 0) TL(10);\n"),
    ("                    tma_load_2d(b_smem + stage * B_STAGE, &weight_map, kt * BK, n0, full + stage);\n",
     "                    if (seq == 0) TL(2);\n"),
    ("            mbarrier_wait(full + stage, (seq / STAGES) & 1);\n", "            if (seq == 0 && ctid == 0) TL(3);\n"),
    ("        wgmma_wait<0>();\n", "        if (i == 0 && ctid == 0) TL(4);\n"),
    ("            fence_proxy_async_shared();  // the outgoing sums, to the TMA unit\n",
     "            if (ctid == 0) TL(11);\n"),
    ("            mbarrier_wait(ready, 0);\n", "            if (ctid == 0) TL(12);\n"),
]
#: The consumers' last stamp (slot 5, and the globaltimer in 7), before pingpong_tiles' closing brace.
END = "template <typename T, int BM, int BN, int STAGES, bool RESIDUAL, bool SPLIT_K>\n__global__"


def stamped(source: str) -> str:
    start = source.index("pingpong_tiles(const T*")
    end = source.index(END)
    body = source[start:end].rstrip()
    for after, stamp in STAMPS:
        if after not in body:
            sys.exit(f"stamp_pingpong: no line {after.strip()!r} in pingpong_tiles")
        body = body.replace(after, after + stamp, 1)
    body = body[:body.rindex("}")] + (f"    if (ctid == 0 && consumer == 0) {{ TL(5); cc_timeline[blockIdx.x * {SLOTS} + 7] = "
                                      f"cc_globaltimer(); }}\n}}\n\n")
    head = source[:start]
    first = head.index("namespace cupyconv")
    return head[:first] + HEADER + head[first:] + body + source[end:]


def main(dest: pathlib.Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    for part in ("cupyconv", "kernels"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    kernel = dest / "kernels" / "implicit_gemm_nhwc.cu"
    kernel.write_text(stamped(kernel.read_text()))
    compiler = dest / "cupyconv" / "compiler.py"
    text = compiler.read_text()
    keep = "        function = module.get_function(expression)\n"
    cached = "@functools.lru_cache(maxsize=None)\ndef _module("
    if keep not in text or cached not in text:
        sys.exit("stamp_pingpong: compiler._module changed: keep its modules another way")
    text = text.replace(keep, keep + "        MODULES[expression] = module\n")
    compiler.write_text(text.replace(cached, "MODULES = {}\n\n\n" + cached))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]).resolve())
