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
