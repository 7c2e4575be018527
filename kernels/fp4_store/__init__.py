"""The fp4 (MXFP4) key store: store_fp4_index_keys (quantise + write by slot). Imports triton only when called."""

from niah.kernels.fp4_store.wrapper import store_fp4_index_keys  # noqa: F401
