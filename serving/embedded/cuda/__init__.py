"""The embedded server on a GPU: DeepSeek-style sparse attention run by niah's bundled
Triton kernels (indexer.py), the paged index-key pool in SGLang's layout (paging.py),
attention over the kept keys (attend.py, sparse_kernel.py), GPU memory accounting
(memory.py). Importing this package imports neither torch nor triton."""
