"""The key store: store_index_keys (quantise + write by slot mapping). Imports triton only when called."""

from niah.kernels.store.wrapper import store_index_keys  # noqa: F401
