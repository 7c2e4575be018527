"""The embedded OpenAI-compatible server: SmolLM2-135M on the CPU, dense or DSA attention.

Endpoints: GET /health, /v1/models, /server_info; POST /v1/chat/completions,
/v1/completions (both with stream), /tokenize and /v1/tokenize (SGLang/vLLM format).
Extension: a request may carry `niah_needle_span: [start_char, end_char]` (within the
LAST user message's content in chat mode, within `prompt` in completion mode); the reply
then has a top-level `selection_recall` (per layer, the share of the needle's tokens the
indexer kept for the last prompt token; null under dense attention). With
`niah_value_span` (the needle's value, same coordinates) it also has `niah_indexer`: the
indexer probe (probe.py) at the last prompt token and each decode step until the answer
holds the value; null under dense attention.

One worker thread owns the model; an asyncio lock serialises requests (queued in
arrival order), so concurrent clients never share caches mid-request.
"""



import asyncio
import json
import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

MAX_STOPS = 16
EXTENSIONS = ["needle_span", "indexer_probe"]


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.param, self.type = message, status, param, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


@dataclass
class ServeConfig:
    attention: str = "dense"
    index_dtype: str = "fp8"
    index_topk: int = 512
    window: int = 0
    query_chunk: int = 512
    threads: int = 2
    index_rotation: str = "none"
    device: str = "cpu"             # "cpu" or "cuda[:N]" (serving/embedded/device.py)
    rope_scaling: str = "none"      # "none" or "yarn" (context x rope_factor)
    rope_factor: float = 4.0
    bf16_read: str = "fused"        # CUDA, bf16 keys: "fused" (kernels) or "gather" (the naive read)
    topk_impl: str = "niah"         # CUDA: "niah" (bundled top-k) or "torch"

    def describe(self) -> dict:
        d = {"attention": self.attention}
        if self.device != "cpu":
            d["device"] = self.device
        if self.rope_scaling != "none":
            d.update(rope_scaling=self.rope_scaling, rope_factor=self.rope_factor)
        if self.attention == "dsa":
            d.update(index_dtype=self.index_dtype, index_rotation=self.index_rotation, index_topk=self.index_topk,
                     window=self.window, query_chunk=self.query_chunk)
            if self.device != "cpu":
                d["topk"] = self.topk_impl
                if self.index_dtype == "bf16":
                    d["bf16_read"] = self.bf16_read
        return d


class Engine:
    """The model, tokenizer and chat template behind one lock-free single worker."""

    def __init__(self, cfg: ServeConfig):
        import torch

        from niah.serving.embedded import weights
        from niah.serving.embedded.device import build_model, warm_up

        torch.set_num_threads(cfg.threads)
        t0 = time.perf_counter()
        loaded = weights.load()
        self.model = build_model(cfg, loaded)
        if cfg.attention != "dsa":  # attested too: /server_info says no indexer ran
            from niah.serving.sglang import attest

            attest.set_facts(attention=cfg.attention, **({"device": cfg.device} if cfg.device != "cpu" else {}))
        if cfg.device != "cpu":
            warm_up(self.model, cfg.index_topk)
        self.load_s = time.perf_counter() - t0
        self.from_cache = loaded.from_cache
        self.cfg = cfg
        self.tok = loaded.tokenizer
        self.meta = loaded.meta
        self.model_id = loaded.meta["model_id"]
        self.max_len = self.model.args.block_size
        self.eos_ids = set(loaded.meta["eos_token_ids"]) | {
            i for i in (self.tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>")) if i is not None}
        self._template = _compile_template(loaded.meta["chat_template"])
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="niah-model")

    # -- text <-> tokens ------------------------------------------------------------------
    def render_chat(self, messages: list[dict]) -> str:
        return self._template.render(messages=messages, add_generation_prompt=True,
                                     bos_token=self.meta.get("bos_token") or "",
                                     eos_token=self.meta.get("eos_token") or "")

    def encode(self, text: str):
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def _compile_template(src: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ApiError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(src)


# -- request parsing -----------------------------------------------------------------------
def _content_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):                       # OpenAI content parts
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(f"{where}: only text content parts are supported", param="messages")
            parts.append(p["text"])
        return "".join(parts)
    if content is None:
        return ""
    raise ApiError(f"{where}: content must be a string or a list of text parts", param="messages")


def parse_messages(raw) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise ApiError("`messages` must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise ApiError(f"messages[{i}]: needs a role of system/user/assistant", param="messages")
        out.append({"role": m["role"], "content": _content_text(m.get("content"), f"messages[{i}]")})
    return out


def _int_field(body: dict, name: str, default, lo: int | None = None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        raise ApiError(f"`{name}` must be an integer >= {lo}", param=name)
    return v


def _stops(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or len(s) > MAX_STOPS or not all(isinstance(x, str) for x in s):
        raise ApiError(f"`stop` must be a string or a list of at most {MAX_STOPS} strings", param="stop")
    return s


def _needle_span(body: dict, text_len: int, field: str = "niah_needle_span") -> tuple[int, int] | None:
    span = body.get(field)
    if span is None:
        return None
    if (not isinstance(span, (list, tuple)) or len(span) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            or not 0 <= span[0] <= span[1] <= text_len):
        raise ApiError(f"`{field}` must be [start, end] with 0 <= start <= end <= {text_len} "
                       "(characters of the last user message / the prompt)", param=field)
    return span[0], span[1]


def _token_span(offsets: list[tuple[int, int]], a: int, b: int) -> tuple[int, int]:
    """Token positions [i, j) whose character spans overlap [a, b)."""
    idx = [i for i, (s, e) in enumerate(offsets) if s < b and e > a]
    return (idx[0], idx[-1] + 1) if idx else (0, 0)


@dataclass
class Prepared:
    ids: list[int]
    needle: tuple[int, int] | None
    max_tokens: int
    stops: list[str]
    value: tuple[tuple[int, int], str] | None = None    # the needle value's token span and text


def prepare(engine: Engine, body: dict, chat: bool) -> Prepared:
    """Validate a completion request and tokenize its prompt."""
    if chat:
        messages = parse_messages(body.get("messages"))
        text = engine.render_chat(messages)
        users = [m for m in messages if m["role"] == "user"]
        last_user = users[-1]["content"] if users else ""
        span = _needle_span(body, len(last_user))
        vspan = _needle_span(body, len(last_user), "niah_value_span")
        base = text.rfind(last_user) if span is not None or vspan is not None else 0
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError("`prompt` must be a string", param="prompt")
        text = prompt
        span = _needle_span(body, len(text))
        vspan = _needle_span(body, len(text), "niah_value_span")
        base = 0
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError("only n=1 is supported", param="n")
    enc = engine.encode(text)
    ids = list(enc.ids)
    if not ids:
        raise ApiError("the prompt is empty", param="prompt")
    needle = _token_span(enc.offsets, base + span[0], base + span[1]) if span is not None else None
    value = None
    if vspan is not None:
        value = (_token_span(enc.offsets, base + vspan[0], base + vspan[1]), text[base + vspan[0]:base + vspan[1]])
    room = engine.max_len - len(ids)
    max_tokens = _int_field(body, "max_completion_tokens", None, 1)
    max_tokens = _int_field(body, "max_tokens", max_tokens, 1)
    if max_tokens is None:
        if room < 1:
            raise ApiError(f"the prompt has {len(ids)} tokens; this model's context is {engine.max_len} "
                           "tokens, and at least one must be left to generate", param="messages" if chat else "prompt")
        max_tokens = room
    elif len(ids) + max_tokens > engine.max_len:
        raise ApiError(f"this model's maximum context length is {engine.max_len} tokens; the request has "
                       f"{len(ids)} prompt tokens + {max_tokens} max_tokens = {len(ids) + max_tokens}",
                       param="max_tokens")
    temp = body.get("temperature")
    if temp is not None and (not isinstance(temp, (int, float)) or temp < 0):
        raise ApiError("`temperature` must be a number >= 0 (decoding is always greedy)", param="temperature")
    return Prepared(ids, needle, max_tokens, _stops(body), value)


def _extensions(p: Prepared, g) -> dict:
    """The reply's niah fields: selection_recall (with a needle span), niah_indexer (with a value span)."""
    out = {}
    if p.needle is not None:
        out["selection_recall"] = g.selection_recall
    if p.value is not None:
        out["niah_indexer"] = g.indexer
    return out


# -- the app -----------------------------------------------------------------------------
def create_app(engine: Engine):
    from niah.serving.embedded.dsa import attestation as dsa_attestation

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app = FastAPI(title="niah embedded server")
    lock = asyncio.Lock()
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(_req, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req, e):
        return JSONResponse(ApiError(str(e)).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, e):
        return JSONResponse(ApiError(str(e.detail), e.status_code, type_="not_found_error"
                                     if e.status_code == 404 else "invalid_request_error").body(),
                            status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(_req, e):
        return JSONResponse(ApiError(f"internal error: {type(e).__name__}: {e}", 500, type_="server_error").body(),
                            status_code=500)

    async def json_body(request: Request) -> dict:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise ApiError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError("the request body must be a JSON object")
        return body

    def server_info() -> dict:
        return {"model": engine.model_id, "max_model_len": engine.max_len, **engine.cfg.describe(),
                "niah_extensions": EXTENSIONS, "threads": engine.cfg.threads,
                "load_s": round(engine.load_s, 3), "weights_from_cache": engine.from_cache,
                "n_layers": engine.model.args.n_layer, "niah_attestation": dsa_attestation()}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/server_info")
    async def info():
        return server_info()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": engine.model_id, "object": "model", "created": created, "owned_by": "niah",
            "root": engine.model_id, "max_model_len": engine.max_len,
            "niah_extensions": EXTENSIONS, **engine.cfg.describe()}]}

    async def tokenize(request: Request):
        body = await json_body(request)
        if "messages" in body:
            text = engine.render_chat(parse_messages(body["messages"]))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise ApiError("send {\"prompt\": str} or {\"messages\": [...]}", param="prompt")
        ids = list(engine.encode(text).ids)
        return {"count": len(ids), "tokens": ids, "max_model_len": engine.max_len}

    app.post("/tokenize")(tokenize)
    app.post("/v1/tokenize")(tokenize)

    async def run_model(p: Prepared, on_text=None, cancelled=None):
        from niah.serving.embedded.generate import generate

        loop = asyncio.get_running_loop()
        async with lock:
            return await loop.run_in_executor(engine.pool, lambda: generate(
                engine.model, engine.decode, p.ids, p.max_tokens, engine.eos_ids, p.stops,
                p.needle, p.value, on_text, cancelled))

    def usage(p: Prepared, g) -> dict:
        return {"prompt_tokens": len(p.ids), "completion_tokens": g.completion_tokens,
                "total_tokens": len(p.ids) + g.completion_tokens}

    async def completions(request: Request, chat: bool):
        body = await json_body(request)
        p = prepare(engine, body, chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if chat else "text_completion"
        model_name = body.get("model") or engine.model_id
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            return StreamingResponse(stream(p, rid, obj + (".chunk" if chat else ""), model_name, chat,
                                            bool(isinstance(opts, dict) and opts.get("include_usage"))),
                                     media_type="text/event-stream")
        g = await run_model(p)
        choice = ({"index": 0, "message": {"role": "assistant", "content": g.text}, "logprobs": None,
                   "finish_reason": g.finish_reason} if chat else
                  {"index": 0, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason})
        out = {"id": rid, "object": obj, "created": int(time.time()), "model": model_name,
               "choices": [choice], "usage": usage(p, g)}
        return {**out, **_extensions(p, g)}

    async def stream(p: Prepared, rid: str, obj: str, model_name: str, chat: bool, include_usage: bool):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop_flag = threading.Event()
        now = int(time.time())

        def chunk(delta_or_text, finish=None, **extra) -> str:
            c = ({"index": 0, "delta": delta_or_text, "logprobs": None, "finish_reason": finish} if chat else
                 {"index": 0, "text": delta_or_text, "logprobs": None, "finish_reason": finish})
            return "data: " + json.dumps({"id": rid, "object": obj, "created": now, "model": model_name,
                                          "choices": [c], **extra}) + "\n\n"

        def on_text(piece: str):
            loop.call_soon_threadsafe(queue.put_nowait, piece)

        task = asyncio.ensure_future(run_model(p, on_text, stop_flag.is_set))
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                piece = await queue.get()
                if piece is None:
                    break
                yield chunk({"content": piece} if chat else piece)
            try:
                g = task.result()
            except ApiError as e:
                yield "data: " + json.dumps(e.body()) + "\n\n"
                return
            except Exception as e:  # noqa: BLE001 - reported to the client, server keeps serving
                yield "data: " + json.dumps(ApiError(f"internal error: {e}", 500, type_="server_error").body()) + "\n\n"
                return
            extra = _extensions(p, g)
            yield chunk({} if chat else "", g.finish_reason, **extra)
            if include_usage:
                yield "data: " + json.dumps({"id": rid, "object": obj, "created": now, "model": model_name,
                                             "choices": [], "usage": usage(p, g), **extra}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            stop_flag.set()                     # client gone or done: stop generating early

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completions(request, True)

    @app.post("/v1/completions")
    async def text_completions(request: Request):
        return await completions(request, False)

    app.state.server_info = server_info
    return app


def _server_class():
    import contextlib
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM after a graceful shutdown (exit status 143); here the
        first SIGTERM/SIGINT shuts down gracefully and the process exits 0, a second forces."""

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return

            def handle(_sig, _frame):
                if self.should_exit:
                    self.force_exit = True
                self.should_exit = True

            prev = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in prev.items():
                    signal.signal(s, h)

    return Server


def serve(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Load the model, start uvicorn, print one ready line; SIGTERM/SIGINT shut down cleanly."""
    import uvicorn

    _Server = _server_class()
    t0 = time.perf_counter()
    engine = Engine(cfg)
    app = create_app(engine)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    server = _Server(config)

    async def run():
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            desc = " ".join(f"{k}={v}" for k, v in cfg.describe().items())
            print(f"niah serve: ready on http://{host}:{port} model={engine.model_id} {desc} "
                  f"(loaded in {engine.load_s:.1f} s{', cached weights' if engine.from_cache else ', converted GGUF'}; "
                  f"up in {time.perf_counter() - t0:.1f} s)", flush=True)
        try:
            await task
        except SystemExit:          # uvicorn's start-up failure (e.g. the port is taken); logged above
            pass

    try:
        asyncio.run(run())
    finally:
        engine.pool.shutdown(wait=False, cancel_futures=True)
    if not server.started:
        print(f"niah serve: could not start on {host}:{port} (see the error above)", file=sys.stderr, flush=True)
        raise SystemExit(1)
    print("niah serve: stopped", flush=True)
    sys.stderr.flush()
    os._exit(0)   # do not wait for a prefill still running in the worker thread
