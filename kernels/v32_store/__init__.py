"""DeepSeek-V3.2's production indexer key store (SGLang's fused path): LayerNorm, RoPE on the
leading 64 dims, no Hadamard rotation, then a bf16 row (256 B/token) or fp8 (e4m3 + fp32
scale, SGLang's 132-byte rows). Imports triton only when called."""

from niah.kernels.v32_store.wrapper import store_v32_index_keys  # noqa: F401
