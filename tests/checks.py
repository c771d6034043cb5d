"""The accuracy measure every test uses, for NumPy arrays and torch tensors alike."""
import numpy as np


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; the absolute norm where ref is all zeros (outputs that
    read only padding), so that NaN or garbage there still fails."""
    if hasattr(ref, "detach"):  # torch tensors: stay on their device
        out, ref = out.detach().double(), ref.detach().double()
        norm = lambda t: float(t.norm())
    else:
        out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
        norm = lambda a: float(np.linalg.norm(a))
    if ref.size == 0 if isinstance(ref, np.ndarray) else ref.numel() == 0:
        return 0.0
    difference, scale = norm(out - ref), norm(ref)
    return difference / scale if scale > 0 else difference
