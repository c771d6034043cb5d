"""cupyconv: GPU 2-D convolution for CuPy arrays, with a NumPy path on the CPU and a PyTorch adapter.

    import cupyconv
    y = cupyconv.conv2d(x, weight, bias, stride=4, padding=2)
    dx = cupyconv.grad.conv2d_input(x.shape, weight, dy, stride=4, padding=2)   # gradients: cupyconv.grad
    cupyconv.autotune(True)   # time the allowed plans of each new problem and keep the fastest (cupyconv.tuning)

``cupyconv.torch`` holds the PyTorch adapter; importing cupyconv itself needs neither torch nor a GPU.
"""
from . import grad
from .arguments import ConvProblem, SUPPORTED_DTYPES
from .batchnorm import fold_batchnorm
from .conv import conv2d, plan
from .conv1d import conv1d
from .conv_transpose import conv_transpose2d
from .launch import release_workspaces
from .tuning import autotune
from .weights import PreparedWeight, prepare_weight

__version__ = "0.1.0"
__all__ = ["conv2d", "conv1d", "conv_transpose2d", "grad", "plan", "autotune", "fold_batchnorm", "prepare_weight", "PreparedWeight", "release_workspaces", "ConvProblem", "SUPPORTED_DTYPES", "__version__"]
