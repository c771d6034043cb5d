"""The squeeze-excitation pooling's program (cupyconv/pooling.py) without a GPU: its grid covers every
channel vector and pixel once, its workspace holds the partial sums, and its kernels' parameters
are what the launches pass."""
import math

import pytest

from cupyconv import pooling
from cupyconv.program import OUT, WORKSPACE, X, Pointer
from test_programs import parameters


@pytest.mark.parametrize("dtype", pooling.DTYPES)
@pytest.mark.parametrize("n,c,pixels", [(32, 32, 112 * 112), (32, 1152, 49), (1, 96, 3136), (3, 20, 5), (2, 6, 1),
                                        (128, 2000, 64)])
def test_program_covers_the_tensor(n, c, pixels, dtype):
    call = pooling.program(n, c, pixels, dtype)
    partial, finish = call.launches
    assert [launch.kernel for launch in call.launches] == [pooling.PARTIAL, pooling.FINISH]
    for launch in call.launches:
        assert len(launch.args) == len(parameters(launch.kernel)), launch
    _, _, _, _, _, lanes_c, per_split = partial.args
    vec = pooling.vector(dtype, c)
    assert c % vec == 0 and (vec == 1 or vec * {"float32": 4}.get(dtype, 2) == 16)
    assert partial.args[:2] == (Pointer(X), Pointer(WORKSPACE)) and finish.args[:2] == (Pointer(WORKSPACE), Pointer(OUT))
    channel_blocks, images, splits = partial.grid
    assert images == n and channel_blocks * lanes_c >= c // vec and (channel_blocks - 1) * lanes_c < c // vec
    assert lanes_c <= pooling.THREADS and splits * per_split >= pixels and (splits - 1) * per_split < pixels
    assert finish.args[-1] == splits and math.prod(finish.grid) * pooling.THREADS >= n * c
    assert call.workspace_bytes == 4 * splits * n * c
    # A large plane of few images is split to fill the GPU; a small one is not split past its lanes.
    assert channel_blocks * n * splits >= min(pooling.TARGET_BLOCKS, math.ceil(pixels / (pooling.THREADS // lanes_c)))


def test_refusals_name_the_reason():
    assert "float64" in pooling.refusal(2, 8, 9, "float64")
    assert pooling.refusal(2, 8, 9, "float16") == ""
    with pytest.raises(ValueError, match="cannot pool"):
        pooling.program(0, 8, 9, "float16")
