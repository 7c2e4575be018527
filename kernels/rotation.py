"""The index rotation: DeepSeek's reference indexer (and V4's key writer) multiplies the
index query and keys by the normalised Hadamard matrix of the head dimension before the
key store quantises them:

    x_rot = x @ H_D / sqrt(D)       H_2n = [[H_n, H_n], [H_n, -H_n]]   (Sylvester order)

which is what `fast_hadamard_transform(x, scale=D ** -0.5)` computes. The matrix is
symmetric and orthonormal, so q.k is unchanged in exact arithmetic; what changes is what
fp8 rounding loses: with one scale per token, an outlier channel sets the scale alone and
the other channels keep few bits; rotated, every channel is a mix of all of them.
SGLang 0.5.23's fused V3.2 writers store keys without it (rotation "none"); V4's rotates
(docs/embedded-server.md, "Rotation").

(kernels/v4_store/reference.py computes the same transform for V4's 128-wide keys by
butterflies, in its kernel's exact operation order.)

Torch is imported inside the functions: the matrix loader and the CLI read ROTATIONS
without it.
"""

from __future__ import annotations

import functools

ROTATIONS = ("none", "hadamard")


@functools.lru_cache(maxsize=8)
def hadamard(d: int):
    """The normalised Hadamard matrix H_d / sqrt(d): [d, d] fp32, d a power of 2."""
    import torch  # noqa: PLC0415 (heavy: `niah serve` and the matrix read ROTATIONS without torch)

    if d < 1 or d & (d - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-2 head dimension, not {d}")
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d ** 0.5


def rotate(x, rotation: str):
    """x: [..., D] tensor -> fp32 [..., D]: x @ H_D / sqrt(D) for "hadamard", x for "none"."""
    if rotation == "none":
        return x.float()
    if rotation == "hadamard":
        return x.float() @ hadamard(x.shape[-1])
    raise ValueError(f"unknown index rotation {rotation!r}; expected one of {ROTATIONS}")
