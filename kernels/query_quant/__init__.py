"""The index query's quantisation: quantize_query (fp8 per row scale folded into the weights,
or bf16; heads padded), one launch. Imports triton only when called."""

from niah.kernels.query_quant.wrapper import quantize_query  # noqa: F401
