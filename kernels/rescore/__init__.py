"""Two-stage selection's re-score: bf16_paged_rescore (the candidates' bf16 rows gathered
by index and scored) and fp8_bf16_two_stage_topk (fp8 logits, candidates, re-score, top-k).
Imports triton only when called."""

from niah.kernels.rescore.wrapper import bf16_paged_rescore, fp8_bf16_two_stage_topk  # noqa: F401
