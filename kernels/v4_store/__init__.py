"""DeepSeek-V4's index-key store (compressed C4 keys): RMSNorm, RoPE, 128-wide Hadamard,
then fp8 (e4m3 + fp32 scale, SGLang's 132-byte rows) or bf16 rows. Imports triton only when called."""

from niah.kernels.v4_store.wrapper import store_v4_index_keys  # noqa: F401
