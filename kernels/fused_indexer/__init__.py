"""Fused indexer logits + top-k over the paged index-key pool (prefill rows); no [rows, keys] logits."""
