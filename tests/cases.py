"""The grid of convolution shapes every implementation is checked on (CPU and GPU)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Case:
    n: int
    c: int
    k: int
    h: int
    w: int
    kh: int
    kw: int
    stride: object = 1
    padding: object = 0
    dilation: object = 1
    groups: int = 1
    bias: bool = True

    @property
    def id(self) -> str:
        return (f"n{self.n}c{self.c}k{self.k}_{self.h}x{self.w}_k{self.kh}x{self.kw}_s{self.stride}"
                f"_p{self.padding}_d{self.dilation}_g{self.groups}{'_b' if self.bias else ''}").replace(" ", "")


GRID = [
    Case(2, 3, 8, 9, 11, 3, 3),
    Case(2, 3, 8, 9, 11, 3, 3, padding=1, bias=False),
    Case(1, 4, 5, 16, 13, 3, 5, stride=2, padding=(1, 2)),
    Case(2, 5, 7, 17, 19, 4, 2, stride=(2, 3), padding=(0, 1), dilation=(2, 1)),
    Case(1, 6, 6, 12, 12, 3, 3, padding="same", dilation=2),
    Case(1, 3, 4, 10, 9, 4, 2, padding="same"),  # even kernel: asymmetric 'same' padding
    Case(2, 3, 4, 10, 9, 3, 3, padding="valid"),
    Case(2, 8, 8, 14, 15, 3, 3, padding=1, groups=8),  # depthwise
    Case(1, 4, 12, 11, 10, 3, 3, padding=1, groups=4),  # depthwise, channel multiplier 3
    Case(2, 8, 12, 9, 9, 3, 3, stride=2, padding=1, groups=2),  # grouped
    Case(1, 40, 36, 7, 9, 1, 1),  # 1x1, more channels than one stage and tile
    Case(0, 3, 8, 9, 11, 3, 3, padding=1),  # empty batch
    Case(3, 2, 3, 5, 7, 5, 7),  # kernel as large as the input: 1x1 output
    Case(1, 2, 3, 4, 4, 7, 7, padding=2),  # kernel as large as the padded input
    Case(1, 3, 33, 23, 37, 3, 3, stride=1, padding=1),  # K not a multiple of the channel tile
    Case(1, 2, 4, 40, 40, 3, 3, stride=7, padding=3),  # stride larger than the kernel
    Case(1, 2, 3, 64, 70, 3, 3, dilation=(9, 11)),  # large dilation
    Case(1, 1, 2, 3, 300, 1, 129, padding=(0, 64)),  # very wide kernel: staged in column chunks
    Case(2, 3, 96, 35, 35, 11, 11, stride=4, padding=2),  # AlexNet conv1 geometry, small
    Case(1, 32, 64, 21, 27, 5, 9),  # the wide 5x9 seed geometry, small
]

#: Transposed convolutions (NHWC, 16-bit channels in 16-byte pieces) of several stride phases, which run
#: in one launch (implicit_gemm_nhwc_phases): each a geometry the phase table must place right.
PHASE_CASES = [  # y (n, hy, wy, k), weight (k, c / groups, kh, kw), stride, padding, output_padding, groups, dilation
    ((2, 4, 4, 32), (32, 16, 4, 4), 2, 1, 0, 1, 1),     # DCGAN
    ((2, 5, 6, 16), (16, 24, 3, 3), 2, 1, 1, 1, 1),     # a decoder's 3x3: phases of 1 and 2 taps
    ((1, 7, 5, 16), (16, 8, 2, 2), 2, 0, 0, 1, 1),      # U-Net's 2x2: one tap per phase
    ((2, 6, 5, 16), (16, 8, 5, 3), (3, 2), (2, 0), (1, 1), 1, 1),  # phases past the kernel's taps
    ((1, 6, 7, 32), (32, 8, 3, 3), 2, 2, 0, 2, 2),      # groups, dilation
    ((1, 3, 3, 16), (16, 8, 1, 1), 2, 0, 1, 1, 1),      # phases no tap reaches
    ((2, 8, 7, 16), (16, 8, 3, 3), 2, (3, 4), (1, 0), 1, 1),  # padding past the taps: phases read inside y
    ((3, 9, 9, 512), (512, 64, 4, 4), 2, 1, 0, 1, 1),   # a long reduction of few tiles: split-K
    ((2, 8, 8, 16), (16, 3, 4, 4), 2, 1, 0, 1, 1),      # an RGB output: 3 of the GEMM's 8 channels stored
    ((2, 5, 5, 512), (512, 3, 4, 4), 2, 1, 0, 1, 1),    # ... with split-K
    ((2, 20, 20, 16), (16, 8, 3, 3), 2, 1, 0, 1, 1),    # an odd output: phases of unequal tiles, not in turns
]
