"""A real, scriptable OpenAI-compatible HTTP server for tests.

It listens on 127.0.0.1 (port 0, so tests never collide), serves ``/v1/chat/completions`` and
``/v1/embeddings`` in a background thread, and answers each request with the next scripted
``Behaviour`` — a good answer, fenced or chatty JSON, truncated JSON, a refusal, an HTTP
error, a slow answer — or, once the queue is empty, with a ``responder`` function the test
installed. Every request is recorded (path, headers, JSON body), so tests can check what
arbormem actually sent. Nothing of arbormem is patched: the client under test talks HTTP.

    with ScriptedOpenAIServer() as server:
        server.script(fenced({"title": "Sourdough"}), http_error(500))
        llm = OpenAICompatibleLLM(server.url, "test-model")
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: The API key tests configure; asserted never to appear in logs, names or errors.
API_KEY = "sk-test-5f3a9c-secret"

__all__ = [
    "API_KEY",
    "Behaviour",
    "Recorded",
    "ScriptedOpenAIServer",
    "answer",
    "answer_json",
    "chatty",
    "empty",
    "fenced",
    "garbage_body",
    "http_error",
    "refusal",
    "slow",
    "truncated",
    "vectors",
    "hash_vectors",
]


@dataclass
class Behaviour:
    """What the server does for one request."""

    status: int = 200
    content: str | None = ""
    refusal: str | None = None
    finish_reason: str = "stop"
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None  # sent as-is instead of a completion (broken servers)
    error_message: str = "scripted error"
    embed: Callable[[list[str]], list[list[float]]] | None = None  # /v1/embeddings only
    reverse: bool = False  # /v1/embeddings: list rows last-first (indexes still correct)
    label: str = ""


# -- behaviour factories ----------------------------------------------------------------------
def answer(text: str) -> Behaviour:
    """A normal completion whose content is ``text``."""
    return Behaviour(content=text, label="answer")


def answer_json(obj: Any) -> Behaviour:
    """A completion whose content is exactly the JSON of ``obj``."""
    return Behaviour(content=json.dumps(obj, ensure_ascii=False), label="json")


def fenced(obj: Any, lang: str = "json") -> Behaviour:
    """JSON inside a markdown code fence, as many chat models answer."""
    body = json.dumps(obj, ensure_ascii=False, indent=2)
    return Behaviour(content=f"```{lang}\n{body}\n```", label="fenced")


def chatty(obj: Any) -> Behaviour:
    """JSON with prose before and after it."""
    body = json.dumps(obj, ensure_ascii=False)
    text = f"Sure! Here is the JSON you asked for:\n\n{body}\n\nLet me know if you need more."
    return Behaviour(content=text, label="chatty")


def truncated(obj: Any, keep: float = 0.6, finish_reason: str = "length") -> Behaviour:
    """The JSON of ``obj`` cut after ``keep`` of its characters (mid-value, as max_tokens does)."""
    body = json.dumps(obj, ensure_ascii=False)
    return Behaviour(
        content=body[: max(1, int(len(body) * keep))], finish_reason=finish_reason, label="truncated"
    )


def refusal(text: str = "I'm sorry, but I can't help with that.", *, field_: bool = True) -> Behaviour:
    """A refusal: in the ``refusal`` field (OpenAI) or as plain content (most local models)."""
    if field_:
        return Behaviour(content=None, refusal=text, label="refusal")
    return Behaviour(content=text, label="refusal-text")


def empty() -> Behaviour:
    """A completion with empty content."""
    return Behaviour(content="", label="empty")


def http_error(status: int, *, retry_after: float | None = None, message: str = "scripted error") -> Behaviour:
    """An HTTP error with an OpenAI-style error body."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Behaviour(status=status, headers=headers, error_message=message, label=f"http-{status}")


def slow(seconds: float, then: Behaviour | None = None) -> Behaviour:
    """Wait ``seconds`` before answering ``then`` (a timeout when longer than the client's)."""
    b = then if then is not None else answer("{}")
    return Behaviour(**{**b.__dict__, "delay": seconds, "label": f"slow({seconds})+{b.label}"})


def garbage_body() -> Behaviour:
    """HTTP 200 whose body is not JSON at all (a misconfigured proxy)."""
    return Behaviour(raw_body=b"<html>Bad Gateway</html>", label="garbage")


def hash_vectors(dim: int) -> Callable[[list[str]], list[list[float]]]:
    """Deterministic unit vectors from a hash of each text."""

    def fn(texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            row = [((digest[i % len(digest)] / 255.0) - 0.5) + 0.01 * i for i in range(dim)]
            norm = math.sqrt(sum(x * x for x in row)) or 1.0
            out.append([x / norm for x in row])
        return out

    return fn


def vectors(fn: Callable[[list[str]], list[list[float]]]) -> Behaviour:
    """An embeddings answer computed by ``fn`` (may be deliberately broken)."""
    return Behaviour(embed=fn, label="vectors")


# -- the server --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recorded:
    """One request as the server received it."""

    path: str
    headers: dict[str, str]
    body: Any
    behaviour: str

    @property
    def system_prompt(self) -> str:
        msgs = (self.body or {}).get("messages") or []
        return "\n".join(m.get("content", "") for m in msgs if m.get("role") == "system")

    @property
    def user_prompt(self) -> str:
        msgs = (self.body or {}).get("messages") or []
        return "\n".join(m.get("content", "") for m in msgs if m.get("role") == "user")


class ScriptedOpenAIServer:
    """An OpenAI-compatible server on loopback that plays scripted behaviours."""

    def __init__(self, *, embed_dim: int = 16, model: str = "test-model") -> None:
        self.embed_dim = embed_dim
        self.model = model
        self.requests: list[Recorded] = []
        self.unscripted = 0
        self.in_flight = 0
        self.max_in_flight = 0
        #: Called for a chat request when the queue is empty: ``body -> Behaviour``.
        self.responder: Callable[[dict[str, Any]], Behaviour] | None = None
        self._chat: deque[Behaviour] = deque()
        self._embed: deque[Behaviour] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> ScriptedOpenAIServer:
        handler = _make_handler(self)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="openai-fake", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL to give a client, ending in ``/v1``."""
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    # scripting
    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next chat requests, in order."""
        with self._lock:
            self._chat.extend(behaviours)

    def script_embeddings(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._embed.extend(behaviours)

    def reset(self) -> None:
        with self._lock:
            self._chat.clear()
            self._embed.clear()
            self.requests.clear()
            self.unscripted = 0
            self.max_in_flight = 0
            self.responder = None

    @property
    def pending(self) -> int:
        """Scripted chat behaviours not yet used."""
        with self._lock:
            return len(self._chat)

    @property
    def chat_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def embedding_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/embeddings")]

    def _next(self, path: str, body: Any) -> Behaviour:
        with self._lock:
            if path.endswith("/embeddings"):
                if self._embed:
                    return self._embed.popleft()
                return vectors(hash_vectors(self.embed_dim))
            if self._chat:
                return self._chat.popleft()
            responder = self.responder
        if responder is not None:
            return responder(body if isinstance(body, dict) else {})
        with self._lock:
            self.unscripted += 1
        return http_error(500, message="unscripted request")


def _make_handler(server: ScriptedOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._json(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = None
            path = self.path.split("?", 1)[0]
            if not (path.endswith("/chat/completions") or path.endswith("/embeddings")):
                self._json(404, {"error": {"message": f"no route {path}"}})
                return
            behaviour = server._next(path, body)
            with server._lock:
                server.requests.append(
                    Recorded(path, {k.lower(): v for k, v in self.headers.items()}, body, behaviour.label)
                )
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                if behaviour.delay and server._stopping.wait(behaviour.delay):
                    return
                self._respond(path, body if isinstance(body, dict) else {}, behaviour)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout) before we answered
            finally:
                with server._lock:
                    server.in_flight -= 1

        def _respond(self, path: str, body: dict[str, Any], b: Behaviour) -> None:
            if b.raw_body is not None:
                self._send(200, b.raw_body, "text/html", b.headers)
                return
            if b.status != 200:
                err = {"error": {"message": b.error_message, "type": "scripted", "code": b.status}}
                self._json(b.status, err, b.headers)
                return
            if path.endswith("/embeddings"):
                inputs = body.get("input")
                texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
                fn = b.embed or hash_vectors(server.embed_dim)
                rows = fn(texts)
                data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
                if b.reverse:
                    data.reverse()
                self._json(200, {"object": "list", "data": data, "model": body.get("model", server.model),
                                 "usage": {"prompt_tokens": 1, "total_tokens": 1}}, b.headers)
                return
            message: dict[str, Any] = {"role": "assistant", "content": b.content}
            if b.refusal is not None:
                message["refusal"] = b.refusal
            completion = {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", server.model),
                "choices": [{"index": 0, "message": message, "finish_reason": b.finish_reason}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            self._json(200, completion, b.headers)

        def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
            # allow_nan: tests send NaN on purpose to prove the embedder rejects it.
            self._send(status, json.dumps(obj, allow_nan=True).encode("utf-8"), "application/json", headers)

        def _send(self, status: int, data: bytes, ctype: str, headers: dict[str, str] | None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

    return Handler
