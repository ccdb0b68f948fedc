"""cuBLAS's 1D block scaling factors layout (https://docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout),
element by element: the reference the swizzle tests hold the emulation's block_scales to, written apart from it."""
import torch


def swizzled_index(r: int, c: int, cols: int) -> int:
    """cuBLAS's 1D block scaling factors layout: 128x4 tiles, row-major; inside, (r % 32) * 16 + (r // 32) * 4 + c."""
    return ((r // 128) * (cols // 4) + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4


def swizzled_by_index(compact: torch.Tensor) -> torch.Tensor:
    """The flat swizzled form of a padded (rows, cols) region, element by element."""
    rows, cols = compact.shape
    out = torch.empty(rows * cols, dtype=compact.dtype)
    index = torch.tensor([swizzled_index(r, c, cols) for r in range(rows) for c in range(cols)])
    out[index] = compact.reshape(-1)
    return out
