"""The HTTP API (FastAPI) and the web tree explorer at ``/ui``.

``create_app(memory_or_path, tokens=...)`` returns an ASGI app; ``arbormem serve`` runs it
with uvicorn. Every ``/v1`` route is scoped to ``/v1/users/{user_id}`` (except ``/v1/me``)
and guarded by the bearer-token policy of ``auth.py``; ``/health``, ``/openapi.json``,
``/docs`` and the static explorer carry no user data and need no token (the explorer asks for
one and sends it with every call).

Errors always have the body ``{"error": {"code": ..., "message": ...}}``: library errors keep
their ``code`` / ``http_status`` from ``errors.py``; the HTTP layer adds ``unauthorized``
(401), ``forbidden`` (403), ``not_found`` (404), ``method_not_allowed`` (405),
``payload_too_large`` (413), ``invalid_input`` (422, with ``details``) and
``not_implemented`` (501).

Handlers are plain ``def``: FastAPI runs them in its thread pool, so the one shared
``Memory`` (thread-safe: per-thread SQLite connections, per-user write transactions) serves
concurrent requests without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
from contextlib import asynccontextmanager
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

try:
    from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
    from fastapi.security import HTTPBearer
    from pydantic import BaseModel, Field
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.staticfiles import StaticFiles
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the HTTP server needs FastAPI: pip install 'arbormem[server]'") from exc

from .. import __version__
from ..config import Limits
from ..errors import ArbormemError, ConfirmationRequired, ValidationError
from ..memory import Memory
from ..models import Exchange, ForgetReport, Hit, RecallTrace, Stats, Topic
from ..organize.models import Change
from ..validate import user_id as check_user
from . import views
from .auth import ANONYMOUS, ENV, Principal, TokenPolicy, bearer

DEFAULT_MAX_BODY = 16 * 1024 * 1024  # bytes; bulk imports are the large requests
MAX_IMPORT_ITEMS = 10_000


class ApiError(Exception):
    """An HTTP-layer error with a stable code (rendered like library errors)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status,
                        headers=headers)


# -- request bodies -----------------------------------------------------------------------------
class Message(BaseModel):
    model_config = {"extra": "allow"}
    role: str
    content: str | list[Any] | None = None
    # OpenAI's participant name; in a chat with several people the context shows it instead
    # of the role. Checked by the library (one line, at most 64 characters).
    name: Any = None


class AddBody(BaseModel):
    messages: list[Message] = Field(min_length=1)
    at: datetime | None = None
    metadata: dict[str, Any] | None = None
    session_id: str | None = None


class BeginBody(BaseModel):
    user_text: str
    at: datetime | None = None
    metadata: dict[str, Any] | None = None
    session_id: str | None = None


class CompleteBody(BaseModel):
    assistant_text: str
    at: datetime | None = None


class FailBody(BaseModel):
    reason: str


class ImportItem(AddBody):
    assistant_at: datetime | None = None


class ImportBody(BaseModel):
    exchanges: list[ImportItem] = Field(min_length=1, max_length=MAX_IMPORT_ITEMS)


class ReadFilter(BaseModel):
    """Filters of recall and search (issue 18): the library checks them (Memory.recall)."""

    session_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    metadata: dict[str, str | int | float | bool | None] | None = None
    # The relevance floor; 0 fills the budget (docs/recall.md, "Relevance floor").
    min_relevance: float | None = Field(None, ge=0)

    def kwargs(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "since": self.since, "until": self.until,
                "metadata": self.metadata, "min_relevance": self.min_relevance}


# Counts are strict integers: JSON's true is not 1 (pydantic's lax mode took it as one).
class RecallBody(ReadFilter):
    query: str
    max_tokens: int = Field(1024, ge=0, le=200_000, strict=True)
    recent: int | None = Field(None, ge=0, le=100, strict=True)


class SearchBody(ReadFilter):
    query: str
    limit: int = Field(10, ge=1, le=1000, strict=True)


class RecallModeBody(BaseModel):
    mode: Literal["active", "passive", "both"]


class DocumentBody(BaseModel):
    text: str
    source: str
    at: datetime | None = None
    metadata: dict[str, Any] | None = None


def _item(body: AddBody) -> dict[str, Any]:
    d = body.model_dump(exclude_none=True)
    d["messages"] = [m.model_dump(exclude_none=True) for m in body.messages]
    return d


# -- response bodies (the OpenAPI schema clients are generated from) -----------------------------
class Health(BaseModel):
    status: Literal["ok", "starting", "failed"]
    version: str
    ready: bool = Field(description="true once the embedding model is loaded: writes and "
                                    "recalls then answer without the model-load wait")
    detail: str | None = None


class Me(BaseModel):
    users: list[str] | Literal["*"]


class ExchangePage(BaseModel):
    exchanges: list[Exchange]
    next_after_seq: int | None = None


class SkippedImport(BaseModel):
    index: int
    exchange_id: str


class ImportResult(BaseModel):
    imported: int
    ids: list[str]
    skipped: list[SkippedImport] = Field(
        default_factory=list, description="items the memory already held (same messages, session and "
                                          "times): not stored again, with the stored exchange's id")


class DocumentResult(BaseModel):
    source: str
    doc_sha256: str
    chunks: int
    added: list[str]
    duplicates: list[str]
    removed: list[str] = Field(default_factory=list, description="chunks of the source's previous version that went")


class DocumentDeleted(BaseModel):
    source: str
    removed: list[str]


class RecallResult(BaseModel):
    text: str
    tokens: int
    exchanges: list[Exchange]
    topics: list[Topic]
    trace: RecallTrace


class SearchResult(BaseModel):
    hits: list[Hit]


class TopicList(BaseModel):
    topics: list[Topic]


class TopicRead(BaseModel):
    topic: Topic
    depth: int
    text: str
    recall_mode: str
    tags: list[str]
    links: list[str]
    detail: str | None = None
    detail_source: str | None = None
    exchanges: list[Exchange] | None = None


class ChangeList(BaseModel):
    changes: list[Change]


class Deleted(BaseModel):
    user_id: str
    deleted: int


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": desc} for status, desc in (
        (401, "missing or unknown bearer token (code unauthorized)"),
        (403, "the token may not access this user (code forbidden)"),
        (404, "no such exchange / topic / change for this user (code not_found)"),
        (413, "request body too large (code payload_too_large)"),
        (422, "invalid input (code invalid_input)"),
    )
}


# -- middleware ---------------------------------------------------------------------------------
#: Nesting a request adds around the library's own values: body > exchanges > item > messages >
#: message (then ``Limits.max_json_depth`` inside). Deeper bodies are refused while streaming.
REQUEST_NESTING = 8
_STRUCTURE = re.compile(rb'[\[\]{}"\\]')


class _Nesting:
    """Nesting depth of a JSON body, fed as it streams in (strings and escapes skipped), so a
    body of a million '[' is refused after its first few bytes instead of being parsed (the
    parser's recursion limit made it a 500, the validator's a RecursionError)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.depth = 0
        self.in_string = False
        self.skip_first = False  # the chunk before ended inside a string on a backslash

    def feed(self, data: bytes) -> bool:
        """False once the body is nested deeper than ``limit``."""
        skip_to = 1 if self.skip_first and data else 0
        self.skip_first = False
        for m in _STRUCTURE.finditer(data, skip_to):
            at = m.start()
            if at < skip_to:
                continue
            c = data[at]
            if self.in_string:
                if c == 0x5C:  # backslash: the next byte is escaped
                    skip_to = at + 2
                    self.skip_first = skip_to > len(data)
                elif c == 0x22:
                    self.in_string = False
            elif c == 0x22:
                self.in_string = True
            elif c in (0x5B, 0x7B):
                self.depth += 1
                if self.depth > self.limit:
                    return False
            elif c in (0x5D, 0x7D):
                self.depth -= 1
        return True


class _Guard:
    """Pure ASGI middleware: token -> user authorisation for /v1, then the body, read here as
    it streams in, against a byte limit for its route and a nesting limit. Past either the
    request is answered at once (413 ``payload_too_large`` / 422 ``invalid_input``) with
    ``Connection: close``, and the rest of the body is never read."""

    def __init__(self, app: Any, policy: TokenPolicy | None, max_body: int, max_small_body: int,
                 max_nesting: int) -> None:
        self.app, self.policy = app, policy
        self.max_body, self.max_small_body, self.max_nesting = max_body, max_small_body, max_nesting

    def _limit(self, scope: Any) -> int:
        """Bulk routes (import, documents) take ``max_body``; every other route one exchange's
        worth (``small_body_limit``)."""
        path: str = scope["path"]
        if scope["method"] == "POST" and path.endswith(("/exchanges/import", "/documents")):
            return self.max_body
        return min(self.max_body, self.max_small_body)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith("/v1/") or path == "/v1":
            principal = self._principal(scope)
            if principal is None:
                await self._send(scope, receive, send, _error(
                    401, "unauthorized", "missing or unknown bearer token"))
                return
            user = _path_user(scope)
            if user is not None:
                try:
                    check_user(user)
                except ValidationError as exc:
                    # The library's one rule, answered before routing: an id holding an
                    # encoded '/' would otherwise be routed as two segments (a 404).
                    await self._send(scope, receive, send, _error(422, exc.code, str(exc)))
                    return
                if not principal.may(user):
                    await self._send(scope, receive, send, _error(
                        403, "forbidden", "this token may not access that user"))
                    return
            scope.setdefault("state", {})["principal"] = principal
        limit = self._limit(scope)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._send(scope, receive, send, _too_large(limit))
            return
        # Read the body here, up to the limit: chunked uploads carry no Content-Length, and
        # an error raised while FastAPI reads the body would surface as a generic 400.
        body = bytearray()
        nesting = _Nesting(self.max_nesting)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            body += chunk
            if len(body) > limit:
                await self._send(scope, receive, send, _too_large(limit))
                return
            if not nesting.feed(chunk):
                await self._send(scope, receive, send, _error(
                    422, "invalid_input", f"request body nested more than {self.max_nesting} levels deep",
                    headers=_CLOSE))
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)

    def _principal(self, scope: Any) -> Principal | None:
        if self.policy is None:
            return ANONYMOUS
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"authorization")
        return self.policy.principal(bearer(raw.decode("latin-1")) if raw else None)

    @staticmethod
    async def _send(scope: Any, receive: Any, send: Any, response: Response) -> None:
        if response.status_code in (413, 422):
            await _linger(receive)
        await response(scope, receive, send)


def _path_user(scope: Any) -> str | None:
    """The user id of a ``/v1/users/{user_id}/...`` request, from the raw (still
    percent-encoded) path, so an encoded '/' stays inside the id instead of splitting it."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else scope["path"]
    parts = path.split("?", 1)[0].split("/")
    if len(parts) >= 4 and parts[1] == "v1" and parts[2] == "users":
        return unquote(parts[3], errors="surrogateescape")  # bad UTF-8 fails the rule
    return None


# Before refusing a body, read (and drop) a little more of it, as web servers' "lingering
# close" does: the server closes the connection after the answer, a socket closed with unread
# data is reset, and the reset can destroy the answer before the client has read it (seen as
# "connection reset by peer" for a body just over the limit). Bounded in bytes and time, so a
# huge upload is still cut off after at most _LINGER_BYTES more.
_LINGER_BYTES = 1 << 20
_LINGER_SECONDS = 1.0


async def _linger(receive: Any) -> None:
    drained = 0
    loop = asyncio.get_running_loop()
    until = loop.time() + _LINGER_SECONDS
    try:
        while drained < _LINGER_BYTES:
            left = until - loop.time()
            if left <= 0:
                return
            message = await asyncio.wait_for(receive(), left)
            if message.get("type") != "http.request":
                return
            drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                return
    except (TimeoutError, asyncio.TimeoutError, OSError, RuntimeError):
        return


# A refused body is not read to its end: the connection cannot carry another request, so it is
# closed after the answer (the server went on reading gigabytes of a body it had refused).
_CLOSE = {"connection": "close"}


def _too_large(limit: int) -> JSONResponse:
    return _error(413, "payload_too_large", f"request body over {limit} bytes", headers=_CLOSE)


class _WarmUp:
    """Loads the memory's embedder in a background thread when the app starts, so the first
    write or recall does not wait for the model (13-18 s on a busy 2-core machine before),
    and tells /health when it is done."""

    def __init__(self, mem: Memory) -> None:
        import threading

        self.mem = mem
        self.ready = threading.Event()
        self.error: str | None = None
        self.seconds: float | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import threading

        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="arbormem-warm-up", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.seconds = self.mem.warm_up()
        except Exception as exc:  # a broken model: /health says so, and each use raises it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()

    def health(self) -> dict[str, Any]:
        if not self.ready.is_set():
            return {"status": "starting", "version": __version__, "ready": False,
                    "detail": "loading the embedding model"}
        if self.error is not None:
            return {"status": "failed", "version": __version__, "ready": False,
                    "detail": f"the embedder failed to load: {self.error}"}
        return {"status": "ok", "version": __version__, "ready": True}


def _mount_docs(app: FastAPI) -> None:
    """Swagger UI at /docs from the files the fastapi-offline package ships (no CDN: the page
    works offline), with the Authorize button of the bearer scheme. Only its static files are
    used; the app stays a plain FastAPI."""
    try:
        from importlib.resources import files

        assets: Any = files("fastapi_offline") / "static"
    except ImportError:  # pragma: no cover - the server extra installs it
        assets = None

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        if assets is None:
            return HTMLResponse("<p>Interactive docs need fastapi-offline: pip install 'arbormem[server]'. "
                                "The schema is at <a href='/openapi.json'>/openapi.json</a>.</p>")
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="arbormem API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon.png",
            # no validator badge: it would fetch validator.swagger.io
            swagger_ui_parameters={"persistAuthorization": False, "validatorUrl": None},
        )

    if assets is not None:
        app.mount("/docs/assets", StaticFiles(directory=str(assets)), name="docs-assets")


def small_body_limit(limits: Limits) -> int:
    """The body limit of every route but bulk import and documents: twice what one exchange
    and its metadata may store (room for JSON escapes such as \\u00e9), plus 64 KiB."""
    return 2 * (limits.max_exchange_bytes + limits.max_metadata_bytes) + 64 * 1024


# -- the app ------------------------------------------------------------------------------------
# Long: FastAPI routes are closures over the app's Memory; one route per few lines.
def create_app(
    memory_or_path: Memory | str | Path,
    *,
    tokens: TokenPolicy | str | dict[str, Any] | None = None,
    allow_anonymous: bool = False,
    embedder: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    cors_origins: list[str] | None = None,
) -> FastAPI:
    """The HTTP API over a ``Memory`` (or a SQLite path, opened and closed with the app).

    ``tokens``: a ``TokenPolicy``, its ``"tok:u1,u2;tok2:*"`` spec, or a ``{token: users}``
    dict; ``None`` reads ``ARBORMEM_API_TOKENS``. With no policy at all the app refuses to
    start unless ``allow_anonymous=True`` (then every route is open: local development only).
    ``cors_origins`` lets browser apps on those origins call the API (preflight requests are
    answered before the token check; the actual requests still need a token).
    """
    if isinstance(tokens, TokenPolicy):
        policy: TokenPolicy | None = tokens
    elif isinstance(tokens, str):
        policy = TokenPolicy.parse(tokens)
    elif isinstance(tokens, dict):
        policy = TokenPolicy(tokens)
    else:
        policy = TokenPolicy.from_env()
    if policy is None and not allow_anonymous:
        from ..errors import ConfigError

        raise ConfigError(f"no API tokens: set {ENV}='token:user1,user2;...' "
                          "(or allow_anonymous=True / --no-auth for local development)")
    owns = not isinstance(memory_or_path, Memory)
    mem: Memory = memory_or_path if isinstance(memory_or_path, Memory) else Memory(memory_or_path, embedder=embedder)

    warm = _WarmUp(mem)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        warm.start()  # the model loads while the server already answers /health
        yield
        if owns:
            mem.close()

    app = FastAPI(title="arbormem", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Long-term memory for LLM apps, organised as a tree of topics. Every "
                              "`/v1` route needs `Authorization: Bearer <token>` (use Authorize).")
    app.state.memory = mem
    app.state.warm = warm

    @app.exception_handler(ArbormemError)
    async def _lib_error(_: Request, exc: ArbormemError) -> JSONResponse:
        return _error(exc.http_status, exc.code, str(exc))

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = json.loads(json.dumps(exc.errors(), default=str))
        for d in details:
            d.pop("input", None)  # never echo (possibly large or private) input back
            d.pop("ctx", None)
        first = details[0] if details else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(422, "invalid_input", f"{where}: {first.get('msg', 'invalid request')}",
                      details=details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_input", 404: "not_found", 405: "method_not_allowed",
                413: "payload_too_large"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        # Not an input error (those are all ArbormemErrors): a bug. Same shape, no details
        # (they could quote stored data); the server log has the traceback.
        return _error(500, "internal_error", f"internal error ({type(exc).__name__})")

    @app.get("/health", tags=["service"], response_model=Health, response_model_exclude_none=True,
             summary="Liveness, version and readiness (no token needed)")
    def health() -> dict[str, Any]:
        return warm.health()

    # The token check itself is the _Guard middleware (before routing and body parsing);
    # this declares it in the OpenAPI schema, so /docs has an Authorize button.
    bearer_scheme = HTTPBearer(auto_error=False, scheme_name="bearerAuth", bearerFormat="token",
                               description="A token of ARBORMEM_API_TOKENS, bound to the user ids it may access.")
    secured = [Depends(bearer_scheme)]

    @app.get("/v1/me", tags=["service"], response_model=Me, responses=_ERRORS, dependencies=secured,
             summary="The users this token may access")
    def me(request: Request) -> dict[str, Any]:
        principal: Principal = request.scope["state"]["principal"]
        return principal.to_dict()

    r = APIRouter(prefix="/v1/users/{user_id}", responses=_ERRORS, dependencies=secured)

    # -- exchanges --
    @r.post("/exchanges", status_code=201, tags=["exchanges"], response_model=Exchange,
            summary="Store a whole exchange")
    def add_exchange(user_id: str, body: AddBody) -> dict[str, Any]:
        item = _item(body)
        return mem.add(item["messages"], user_id=user_id, session_id=item.get("session_id"),
                       at=item.get("at"), metadata=item.get("metadata")).to_dict()

    @r.post("/exchanges/begin", status_code=201, tags=["exchanges"], response_model=Exchange,
            summary="Record a user message as a pending exchange")
    def begin(user_id: str, body: BeginBody) -> dict[str, Any]:
        return mem.begin(body.user_text, user_id=user_id, session_id=body.session_id, at=body.at,
                         metadata=body.metadata).to_dict()

    @r.post("/exchanges/import", status_code=201, tags=["exchanges"], response_model=ImportResult,
            summary=f"Bulk import (at most {MAX_IMPORT_ITEMS} exchanges; all or nothing; skips exchanges already stored)")
    def bulk_import(user_id: str, body: ImportBody, idempotency_key: str | None = Header(
            None, max_length=256, description="Client key: a repeated request with the same key "
            "stores nothing and answers with the exchanges the first one stored")) -> dict[str, Any]:
        rep = mem.import_exchanges([_item(x) for x in body.exchanges], user_id=user_id, request_id=idempotency_key)
        return {"imported": len(rep.added), "ids": [e.id for e in rep.added],
                "skipped": [x.to_dict() for x in rep.skipped]}

    @r.post("/exchanges/{exchange_id}/complete", tags=["exchanges"], response_model=Exchange,
            summary="Attach the reply")
    def complete(user_id: str, exchange_id: str, body: CompleteBody) -> dict[str, Any]:
        return mem.complete(exchange_id, body.assistant_text, at=body.at, user_id=user_id).to_dict()

    @r.post("/exchanges/{exchange_id}/fail", tags=["exchanges"], response_model=Exchange,
            summary="Mark a pending exchange failed")
    def fail(user_id: str, exchange_id: str, body: FailBody) -> dict[str, Any]:
        return mem.fail(exchange_id, body.reason, user_id=user_id).to_dict()

    @r.get("/exchanges", tags=["exchanges"], response_model=ExchangePage,
           summary="List exchanges in sequence order")
    def list_exchanges(
        user_id: str, status: Literal["pending", "completed", "failed"] | None = None,
        after_seq: int | None = None, limit: int = Query(100, ge=1, le=1000),
    ) -> dict[str, Any]:
        items = mem.exchanges(user_id=user_id, status=status, after_seq=after_seq, limit=limit)
        nxt = items[-1].seq if len(items) == limit else None
        return {"exchanges": [e.to_dict() for e in items], "next_after_seq": nxt}

    @r.get("/exchanges/{exchange_id}", tags=["exchanges"], response_model=Exchange, summary="One exchange")
    def get_exchange(user_id: str, exchange_id: str) -> dict[str, Any]:
        return mem.get(exchange_id, user_id=user_id).to_dict()

    @r.delete("/exchanges/{exchange_id}", status_code=204, tags=["exchanges"], response_class=Response,
              summary="Delete an exchange from the transcript, its topic and every index")
    def delete_exchange(user_id: str, exchange_id: str) -> Response:
        mem.delete(exchange_id, user_id=user_id)
        return Response(status_code=204)

    @r.post("/documents", status_code=201, tags=["documents"], response_model=DocumentResult,
            summary="Add a document under its source name; replaces that source's previous version")
    def add_document(user_id: str, body: DocumentBody) -> dict[str, Any]:
        rep = mem.add_document(body.text, source=body.source, user_id=user_id, at=body.at,
                               metadata=body.metadata)
        return {"source": rep.source, "doc_sha256": rep.doc_sha256, "chunks": rep.chunks,
                "added": [e.id for e in rep.added], "duplicates": list(rep.duplicates),
                "removed": list(rep.removed)}

    @r.delete("/documents", tags=["documents"], response_model=DocumentDeleted,
              summary="Delete a document by its source name: every chunk of it, from every index")
    def delete_document(user_id: str, source: str = Query(..., min_length=1, max_length=1000)) -> dict[str, Any]:
        removed = mem.delete_document(source, user_id=user_id)
        return {"source": source, "removed": list(removed)}

    # -- reading --
    @r.post("/recall", tags=["read"], response_model=RecallResult,
            summary="The memory context to inject for a message")
    def recall(user_id: str, body: RecallBody) -> dict[str, Any]:
        res = mem.recall(body.query, user_id=user_id, max_tokens=body.max_tokens, recent=body.recent,
                         **body.kwargs())
        return views.recall_dict(res)

    @r.post("/search", tags=["read"], response_model=SearchResult, summary="Ranked exchanges for a query")
    def search(user_id: str, body: SearchBody) -> dict[str, Any]:
        return {"hits": [h.to_dict() for h in mem.search(body.query, user_id=user_id, limit=body.limit,
                                                         **body.kwargs())]}

    @r.get("/tree", tags=["topics"], response_model=Topic,
           summary="The topic tree (root with nested children)")
    def tree(user_id: str) -> dict[str, Any]:
        return mem.tree(user_id=user_id).to_dict()

    @r.get("/topics", tags=["topics"], response_model=TopicList,
           summary="Every theme and topic, flat, with paths")
    def topics(user_id: str) -> dict[str, Any]:
        return {"topics": [views.topic_dict(t) for t in mem.topics(user_id=user_id)]}

    @r.get("/topics/{topic_id}", tags=["topics"], response_model=TopicRead, response_model_exclude_none=True,
           summary="A topic at a depth: 0 summary, 1 detailed summary, 2 verbatim exchanges")
    def topic(user_id: str, topic_id: str, depth: int = Query(0, ge=0, le=2),
              tier: int | None = Query(None, ge=0, le=2, deprecated=True,
                                       description="The old name of depth (same values), kept so "
                                                   "clients written before the rename keep working.")
              ) -> dict[str, Any]:
        return views.read_topic(mem, user_id, topic_id, tier if tier is not None and depth == 0 else depth)

    @r.get("/topics/{topic_id}/exchanges", tags=["topics"], response_model=ExchangePage,
           summary="A topic's exchanges")
    def topic_exchanges(user_id: str, topic_id: str,
                        limit: int = Query(200, ge=1, le=1000)) -> dict[str, Any]:
        items = views.topic_exchanges(mem, user_id, topic_id, limit=limit)
        return {"exchanges": [e.to_dict() for e in items]}

    # -- forgetting a topic or theme: previewed, and a theme only with confirm=true --
    @r.get("/topics/{topic_id}/forget", tags=["topics"], response_model=ForgetReport,
           summary="Preview forgetting a topic or theme: exactly which exchanges and topics would go")
    def forget_topic_preview(user_id: str, topic_id: str) -> dict[str, Any]:
        return mem.forget_topic(topic_id, user_id=user_id, dry_run=True).to_dict()

    @r.delete("/topics/{topic_id}", tags=["topics"], response_model=ForgetReport,
              responses={409: {"model": ErrorResponse, "description": (
                  "a theme of several topics without confirm=true (code confirmation_required, "
                  "with the preview), or expect_exchanges no longer matches (code invalid_state)")}},
              summary="Forget a topic or theme: delete every exchange filed under it, report which")
    def forget_topic(
        user_id: str, topic_id: str,
        confirm: bool = Query(False, description="required (true) to forget a theme of several topics"),
        expect_exchanges: int | None = Query(None, ge=0, description="the count the preview showed"),
    ) -> Any:
        try:
            report = mem.forget_topic(topic_id, user_id=user_id, confirm=confirm,
                                      expect_exchanges=expect_exchanges)
        except ConfirmationRequired as exc:
            return _error(exc.http_status, exc.code, f"{exc} (DELETE again with ?confirm=true)",
                          preview=exc.report.to_dict())
        return report.to_dict()

    @r.get("/stats", tags=["read"], response_model=Stats, summary="Counts of exchanges, topics and tokens")
    def stats(user_id: str) -> dict[str, Any]:
        return mem.stats(user_id=user_id).to_dict()

    # -- maintenance --
    @r.post("/consolidate", tags=["maintenance"], summary="Merge, dedupe and tidy the user's tree")
    def consolidate(user_id: str) -> Any:
        fn = getattr(mem, "consolidate", None)
        if fn is None:
            raise ApiError(501, "not_implemented", "this arbormem build has no consolidation")
        res = fn(user_id=user_id)
        return res.to_dict() if hasattr(res, "to_dict") else res

    @r.put("/topics/{topic_id}/recall_mode", tags=["topics"], response_model=Topic,
           summary="active (recalled when relevant), passive or both (always in the context)")
    def recall_mode(user_id: str, topic_id: str, body: RecallModeBody) -> dict[str, Any]:
        return views.topic_dict(mem.set_recall_mode(topic_id, body.mode, user_id=user_id))

    @r.get("/history/{item_id}", tags=["maintenance"], response_model=ChangeList,
           summary="Logged changes concerning a topic or exchange, newest first")
    def history(user_id: str, item_id: str, limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        changes = mem.history(item_id, user_id=user_id, limit=limit)
        if not changes:
            views.known_item(mem, user_id, item_id)  # 404 for an id this user never had
        return {"changes": [c.to_dict() for c in changes]}

    @r.post("/changes/{change_id}/undo", tags=["maintenance"], response_model=Change,
            summary="Reverse a logged merge, archive, dedup, supersession or link")
    def undo(user_id: str, change_id: str) -> dict[str, Any]:
        return mem.undo(change_id, user_id=user_id).to_dict()

    @r.delete("", tags=["maintenance"], response_model=Deleted, summary="Delete every exchange, topic and index entry of a user")
    def delete_user(user_id: str) -> dict[str, Any]:
        return {"user_id": user_id, "deleted": mem.delete_user(user_id)}

    app.include_router(r)

    static = resources.files("arbormem").joinpath("server/static")
    app.mount("/ui", StaticFiles(directory=str(static), html=True), name="ui")
    _mount_docs(app)

    @app.get("/", include_in_schema=False)
    def index() -> RedirectResponse:
        return RedirectResponse("/ui/")

    # Outermost user middleware: size limit and auth run before routing and body parsing.
    limits = mem.settings.limits
    app.add_middleware(_Guard, policy=policy, max_body=max_body_bytes, max_small_body=small_body_limit(limits),
                       max_nesting=limits.max_json_depth + REQUEST_NESTING)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        # Added last = outermost: a preflight carries no Authorization header.
        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_credentials=False,
                           allow_methods=["GET", "POST", "PUT", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"])
    return app


__all__ = ["create_app", "ApiError"]
