"""Helpers shared by the kernel wrappers: interpreter detection, checks, the error metric.

Nothing here imports triton at module import time.
"""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when Triton runs its numpy interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def has_fp8_conversion(device: torch.device) -> bool:
    """The GPU converts fp8 (e4m3) in hardware (compute capability 8.9 and up), or the kernels
    run interpreted (CPU tensors)."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


def check_device(*tensors: torch.Tensor) -> None:
    """The kernels run on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1."""
    for t in tensors:
        if t is None:
            continue
        if not t.is_cuda and not interpreting():
            raise ValueError(
                f"tensor on {t.device}: the Triton kernels need CUDA tensors "
                "(or TRITON_INTERPRET=1 for CPU tensors)"
            )


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity error: 1 - 2*sum(x*y) / (sum(x*x) + sum(y*y)), in fp64.

    Masked (-inf) positions must be zeroed by the caller (see `zero_masked`).
    """
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)


def zero_masked(x: torch.Tensor) -> torch.Tensor:
    """Copy of x with -inf positions set to 0 (for calc_diff)."""
    return torch.where(torch.isneginf(x), torch.zeros((), dtype=x.dtype, device=x.device), x)


def compare_logits(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool]:
    """DeepGEMM's check of index logits against a reference: (calc_diff over the positions
    the reference keeps, whether the -inf masks are identical). What `out` holds where the
    reference masks (clean_logits=False leaves it unspecified) is judged by the mask alone."""
    valid = ~torch.isneginf(ref)
    diff = calc_diff(zero_masked(torch.where(valid, out, ref)), zero_masked(ref))
    return diff, bool(torch.equal(torch.isneginf(out), ~valid))


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
