"""`niah serve`: the embedded OpenAI-compatible server (SmolLM2-135M, dense or DSA), on the
CPU (the default: DSA emulated in torch) or a CUDA GPU (`--device cuda`: DSA run by the
bundled Triton kernels; docs/embedded-server.md, "On a GPU").

Without the [serve] extra it refuses in one line (exit 2) before anything starts; a port
it cannot listen on (taken) is one line and exit 1, before the model loads.
"""

from __future__ import annotations

import importlib

import typer

from niah.cli import app
from niah.kernels.forms import DEFAULT as DEFAULT_INDEX_DTYPE

# What the server imports (lazily, deep inside): tried first, so a missing or broken one is
# one line here, never a traceback from the middle of the model's loading.
SERVE_MODULES = ("fastapi", "uvicorn", "torch", "safetensors", "tokenizers", "jinja2", "gguf")


def check_serve_extra() -> None:
    """BadInput naming the first module of the [serve] extra that cannot be imported."""
    from niah.errors import BadInput, one_line

    for name in SERVE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise BadInput(f"niah serve needs the [serve] extra: {name} cannot be imported ({one_line(e, 160)}); "
                           "pip install 'niah-lab[serve]' (in a checkout: pip install -e '.[serve]')") from None


def check_port(host: str, port: int) -> None:
    """ServerError (exit 1, one line) when `host:port` cannot be listened on (taken, or an
    address this machine does not have); tried as uvicorn binds, with SO_REUSEADDR."""
    import socket

    from niah.errors import ServerError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise ServerError(f"niah serve could not start: cannot resolve --host {host}: {e.strerror or e}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise ServerError(f"niah serve could not start: cannot listen on {host}:{port}: "
                              f"{e.strerror or e}") from None


def check_paths(attention: str, index_dtype: str, device: str, page_size: int | None, prefill_chunk: int | None,
                prefix_cache: bool, index_compress: int) -> None:
    """BadInput (one line) for serving-path options the server cannot run as asked."""
    from niah.errors import BadInput

    cpu_only = [flag for flag, on in (("--page-size", page_size is not None), ("--prefill-chunk", prefill_chunk),
                                      ("--prefix-cache", prefix_cache), ("--index-compress", index_compress != 1))
                if on]
    if device != "cpu" and cpu_only:
        raise BadInput(f"{', '.join(cpu_only)}: served on the CPU only (the CUDA path pages its index keys by 64 and "
                       "chunks its prefill at --query-chunk)")
    if page_size is not None and page_size < 1:
        raise BadInput("--page-size must be >= 1")
    if prefill_chunk is not None and prefill_chunk < 1:
        raise BadInput("--prefill-chunk must be >= 1")
    if prefix_cache and page_size is None:
        raise BadInput("--prefix-cache reuses pages: give it a --page-size")
    if index_compress not in (1, 4):
        raise BadInput(f"--index-compress must be 1 (off) or 4, not {index_compress}")
    if index_compress != 1 and (attention != "dsa" or "+" in index_dtype):
        raise BadInput("--index-compress 4 compresses the indexer's keys: use it with --attention dsa and a "
                       "single-stage --index-dtype")
    if index_compress != 1 and page_size is not None and page_size % index_compress:
        raise BadInput(f"--page-size {page_size} under --index-compress {index_compress} must be a multiple of "
                       f"{index_compress} (a page holds whole blocks)")


@app.command()
def serve(
    attention: str = typer.Option("dsa", help="dsa (DeepSeek-style indexer + top-k) or dense (the control)."),
    index_dtype: str = typer.Option(DEFAULT_INDEX_DTYPE, "--index-dtype",
                                    help="Index keys as stored: fp8 (SGLang's e4m3 + scale), bf16 or fp32; on the "
                                         "CPU also fp4 (SGLang's MXFP4) and two-stage fp8+bf16 / fp4+bf16: both "
                                         "forms stored, the first scores every key, its c*k best are re-scored from "
                                         "bf16 rows."),
    index_query_dtype: str = typer.Option(
        None, "--index-query-dtype",
        help="CPU: the index query's precision: fp32 (the default), bf16, fp8 (SGLang's: e4m3, one scale a "
             "token and head) or fp4 (MXFP4, as the keys)."),
    rescore_factor: int = typer.Option(None, "--rescore-factor",
                                       help="Two-stage index dtypes: c, the c*k candidates re-scored (default 4)."),
    index_rotation: str = typer.Option(
        "none", "--index-rotation",
        help="none (SGLang's fused V3.2 path) or hadamard (DeepSeek's reference: index query and keys "
             "rotated by the normalised Hadamard transform before the key store quantises)."),
    index_topk: int = typer.Option(512, "--index-topk", help="Keys each query keeps (DSA)."),
    window: int = typer.Option(0, help="The last W tokens are always kept too (DSA)."),
    query_chunk: int = typer.Option(None, "--query-chunk",
                                    help="Queries scored at once (bounds memory; default 512 on the CPU, 4096 on "
                                         "CUDA)."),
    device: str = typer.Option("cpu",
                               help="cpu (DSA emulated in torch) or cuda / cuda:N (DSA by niah's Triton kernels)."),
    rope_scaling: str = typer.Option("none", "--rope-scaling",
                                     help="none, or yarn: YaRN over the original 8,192 tokens, context x "
                                          "--rope-factor."),
    rope_factor: float = typer.Option(4.0, "--rope-factor", help="YaRN factor (with --rope-scaling yarn)."),
    bf16_read: str = typer.Option("fused", "--bf16-read",
                                  help="CUDA with bf16 keys: fused (the kernels read pages in place) or gather "
                                       "(the naive read: every page copied for every query)."),
    topk_impl: str = typer.Option("niah", "--topk",
                                  help="CUDA top-k: niah (the bundled kernel), torch (torch.topk) or fused (prefill "
                                       "chunks through the fused indexer + top-k over the pages in place, fp8 or "
                                       "bf16 keys; a chunk holding a row it cannot vouch for is scored again "
                                       "unfused)."),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="CUDA: replay decode steps from CUDA graphs (default) or run them eagerly."),
    page_size: int = typer.Option(None, "--page-size",
                                  help="CPU: page the index-key cache, P tokens a page behind one block table "
                                       "(default: flat, one row a position)."),
    prefill_chunk: int = typer.Option(None, "--prefill-chunk",
                                      help="CPU: chunked prefill, N prompt tokens a forward pass (default: one pass)."),
    prefix_cache: bool = typer.Option(False, "--prefix-cache",
                                      help="CPU: reuse the KV and index-key pages of an earlier request's shared "
                                           "prefix (longest page-aligned match; needs --page-size)."),
    index_compress: int = typer.Option(1, "--index-compress",
                                       help="CPU, DSA: 4 = V4-style index compression (one index key per 4 tokens, "
                                            "top-k over blocks, their tokens plus --window); 1 = off."),
    fault: list[str] = typer.Option(None, "--fault",
                                    help="CPU: plant a fault, NAME[:PARAM] (repeatable): layout, residue, page-move, "
                                         "prefix-stale, topk, rope-base, decode-page (docs/embedded-server.md)."),
    max_model_len: int = typer.Option(None, "--max-model-len",
                                      help="Serve a context of N tokens (prompt + generated), below the model's "
                                           "own (8,192; x --rope-factor with YaRN): longer requests are refused "
                                           "and /v1/models reports N, as vLLM's option of this name does."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, help="Port to listen on."),
    threads: int = typer.Option(2, help="torch CPU threads."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve SmolLM2-135M-Instruct, OpenAI-compatible, with dense or DSA attention (CPU or CUDA)."""
    from niah.errors import BadInput
    from niah.kernels import forms
    from niah.kernels.rotation import ROTATIONS

    if attention not in ("dense", "dsa"):
        raise BadInput(f"--attention must be dense or dsa, not {attention!r}")
    from niah.serving.embedded import precision

    if index_dtype not in precision.index_dtypes():
        raise BadInput(f"--index-dtype must be one of {', '.join(precision.index_dtypes())}, "
                       f"not {index_dtype!r}")
    if index_query_dtype is not None and index_query_dtype not in precision.query_dtypes():
        raise BadInput(f"--index-query-dtype must be one of {', '.join(precision.query_dtypes())}, "
                       f"not {index_query_dtype!r}")
    two_stage = index_dtype in precision.two_stage_dtypes()
    if rescore_factor is not None and not two_stage:
        raise BadInput(f"--rescore-factor needs a two-stage --index-dtype ({', '.join(precision.two_stage_dtypes())}), "
                       f"not {index_dtype}")
    if rescore_factor is not None and rescore_factor < 1:
        raise BadInput("--rescore-factor must be >= 1")
    if attention != "dsa" and (index_query_dtype is not None or rescore_factor is not None):
        raise BadInput("--index-query-dtype and --rescore-factor set the indexer: use them with --attention dsa")
    if index_rotation not in ROTATIONS:
        raise BadInput(f"--index-rotation must be {' or '.join(ROTATIONS)}, not {index_rotation!r}")
    if index_topk < 1:
        raise BadInput("--index-topk must be >= 1")
    if window < 0:
        raise BadInput("--window must be >= 0")
    if query_chunk is None:
        query_chunk = 512 if device == "cpu" else 4096
    if query_chunk < 1 or threads < 1:
        raise BadInput("--query-chunk and --threads must be >= 1")
    if rope_scaling not in ("none", "yarn"):
        raise BadInput(f"--rope-scaling must be none or yarn, not {rope_scaling!r}")
    if rope_scaling == "yarn" and not 1 < rope_factor <= 64:
        raise BadInput(f"--rope-factor must be in (1, 64], not {rope_factor}")
    if bf16_read not in ("fused", "gather"):
        raise BadInput(f"--bf16-read must be fused or gather, not {bf16_read!r}")
    if topk_impl not in ("niah", "torch", "fused"):
        raise BadInput(f"--topk must be niah, torch or fused, not {topk_impl!r}")
    if device != "cpu":
        if index_dtype not in forms.names(forms.CUDA):
            raise BadInput(f"--index-dtype {index_dtype} is served on the CPU only (--device cpu)")
        if index_query_dtype is not None:
            raise BadInput("--index-query-dtype is served on the CPU only (--device cpu)")
        if attention == "dsa" and window:
            raise BadInput("--window is not served with --device cuda (the GPU path keeps the top-k only)")
        if bf16_read == "gather" and (attention != "dsa" or index_dtype != "bf16"):
            raise BadInput("--bf16-read gather needs --attention dsa --index-dtype bf16")
        if topk_impl == "fused" and (attention != "dsa" or index_dtype not in ("fp8", "bf16") or bf16_read != "fused"):
            raise BadInput("--topk fused scores fp8 or bf16 pages in place: use --attention dsa, --index-dtype fp8 "
                           "or bf16, and the fused bf16 read")
    elif bf16_read != "fused" or topk_impl != "niah" or not cuda_graphs:
        raise BadInput("--bf16-read, --topk and --no-cuda-graphs choose the CUDA path's kernels: use them with "
                       "--device cuda")
    check_paths(attention, index_dtype, device, page_size, prefill_chunk, prefix_cache, index_compress)
    from niah.serving.embedded import faults

    try:
        faults.parse(list(fault or []), attention=attention, index_topk=index_topk, compress=index_compress,
                     prefix_cache=prefix_cache, page_size=page_size, device=device)
    except ValueError as e:
        raise BadInput(str(e)) from None
    from niah.serving.embedded.device import check_device

    check_device(device)
    native = int(8192 * (rope_factor if rope_scaling == "yarn" else 1))
    if max_model_len is not None and not 64 <= max_model_len <= native:
        raise BadInput(f"--max-model-len must be 64..{native:,} (the model's context), not {max_model_len}")
    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be 0..65535, not {port}")
    check_port(host, port)  # before the model loads: a taken port is one line, exit 1
    check_serve_extra()
    from niah.serving.embedded.server import ServeConfig, serve as run
    from niah.serving.embedded.weights import gguf_path

    gguf_path()   # a clear error before anything heavy when the weights are missing
    run(ServeConfig(attention, index_dtype, index_topk, window, query_chunk, threads, index_rotation,
                    device=device, rope_scaling=rope_scaling, rope_factor=rope_factor, bf16_read=bf16_read,
                    topk_impl=topk_impl, cuda_graphs=cuda_graphs,
                    index_query_dtype=index_query_dtype or precision.DEFAULT_QUERY_DTYPE,
                    rescore_factor=rescore_factor or precision.DEFAULT_RESCORE_FACTOR, page_size=page_size,
                    prefill_chunk=prefill_chunk, prefix_cache=prefix_cache, index_compress=index_compress,
                    faults=tuple(fault or ()), max_model_len=max_model_len),
        host=host, port=port, log_level=log_level)
