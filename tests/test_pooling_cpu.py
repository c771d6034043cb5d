"""The squeeze-excitation pooling's program (cupyconv/pooling.py) without a GPU: its grid covers every
channel vector and pixel once, a large plane is split to fill the GPU (its splits finished by the last
block to arrive, counted in FLAGS), the workspace holds the partial sums, and the kernel's parameters
are what the launch passes."""
import math

import pytest

from cupyconv import pooling
from cupyconv.program import FLAG_COUNT, FLAGS, OUT, WORKSPACE, X, Pointer
from test_programs import parameters


@pytest.mark.parametrize("dtype", pooling.DTYPES)
@pytest.mark.parametrize("n,c,pixels", [(32, 32, 112 * 112), (32, 1152, 49), (1, 96, 3136), (3, 20, 5), (2, 6, 1),
                                        (128, 2000, 64), (1024, 2048, 64)])
def test_program_covers_the_tensor(n, c, pixels, dtype):
    call = pooling.program(n, c, pixels, dtype)
    (sums,) = call.launches
    assert sums.kernel == pooling.KERNEL and len(sums.args) == len(parameters(sums.kernel))
    _, partials, out, counts, _, _, _, lanes_c, per_split = sums.args
    vec = pooling.vector(dtype, c)
    assert c % vec == 0 and (vec == 1 or vec * {"float32": 4}.get(dtype, 2) == 16)
    channel_blocks, images, splits = sums.grid
    assert sums.args[0] == Pointer(X) and out == Pointer(OUT)
    assert images == n and channel_blocks * lanes_c >= c // vec and (channel_blocks - 1) * lanes_c < c // vec
    assert lanes_c <= pooling.THREADS and splits * per_split >= pixels and (splits - 1) * per_split < pixels
    # A large plane of few images is split to fill the GPU; a small one is not split past its lanes.
    assert channel_blocks * n * splits >= min(pooling.TARGET_BLOCKS, math.ceil(pixels / (pooling.THREADS // lanes_c)))
    if splits == 1:
        assert call.workspace_bytes == 0 and FLAGS not in [getattr(arg, "operand", None) for arg in sums.args]
        return
    assert partials == Pointer(WORKSPACE) and call.workspace_bytes == 4 * splits * n * c
    assert counts == Pointer(FLAGS) and n * channel_blocks <= FLAG_COUNT


def test_refusals_name_the_reason():
    assert "float64" in pooling.refusal(2, 8, 9, "float64")
    assert pooling.refusal(2, 8, 9, "float16") == ""
    with pytest.raises(ValueError, match="cannot pool"):
        pooling.program(0, 8, 9, "float16")
