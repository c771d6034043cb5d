"""cupyconv: GPU 2-D convolution for CuPy arrays, with a NumPy path on the CPU and a PyTorch adapter.

    import cupyconv
    y = cupyconv.conv2d(x, weight, bias, stride=4, padding=2)

``cupyconv.torch`` holds the PyTorch adapter; importing cupyconv itself needs neither torch nor a GPU.
"""
from .arguments import ConvProblem, SUPPORTED_DTYPES
from .batchnorm import fold_batchnorm
from .conv import conv2d, plan
from .launch import release_workspaces
from .weights import PreparedWeight, prepare_weight

__version__ = "0.1.0"
__all__ = ["conv2d", "plan", "fold_batchnorm", "prepare_weight", "PreparedWeight", "release_workspaces", "ConvProblem", "SUPPORTED_DTYPES", "__version__"]
