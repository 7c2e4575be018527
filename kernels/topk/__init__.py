"""Top-k over logits rows: topk_indices (int32, -1 padding). Imports triton only when called."""

from niah.kernels.topk.wrapper import topk_indices  # noqa: F401
