"""The kernel tests' one setting: without a CUDA device the Triton kernels run under the
interpreter on CPU tensors. TRITON_INTERPRET must be set before triton is imported (niah.kernels
imports it lazily, on a kernel's first call), so it is set here, once, when this folder's tests
are collected. With a GPU the same tests run on CUDA. An explicit TRITON_INTERPRET wins.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
