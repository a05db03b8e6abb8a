"""The Starlette application of `reflex http` (routes, auth, body limit, SSE, disconnects)."""

import asyncio
import contextlib
import hmac
import os
import sys
import time
import traceback

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from . import api
from .api import HTTPError
from .engine import EngineUnavailable, QueueFull, ReflexError


class JSON(Response):
    media_type = "application/json"

    def render(self, content):
        return orjson.dumps(content)


WATCH_AFTER = 0.02  # s: how long a request waits for the engine before its disconnect watcher starts


def error_response(e: HTTPError):
    return JSON(e.body(), status_code=e.status, headers=e.headers)


async def _wait_disconnect(receive):
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


class EventStream(StreamingResponse):
    """Server-sent events. The client's disconnect is watched for the whole stream (whatever
    ASGI version the server speaks), and the body iterator is closed as soon as it comes,
    which cancels the engine's request."""

    media_type = "text/event-stream"

    def __init__(self, content, **kw):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}, **kw)

    async def __call__(self, scope, receive, send):
        stream = asyncio.ensure_future(self.stream_response(send))
        watch = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait({stream, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (stream, watch):
                t.cancel()
            await asyncio.gather(stream, watch, return_exceptions=True)
            await self.body_iterator.aclose()


def anthropic_error(e: HTTPError):
    from .anthropic import error_body

    return JSON(error_body(e), status_code=e.status, headers=e.headers)


def sse(obj):
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Front:
    def __init__(self, engine, *, api_key=None, max_body_bytes=8 << 20, chat_max_tokens=512,
                 retry_after=1):
        self.engine = engine
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.chat_max_tokens = chat_max_tokens
        self.retry_after = retry_after
        self._model_id = (object(), None)  # (the engine info it was read from, the id)

    # -- plumbing --------------------------------------------------------------------------

    def model_id(self):
        info = self.engine.info
        if info is not self._model_id[0]:  # per engine `load` (a restart reloads)
            path = (info or {}).get("path")
            name = os.path.basename(path) if path else None
            if name:
                name = name[:-5] if name.endswith(".gguf") else name
            self._model_id = (info, name)
        return self._model_id[1] or self.engine.model or "default"

    def check_auth(self, request):
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer":  # Anthropic's clients send the key as x-api-key
            token = request.headers.get("x-api-key", "")
        if not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def read_body(self, request):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise self._too_large()
        chunks, n = [], 0
        receive = request.receive  # the ASGI messages as they come (Request.stream()'s loop)
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                raise ClientDisconnect()
            chunk = msg.get("body", b"")
            if chunk:
                n += len(chunk)
                if n > self.max_body_bytes:
                    raise self._too_large()
                chunks.append(chunk)
            if not msg.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _too_large(self):
        return HTTPError(413, f"the request body exceeds {self.max_body_bytes} bytes (--max-body-bytes)",
                         code="request_too_large")

    def busy_error(self):
        return HTTPError(503, "the engine's queue is full; retry later", type="server_error",
                         code="queue_full", headers={"Retry-After": str(self.retry_after)})

    async def _first(self, request, op, params):
        """Start a request in the engine and wait for its first event (a token, or the
        result), watching for the client's disconnect meanwhile (which cancels it).
        Returns (first event, the rest as an async iterator); engine errors raise HTTPError."""
        # the model's sampling defaults fill in what the request left out, once the engine
        # (and so its model) is known: inside the request's turn
        events = self.engine.events(op, params, prepare=api.with_model_defaults
                                    if op in ("generate", "infill") else None)
        task = asyncio.current_task()
        gone = []
        watcher = []

        async def watch():  # on disconnect it cancels this task, inside the engine call
            await _wait_disconnect(request.receive)
            gone.append(True)
            task.cancel()

        # the watcher task starts only if the engine has not answered within WATCH_AFTER s
        # (most requests: no task at all); a client that left earlier is seen then
        timer = asyncio.get_running_loop().call_later(
            WATCH_AFTER, lambda: watcher.append(asyncio.ensure_future(watch())))
        try:
            ev = await events.__anext__()
        except ReflexError as e:
            await events.aclose()
            raise api.engine_error(e.kind, e.message, op) from None
        except BaseException:
            await events.aclose()
            raise
        finally:
            timer.cancel()
            if watcher:
                watcher[0].cancel()
        if gone:  # the result came as the client left: nobody to send it to
            await events.aclose()
            raise asyncio.CancelledError()
        return ev, events

    async def call(self, request, op, params):
        """A request run to its result (no streaming); HTTPError on failure."""
        ev, events = await self._first(request, op, params)
        await events.aclose()
        return ev

    # -- endpoints -------------------------------------------------------------------------

    async def health(self, request):
        h = self.engine.health()
        if self.engine.state == "dead" and not self.engine.busy and self.engine.waiting == 0:
            asyncio.ensure_future(self.engine.start())  # a probe counts as the next request
        return JSON(h, status_code=200 if h["status"] == "ok" else 503)

    async def models(self, request):
        self.check_auth(request)
        return JSON({"object": "list", "data": [self._model_obj()]})

    async def model(self, request):
        self.check_auth(request)
        mid = request.path_params["model"]
        if mid != self.model_id():
            raise HTTPError(404, f"no model {mid!r} (this front serves {self.model_id()!r})",
                            param="model", code="model_not_found")
        return JSON(self._model_obj())

    def _model_obj(self):
        info = self.engine.info or {}
        return {"id": self.model_id(), "object": "model", "created": 0, "owned_by": "reflex",
                "name": info.get("model"), "backend": info.get("backend"), "n_ctx": info.get("n_ctx"),
                # what a request that leaves these out gets (the GGUF's general.sampling.*;
                # without them the engine's greedy decoding)
                "sampling_defaults": info.get("sampling") or {}}

    async def completions(self, request):
        self.check_auth(request)
        req = api.decode(await self.read_body(request), api.CompletionRequest)
        op, params = api.completion_params(req)
        return await self._generate(request, op, params, req, chat=False)

    async def chat(self, request):
        self.check_auth(request)
        req = api.decode(await self.read_body(request), api.ChatRequest)
        op, params = api.chat_params(req, self.chat_max_tokens)
        return await self._generate(request, op, params, req, chat=True)

    async def _generate(self, request, op, params, req, *, chat):
        model = self.model_id()
        if not req.stream:
            result = await self.call(request, op, params)
            return JSON((api.chat_response if chat else api.completion_response)(result, model))
        params["stream"] = True
        ev, events = await self._first(request, op, params)
        rid = api.new_id("chatcmpl" if chat else "cmpl")
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if chat:
            gen = self._chat_stream(ev, events, rid, model, include_usage, tools=bool(params.get("tools")))
        else:
            gen = self._completion_stream(ev, events, rid, model, include_usage)
        return EventStream(gen)

    async def _engine_stream(self, first, events):
        """The engine's events (first, then the rest) for an SSE generator; an error after
        the headers went out becomes one `data: {"error": ...}` event."""
        try:
            yield first
            async for ev in events:
                yield ev
        except ReflexError as e:
            yield {"error": api.engine_error(e.kind, e.message, None).body()["error"]}
        except EngineUnavailable as e:
            yield {"error": HTTPError(503, f"the engine died: {e}", code="engine_died").body()["error"]}
        finally:
            await events.aclose()

    async def _completion_stream(self, first, events, rid, model, include_usage):
        offsets = {}  # choice index -> text offset (logprobs' text_offset)
        head = b'data: {"id":' + orjson.dumps(rid) + b',"object":"text_completion","created":' + \
            str(int(time.time())).encode() + b',"model":' + orjson.dumps(model) + b',"choices":'

        def chunk(choices, usage=None):
            tail = b',"usage":' + orjson.dumps(usage) if usage is not None else b""
            return head + orjson.dumps(choices) + tail + b"}\n\n"

        async with contextlib.aclosing(self._engine_stream(first, events)) as evs:
            async for ev in evs:
                if "error" in ev:
                    yield sse(ev)
                    break
                if ev.get("event") == "token":
                    i = ev.get("index", 0)
                    text = ev.get("text", "")
                    lp = None
                    if ev.get("logprobs") is not None:
                        lp = api.completion_logprobs(api._entries(ev["logprobs"]), offsets.get(i, 0))
                    offsets[i] = offsets.get(i, 0) + len(text)
                    if text or lp is not None:
                        yield chunk([{"index": i, "text": text, "logprobs": lp, "finish_reason": None}])
                    continue
                for i, r in enumerate(api._choices(ev)):
                    fr = api.FINISH.get(r.get("finish_reason"), r.get("finish_reason"))
                    yield chunk([{"index": i, "text": "", "logprobs": None, "finish_reason": fr}])
                if include_usage:
                    yield chunk([], api.usage(ev))
        yield b"data: [DONE]\n\n"

    async def _chat_stream(self, first, events, rid, model, include_usage, tools=False):
        """Chat completion chunks: per choice (`index`, n > 1 interleaved as the engine
        generates them) its role, reasoning_content / content deltas, tool_calls and finish."""
        from .textstream import Turn

        head = b'data: {"id":' + orjson.dumps(rid) + b',"object":"chat.completion.chunk","created":' + \
            str(int(time.time())).encode() + b',"model":' + orjson.dumps(model) + b',"choices":'

        def chunk(i, delta, finish=None, lp=None):
            return head + orjson.dumps([{"index": i, "delta": delta, "logprobs": lp,
                                         "finish_reason": finish}]) + b"}\n\n"

        turns = {}  # choice index -> its Turn (opened by the choice's first chunk)

        def turn_of(i):
            t = turns.get(i)
            if t is None:
                t = turns[i] = Turn(tools)
                opened.append(chunk(i, {"role": "assistant", "content": ""}))
            return t

        opened = []
        turn_of(0)
        yield opened.pop()
        async with contextlib.aclosing(self._engine_stream(first, events)) as evs:
            async for ev in evs:
                if "error" in ev:
                    yield sse(ev)
                    break
                if ev.get("event") == "token":
                    i = ev.get("index", 0)
                    pieces = turn_of(i).feed(ev)
                    if opened:
                        yield opened.pop()
                    if ev.get("logprobs") is not None:
                        lp = api.chat_logprobs(api._entries(ev["logprobs"]))
                        for kind, text in pieces:
                            if kind == "reasoning":
                                yield chunk(i, {"reasoning_content": text})
                        yield chunk(i, {"content": "".join(t for k, t in pieces if k == "content")}, lp=lp)
                    else:
                        for kind, text in pieces:
                            yield chunk(i, {"reasoning_content" if kind == "reasoning" else "content": text})
                    continue
                for i, r in enumerate(api._choices(ev)):
                    turn = turn_of(i)
                    if opened:
                        yield opened.pop()
                    finish = api.FINISH.get(r.get("finish_reason"), r.get("finish_reason"))
                    rest, _ = turn.finish(r)
                    for kind, text in rest:
                        yield chunk(i, {"reasoning_content" if kind == "reasoning" else "content": text})
                    calls = api.tool_calls(r)
                    if calls:
                        yield chunk(i, {"tool_calls": calls})
                        finish = "tool_calls"
                    yield chunk(i, {}, finish)
                if include_usage:
                    yield head + b"[]" + b',"usage":' + orjson.dumps(api.usage(ev)) + b"}\n\n"
        yield b"data: [DONE]\n\n"

    async def embeddings(self, request):
        self.check_auth(request)
        req = api.decode(await self.read_body(request), api.EmbeddingRequest)
        result = await self.call(request, "embed", {"input": req.input, "pooling": "mean", "normalize": True})
        return JSON(api.embedding_response(result, self.model_id(), req.encoding_format, req.dimensions))

    async def infill(self, request):
        self.check_auth(request)
        req = api.decode(await self.read_body(request), api.InfillRequest)
        op, params = api.infill_params(req)
        model = self.model_id()
        if not req.stream:
            return JSON(api.infill_response(await self.call(request, op, params), model))
        params["stream"] = True
        ev, events = await self._first(request, op, params)

        async def gen():
            async with contextlib.aclosing(self._engine_stream(ev, events)) as evs:
                async for e in evs:
                    if "error" in e:
                        yield sse(e)
                        return
                    if e.get("event") == "token":
                        if e.get("text"):
                            yield sse({"content": e["text"], "stop": False})
                    else:
                        yield sse(api.infill_response(e, model))

        return EventStream(gen())

    # -- decisions -----------------------------------------------------------------------

    async def classify(self, request):
        import reflex_ipc.front.classify as classify

        self.check_auth(request)
        req = api.decode(await self.read_body(request), classify.ClassifyRequest)
        result = await self.call(request, "classify", classify.params(req))
        return JSON(classify.response(result, self.model_id()))

    # -- Anthropic's Messages API --------------------------------------------------------

    async def messages(self, request):
        import reflex_ipc.front.anthropic as A

        self.check_auth(request)
        req = api.decode(await self.read_body(request), A.MessagesRequest)
        params = A.params(req)
        model = self.model_id()
        if not req.stream:
            return JSON(A.response(await self.call(request, "generate", params), model, req.stop_sequences))
        params["stream"] = True
        ev, events = await self._first(request, "generate", params)
        return EventStream(self._messages_stream(ev, events, model, bool(params.get("tools")), req.stop_sequences),
                           media_type="text/event-stream")

    async def _messages_stream(self, first, events, model, tools, stops):
        import reflex_ipc.front.anthropic as A
        from .textstream import Turn

        turn, st = Turn(tools), A.StreamState()
        kinds = {"reasoning": "thinking", "content": "text"}
        yield A.message_start(A.new_id("msg"), model)
        async with contextlib.aclosing(self._engine_stream(first, events)) as evs:
            async for ev in evs:
                if "error" in ev:
                    yield A.event("error", {"error": {"type": "api_error", "message": ev["error"]["message"]}})
                    return
                if ev.get("event") == "token":
                    for kind, text in turn.feed(ev):
                        for out in st.delta(kinds[kind], text):
                            yield out
                    continue
                rest, calls = turn.finish(ev)
                for kind, text in rest:
                    for out in st.delta(kinds[kind], text):
                        yield out
                if st.index < 0 and not calls:  # an empty reply still has its text block
                    for out in st.start("text"):
                        yield out
                for out in st.stop():
                    yield out
                for call in calls:
                    for out in st.tool_use(call):
                        yield out
                reason, seq = A.stop_reason(ev, stops)
                yield A.event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                                "usage": A.usage(ev)})
                yield A.event("message_stop", {})

    # -- OpenAI's Responses API ----------------------------------------------------------

    async def responses(self, request):
        import reflex_ipc.front.responses as R
        from .textstream import split_reasoning

        self.check_auth(request)
        req = api.decode(await self.read_body(request), R.ResponsesRequest)
        params = R.params(req, self.chat_max_tokens)
        model = self.model_id()
        if not req.stream:
            result = await self.call(request, "generate", params)
            return JSON(R.response(result, req, model, *split_reasoning(result)))
        params["stream"] = True
        ev, events = await self._first(request, "generate", params)
        return EventStream(self._responses_stream(ev, events, req, model, bool(params.get("tools"))))

    async def _responses_stream(self, first, events, req, model, tools):
        import reflex_ipc.front.responses as R
        from .textstream import Turn

        E, turn = R.Events(), Turn(tools)
        rid, created = R.new_id("resp"), int(time.time())
        output = []  # finished output items
        cur = {"kind": None, "item": None, "text": ""}

        def env(status, result=None):
            return R.envelope(rid, req, model, created, status, list(output), result)

        def close():
            kind, item, text = cur["kind"], cur["item"], cur["text"]
            if kind is None:
                return []
            idx = len(output)
            if kind == "content":
                part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                item = {**item, "status": "completed", "content": [part]}
                evs = [E("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0,
                         text=text, logprobs=[]),
                       E("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                         part=part)]
            else:
                part = {"type": "reasoning_text", "text": text}
                item = {**item, "status": "completed", "content": [part]}
                evs = [E("response.reasoning_text.done", item_id=item["id"], output_index=idx, content_index=0,
                         text=text),
                       E("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                         part=part)]
            evs.append(E("response.output_item.done", output_index=idx, item=item))
            output.append(item)
            cur.update(kind=None, item=None, text="")
            return evs

        def delta(kind, text):
            evs = []
            if cur["kind"] != kind:
                evs += close()
                idx = len(output)
                if kind == "content":
                    item = R.message_item("", status="in_progress")
                    item["content"] = []
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                else:
                    item = R.reasoning_item("")
                    item.update(status="in_progress", content=[])
                    part = {"type": "reasoning_text", "text": ""}
                cur.update(kind=kind, item=item, text="")
                evs += [E("response.output_item.added", output_index=idx, item=item),
                        E("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0,
                          part=part)]
            cur["text"] += text
            name = "response.output_text.delta" if kind == "content" else "response.reasoning_text.delta"
            extra = {"logprobs": []} if kind == "content" else {}
            evs.append(E(name, item_id=cur["item"]["id"], output_index=len(output), content_index=0, delta=text,
                         **extra))
            return evs

        yield E("response.created", response=env("in_progress"))
        yield E("response.in_progress", response=env("in_progress"))
        async with contextlib.aclosing(self._engine_stream(first, events)) as evs:
            async for ev in evs:
                if "error" in ev:
                    err = ev["error"]
                    yield E("error", code=err.get("code"), message=err.get("message"), param=err.get("param"))
                    return
                if ev.get("event") == "token":
                    for kind, text in turn.feed(ev):
                        for out in delta(kind, text):
                            yield out
                    continue
                rest, calls = turn.finish(ev)
                for kind, text in rest:
                    for out in delta(kind, text):
                        yield out
                if not output and cur["kind"] is None and not calls:
                    for out in delta("content", ""):
                        yield out
                for out in close():
                    yield out
                for call in calls:
                    item = R.call_item(call)
                    idx = len(output)
                    yield E("response.output_item.added", output_index=idx,
                            item={**item, "arguments": "", "status": "in_progress"})
                    yield E("response.function_call_arguments.delta", item_id=item["id"], output_index=idx,
                            delta=item["arguments"])
                    yield E("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                            arguments=item["arguments"], name=item["name"])
                    yield E("response.output_item.done", output_index=idx, item=item)
                    output.append(item)
                status = R.status_of(ev)
                final = env(status, ev)
                yield E("response.completed" if status == "completed" else "response.incomplete", response=final)


class _Coalescing:
    """A transport whose writes within one turn of the event loop go out as one write:
    uvicorn writes a response's status line and headers, then its body, each with its
    own send(); joined, a response costs one syscall and wakes the client once. Every
    other attribute is the transport's."""

    __slots__ = ("_t", "_loop", "_buf")

    def __init__(self, transport, loop):
        self._t, self._loop, self._buf = transport, loop, None

    def write(self, data):
        if self._buf is None:
            self._buf = [data]
            self._loop.call_soon(self._flush)
        else:
            self._buf.append(data)

    def _flush(self):
        buf, self._buf = self._buf, None
        if buf:
            self._t.write(buf[0] if len(buf) == 1 else b"".join(buf))

    def writelines(self, items):
        for data in items:
            self.write(data)

    def close(self):
        self._flush()
        self._t.close()

    def __getattr__(self, name):
        return getattr(self._t, name)


def http_protocol():
    """uvicorn's HTTP protocol (httptools, else h11) on a coalescing transport."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Protocol(AutoHTTPProtocol):
        def connection_made(self, transport):
            super().connection_made(_Coalescing(transport, asyncio.get_running_loop()))

    return Protocol


def uvicorn_config(app, *, host="127.0.0.1", port=8080, log_level="warning"):
    import uvicorn

    # no access log, so no X-Forwarded-For rewriting either (proxy_headers: a middleware
    # call per request)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          lifespan="on", timeout_graceful_shutdown=5, http=http_protocol(),
                          proxy_headers=False)


def _internal_error(exc):
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    return HTTPError(500, f"internal error in the HTTP front: {type(exc).__name__} "
                     "(the traceback is in its log)", code="internal_error")


def build_app(front: Front):
    """The ASGI application: Starlette's, with the endpoints' exact (method, path) pairs
    dispatched straight to their handlers (a dict lookup: no route matching, no middleware
    stack, per request); everything else (other methods and paths: 404/405, lifespan) goes
    through Starlette."""

    def guard(handler, shape=error_response):
        async def endpoint(request):
            try:
                return await handler(request)
            except HTTPError as e:
                return shape(e)
            except QueueFull:
                return shape(front.busy_error())
            except EngineUnavailable as e:
                return shape(HTTPError(503, f"the engine is unavailable: {e} (the next request "
                                       "starts or reconnects it)", code="engine_died",
                                       headers={"Retry-After": str(front.retry_after)}))
            except (asyncio.CancelledError, ClientDisconnect):
                return Response(status_code=499)  # the client went away: nobody reads this
            except Exception as e:  # noqa: BLE001  (a bug in the front: a 500 in the API's shape)
                return shape(_internal_error(e))

        return endpoint

    async def http_error(request, exc):
        return error_response(HTTPError(exc.status_code, exc.detail or "error",
                                        code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)))

    async def server_error(request, exc):
        return error_response(_internal_error(exc))

    endpoints = [
        ("/health", front.health, "GET", error_response),
        ("/v1/models", front.models, "GET", error_response),
        ("/v1/completions", front.completions, "POST", error_response),
        ("/v1/chat/completions", front.chat, "POST", error_response),
        ("/v1/embeddings", front.embeddings, "POST", error_response),
        ("/infill", front.infill, "POST", error_response),
        ("/v1/classify", front.classify, "POST", error_response),
        ("/v1/messages", front.messages, "POST", anthropic_error),
        ("/v1/responses", front.responses, "POST", error_response),
    ]
    routes = [Route(path, guard(handler, shape), methods=[method]) for path, handler, method, shape in endpoints]
    routes.insert(2, Route("/v1/models/{model:path}", guard(front.model), methods=["GET"]))
    direct = {(method, path): guard(handler, shape) for path, handler, method, shape in endpoints}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.ensure_future(front.engine.start())
        try:
            yield
        finally:
            task.cancel()
            await front.engine.close()

    starlette = Starlette(routes=routes, lifespan=lifespan,
                          exception_handlers={HTTPException: http_error, Exception: server_error})

    async def app(scope, receive, send):
        if scope["type"] == "http":
            endpoint = direct.get((scope["method"], scope["path"]))
            if endpoint is not None:
                response = await endpoint(Request(scope, receive))
                await response(scope, receive, send)
                return
        await starlette(scope, receive, send)

    app.starlette = starlette
    return app
