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
arrival order), so concurrent clients never share caches mid-request. Requests are
parsed by api.py (any malformed body or field: a 400, never a 500). A client that goes
away, streaming or not, cancels its generation (lifecycle.py): the model is handed back
within one layer's work and /server_info counts it under `requests`.
"""



import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from niah.errors import ServerError
from niah.serving.embedded import prefix, weights
from niah.serving.embedded.api import ApiError, Prepared, parse_body, prepare, tokenize_text
from niah.serving.embedded.config import ServeConfig  # noqa: F401 (the server's configuration, imported from here)
from niah.serving.embedded.device import build_model, serving_facts, warm_up
from niah.serving.embedded.lifecycle import Job, Jobs
from niah.serving.sglang import attest

EXTENSIONS = ["needle_span", "indexer_probe"]


class Engine:
    """The model, tokenizer and chat template behind one lock-free single worker."""

    def __init__(self, cfg: ServeConfig):
        import torch

        torch.set_num_threads(cfg.threads)
        t0 = time.perf_counter()
        loaded = weights.load()
        self.model = build_model(cfg, loaded)
        if cfg.attention != "dsa":  # attested too: /server_info says no indexer ran
            attest.set_facts(attention=cfg.attention, **({"device": cfg.device} if cfg.device != "cpu" else {}))
        attest.set_facts(**serving_facts(cfg, self.model))
        if cfg.device != "cpu":
            warm_up(self.model, cfg.index_topk)
        self.load_s = time.perf_counter() - t0
        self.from_cache = loaded.from_cache
        self.cfg = cfg
        self.tok = loaded.tokenizer
        self.meta = loaded.meta
        self.model_id = loaded.meta["model_id"]
        self.max_len = min(self.model.args.block_size, cfg.max_model_len or self.model.args.block_size)
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
    from jinja2.ext import loopcontrols  # noqa: PLC0415 (the [serve] extra, as fastapi)
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415 (the [serve] extra)

    def raise_exception(msg):
        raise ApiError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(src)


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
    from niah.serving.embedded.dsa import attestation as dsa_attestation  # noqa: PLC0415 (imports torch)

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app = FastAPI(title="niah embedded server")
    lock = asyncio.Lock()
    jobs = Jobs(engine.model)
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
        return parse_body(await request.body())

    def server_info() -> dict:
        return {"model": engine.model_id, "max_model_len": engine.max_len, **engine.cfg.describe(),
                "niah_extensions": EXTENSIONS, "threads": engine.cfg.threads,
                "load_s": round(engine.load_s, 3), "weights_from_cache": engine.from_cache,
                "n_layers": engine.model.args.n_layer, "niah_attestation": dsa_attestation(),
                "requests": jobs.describe(), **prefix.info(engine.model)}

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
        ids = list(engine.encode(tokenize_text(engine, await json_body(request))).ids)
        return {"count": len(ids), "tokens": ids, "max_model_len": engine.max_len}

    app.post("/tokenize")(tokenize)
    app.post("/v1/tokenize")(tokenize)

    async def run_model(p: Prepared, job: Job, on_text=None):
        """Generate for the job once the model is free; None when it was cancelled first.
        The lock is held until the worker thread is done with the model, never less."""
        from niah.serving.embedded.generate import generate  # noqa: PLC0415 (imports torch)

        def work(cancelled):
            return generate(engine.model, engine.decode, p.ids, p.max_tokens, engine.eos_ids, p.stops,
                            p.needle, p.value, on_text, cancelled)

        loop = asyncio.get_running_loop()
        queued = True
        jobs.waiting += 1
        try:
            async with lock:
                jobs.waiting, queued = jobs.waiting - 1, False
                g = None if job.cancelled else await loop.run_in_executor(engine.pool, jobs.run, job, work)
        except asyncio.CancelledError:      # the one-thread pool still keeps the model to one job
            job.cancel()
            raise
        finally:
            if queued:
                jobs.waiting -= 1
        return None if jobs.finish(job, g) else g

    async def watch_disconnect(request: Request, job: Job) -> None:
        """Cancel the job when the client goes away (the body has been read by now)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()

    def usage(p: Prepared, g) -> dict:
        return {"prompt_tokens": len(p.ids), "completion_tokens": g.completion_tokens,
                "total_tokens": len(p.ids) + g.completion_tokens}

    async def completions(request: Request, chat: bool):
        p = prepare(engine, await json_body(request), chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if chat else "text_completion"
        model_name = p.model or engine.model_id
        job = Job(len(p.ids), p.max_tokens, p.stream)
        if p.stream:       # Starlette ends the stream when the client goes away: stream() cancels
            return StreamingResponse(stream(p, job, rid, obj + (".chunk" if chat else ""), model_name, chat,
                                            p.include_usage), media_type="text/event-stream")
        watcher = asyncio.ensure_future(watch_disconnect(request, job))
        try:
            g = await run_model(p, job)
        finally:
            watcher.cancel()
        if g is None:      # nobody reads this: the client is gone
            raise ApiError(f"the client went away; generation stopped after {job.completion_tokens} tokens", 499)
        choice = ({"index": 0, "message": {"role": "assistant", "content": g.text}, "logprobs": None,
                   "finish_reason": g.finish_reason} if chat else
                  {"index": 0, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason})
        out = {"id": rid, "object": obj, "created": int(time.time()), "model": model_name,
               "choices": [choice], "usage": usage(p, g)}
        return {**out, **_extensions(p, g)}

    async def stream(p: Prepared, job: Job, rid: str, obj: str, model_name: str, chat: bool, include_usage: bool):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        now = int(time.time())

        def chunk(delta_or_text, finish=None, **extra) -> str:
            c = ({"index": 0, "delta": delta_or_text, "logprobs": None, "finish_reason": finish} if chat else
                 {"index": 0, "text": delta_or_text, "logprobs": None, "finish_reason": finish})
            return "data: " + json.dumps({"id": rid, "object": obj, "created": now, "model": model_name,
                                          "choices": [c], **extra}) + "\n\n"

        def on_text(piece: str):
            loop.call_soon_threadsafe(queue.put_nowait, piece)

        task = asyncio.ensure_future(run_model(p, job, on_text))
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
                if g is None:
                    return
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
            job.cancel()                        # client gone (or done): stop generating

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completions(request, True)

    @app.post("/v1/completions")
    async def text_completions(request: Request):
        return await completions(request, False)

    app.state.server_info = server_info
    return app


def _server_class():
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
    except SystemExit:              # uvicorn's start-up failure out of its task: one line below
        pass
    finally:
        engine.pool.shutdown(wait=False, cancel_futures=True)
    if not server.started:
        raise ServerError(f"niah serve could not start on {host}:{port} (see the error above)")
    print("niah serve: stopped", flush=True)
    sys.stderr.flush()
    os._exit(0)   # do not wait for a prefill still running in the worker thread
