"""niah.kernels: the DeepSeek indexer kernels (Triton), with a torch reference beside each.

Import the submodules you need; nothing heavy happens at import time of this package.
"""
