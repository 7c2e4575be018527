"""niah: long-context recall lab for sparse-attention serving."""

__version__ = "0.1.0"
