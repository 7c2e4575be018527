"""A tiny real HTTP server for lifecycle tests: /health and /v1/models on loopback.

    python tests/servers/tiny_server.py --port P [--ready-after S] [--fail-with MSG]
        [--child] [--ignore-sigterm] [--die-after S --die-with MSG]

--fail-with MSG   print a traceback-like MSG and exit 1 before listening (start-up death)
--child           start a grandchild (sleep) in the same process group, print its pid
--ignore-sigterm  ignore SIGTERM (teardown must escalate to SIGKILL)
--die-after S     S seconds after its first ready /health, print --die-with and exit 1
--ready-after S   answer /health with 503 for S seconds first
--die-on-request N  on the N-th chat request, print --die-with and exit 1 (no answer)
--print-env PREFIX  print every environment variable whose name starts with PREFIX (sorted),
                  then "env printed"
--attestation JSON  GET /server_info reports it as SGLang's plugin does:
                  internal_states[i]["niah_attestation"] (e.g. a contradicting one)
--attest-per-request JSON  `calls` ({path: {dtype: {kernel: {eager, replayed}}}}) added to
                  the attestation's calls for every chat request served (not the probes)
--internal-states N  /server_info is SGLang-shaped with N scheduler states (default 1);
                  without --attestation none carries one (as when niah's plugin is absent)
--attested-states K  only the first K states carry the attestation
--server-info-status CODE  /server_info answers HTTP CODE (default 500) ...
--server-info-fail-after N  ... once N chat requests were served (0: always)

POST /v1/chat/completions answers the first 7-digit number in the prompt (the needle)
after --delay seconds, as plain JSON (no streaming), so a sweep against it scores
"correct". Its "tokens" are whitespace-separated words (3 more for the chat template, 1
for a prompt's BOS), as POST /tokenize (vLLM's shape) and usage.prompt_tokens both say,
so niah's lengths against it are exact. A max_tokens=1 request (niah checking its
counter) is answered but not counted by --die-on-request.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--fail-with")
    p.add_argument("--child", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--die-after", type=float)
    p.add_argument("--die-with", default="")
    p.add_argument("--die-on-request", type=int)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--attestation", type=json.loads)
    p.add_argument("--print-env")
    p.add_argument("--attest-per-request", type=json.loads)
    p.add_argument("--internal-states", type=int)
    p.add_argument("--attested-states", type=int)
    p.add_argument("--server-info-status", type=int, default=500)
    p.add_argument("--server-info-fail-after", type=int)
    a = p.parse_args()

    print(f"tiny server pid {os.getpid()} starting on {a.host}:{a.port}", flush=True)
    if a.print_env is not None:
        for k in sorted(os.environ):
            if k.startswith(a.print_env):
                print(f"env {k}={os.environ[k]}", flush=True)
        print("env printed", flush=True)
    if a.fail_with:
        print("Traceback (most recent call last):", flush=True)
        print('  File "tiny_server.py", line 1, in <module>', flush=True)
        print(a.fail_with, flush=True)
        sys.exit(1)
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if a.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child pid {child.pid}", flush=True)
    t0 = time.monotonic()
    served = [0]
    dying: list = []

    def die():
        time.sleep(a.die_after)
        print(a.die_with, flush=True)
        os._exit(1)

    lock = threading.Lock()

    def attestation_now() -> dict:
        """--attestation with --attest-per-request's calls added once per request served."""
        att = json.loads(json.dumps(a.attestation))
        for path, by_dtype in (a.attest_per_request or {}).items() if served[0] else ():
            for dtype, by_kernel in by_dtype.items():
                for kernel, n in by_kernel.items():
                    cell = att.setdefault("calls", {}).setdefault(path, {}).setdefault(dtype, {}).setdefault(kernel, {})
                    for kind, v in n.items():
                        cell[kind] = cell.get(kind, 0) + v * served[0]
        return att

    def server_info() -> tuple[int, dict]:
        if a.server_info_fail_after is not None and served[0] >= a.server_info_fail_after:
            return a.server_info_status, {"error": "server_info failed"}
        if a.attestation is None and a.internal_states is None:
            return 404, {"error": "not found"}
        states = [{"dp_rank": i} for i in range(a.internal_states or 1)]
        if a.attestation is not None:
            for st in states[: a.attested_states if a.attested_states is not None else len(states)]:
                st["niah_attestation"] = attestation_now()
        return 200, {"version": "tiny", "internal_states": states}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):
            print("request: " + fmt % args, flush=True)

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                ready = time.monotonic() - t0 >= a.ready_after
                self._send(200 if ready else 503, {"ready": ready})
                if ready and a.die_after is not None and not dying:
                    dying.append(1)
                    threading.Thread(target=die, daemon=True).start()
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
            elif self.path == "/server_info":
                self._send(*server_info())
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                if "messages" in body:
                    n = 3 + sum(len(m.get("content", "").split()) for m in body["messages"])
                else:
                    n = len(body.get("prompt", "").split()) + (1 if body.get("add_special_tokens", True) else 0)
                return self._send(200, {"count": n, "max_model_len": 8192})
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": "not found"})
            probe = body.get("max_tokens") == 1
            with lock:
                served[0] += not probe
                n = served[0]
            if not probe and a.die_on_request is not None and n >= a.die_on_request:
                print(a.die_with, flush=True)
                os._exit(1)
            time.sleep(a.delay)
            text = " ".join(m.get("content", "") for m in body.get("messages", []))
            m = re.search(r"\b\d{7}\b", text)
            answer = m.group(0) if m else "I do not know."
            self._send(200, {
                "id": f"tiny-{n}", "object": "chat.completion", "model": "tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3 + len(text.split()), "completion_tokens": 1},
            })

    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    print("listening", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
