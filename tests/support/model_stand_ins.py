"""Scripted stand-ins for the model APIs agent CLIs talk to, on 127.0.0.1 (../shared/CLIENTS.md).

An agent CLI only calls a tool when its model asks it to. These servers answer the CLI's model requests from
a script, a function from the request body to the model's next turn (call a tool, or say something), and
record every request, so a test can read what the CLI relayed from a tool back to its model. A script that
raises (a failed assertion) makes the stand-in answer HTTP 400, and leaving the `with` block re-raises it.

`GeminiStandIn` speaks the Gemini API (`:generateContent`, `:streamGenerateContent` as SSE);
`AnthropicStandIn` speaks the Anthropic Messages API (`POST /v1/messages`, streamed or not).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

JSON = dict[str, Any]
StandIn = TypeVar("StandIn", bound="_StandIn")


@dataclass(frozen=True)
class ToolCall:
    """The model's turn: call the tool `name` (as the CLI declared it to the model) with `arguments`."""

    name: str
    arguments: JSON


@dataclass(frozen=True)
class Say:
    """The model's turn: answer with text and end the turn."""

    text: str


Turn = ToolCall | Say
Script = Callable[[JSON], Turn]


@dataclass(frozen=True)
class Request:
    path: str
    body: JSON = field(default_factory=lambda: {})


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that drops its connection (CLIs do on exit) is not a failure of the stand-in."""


class _StandIn:
    """An HTTP server on 127.0.0.1 that records JSON requests and answers them through `_answer`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Request] = []
        self.errors: list[Exception] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: JSON = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                with stand_in._lock:
                    stand_in.requests.append(Request(self.path, body))
                try:
                    status, content_type, payload = stand_in._answer(self.path, body)
                except Exception as error:  # a failed script: a final error to the CLI, the error to the test
                    stand_in.errors.append(error)
                    status, content_type, payload = 400, "application/json", _failure(error)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                payload = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_HEAD = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self: StandIn) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        if kind is None and self.errors:
            raise self.errors[0]

    def _next_id(self) -> int:
        return next(self._ids)

    def _answer(self, path: str, body: JSON) -> tuple[int, str, bytes]:
        raise NotImplementedError


def _failure(error: Exception) -> bytes:
    """An error body both APIs read as a request the model cannot serve (not retried)."""
    message = f"stand-in model script failed: {error!r}"
    return json.dumps(
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "code": 400, "status": "INVALID_ARGUMENT", "message": message},
        }  # fmt: skip
    ).encode()


def _sse(events: Iterator[tuple[str | None, JSON]]) -> bytes:
    chunks: list[str] = []
    for name, data in events:
        chunks.append((f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n")
    return "".join(chunks).encode()


def _fill(schema: JSON) -> Any:
    """A minimal value that matches a JSON schema (Gemini spells types in capitals): enums take their first."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "OBJECT")).upper()
    if kind == "OBJECT":
        properties: JSON = schema.get("properties") or {}
        return {name: _fill(sub) for name, sub in properties.items()}
    minimal: JSON = {"STRING": "stand-in", "INTEGER": 1, "NUMBER": 1, "BOOLEAN": False, "ARRAY": []}
    return minimal.get(kind)


class GeminiStandIn(_StandIn):
    """The Gemini API: `POST /v1beta/models/MODEL:generateContent` and `:streamGenerateContent?alt=sse`.

    Requests that declare no tools (the CLI's own side questions, e.g. who speaks next) get an answer for
    them that ends the turn; the script sees only requests that declare tools.
    """

    @staticmethod
    def declared_tools(body: JSON) -> list[str]:
        """The function names the request offers the model."""
        tools: list[JSON] = body.get("tools") or []
        names: list[str] = []
        for tool in tools:
            declarations: list[JSON] = tool.get("functionDeclarations") or []
            names += [str(declaration["name"]) for declaration in declarations]
        return names

    @staticmethod
    def parts(body: JSON) -> list[JSON]:
        """Every part of every content of the request, in order."""
        contents: list[JSON] = body.get("contents") or []
        parts: list[JSON] = []
        for content in contents:
            parts += content.get("parts") or []
        return parts

    def _answer(self, path: str, body: JSON) -> tuple[int, str, bytes]:
        if path.split("?")[0].endswith(":countTokens"):
            return 200, "application/json", json.dumps({"totalTokens": 1}).encode()
        if self.declared_tools(body):
            turn = self.script(body)
        else:  # a side question (routing, who speaks next): a minimal answer in the schema it asks for
            config: JSON = body.get("generationConfig") or {}
            turn = Say(json.dumps(_fill(config.get("responseJsonSchema") or config.get("responseSchema") or {})))
        if isinstance(turn, ToolCall):
            part: JSON = {"functionCall": {"name": turn.name, "args": turn.arguments}}
        else:
            part = {"text": turn.text}
        response: JSON = {
            "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
            "modelVersion": "stand-in",
        }
        if ":streamGenerateContent" in path:
            return 200, "text/event-stream", _sse(iter([(None, response)]))
        return 200, "application/json", json.dumps(response).encode()


class AnthropicStandIn(_StandIn):
    """The Anthropic Messages API: `POST /v1/messages`, as JSON or, with `"stream": true`, as SSE.

    Requests that offer no tools (the CLI's own side requests, e.g. a title for the conversation) get a
    short text; the script sees only requests that offer tools.
    """

    @staticmethod
    def declared_tools(body: JSON) -> list[str]:
        tools: list[JSON] = body.get("tools") or []
        return [str(tool["name"]) for tool in tools if "name" in tool]

    @staticmethod
    def tool_results(body: JSON) -> list[JSON]:
        """Every `tool_result` block of the request's messages, in order."""
        messages: list[JSON] = body.get("messages") or []
        blocks = [
            block for message in messages if isinstance(message.get("content"), list) for block in message["content"]
        ]
        return [block for block in blocks if block.get("type") == "tool_result"]

    @staticmethod
    def text_of(result: JSON) -> str:
        """A `tool_result` block's content as the model reads it: the string, or its text blocks joined."""
        content: str | list[JSON] = result.get("content") or ""
        if isinstance(content, str):
            return content
        return "".join(str(block.get("text", "")) for block in content if block.get("type") == "text")

    def _answer(self, path: str, body: JSON) -> tuple[int, str, bytes]:
        if path.split("?")[0].endswith("/count_tokens"):
            return 200, "application/json", json.dumps({"input_tokens": 1}).encode()
        turn = self.script(body) if self.declared_tools(body) else Say("ok")
        message_id = f"msg_stand_in_{self._next_id()}"
        if isinstance(turn, ToolCall):
            block: JSON = {"type": "tool_use", "id": f"toolu_stand_in_{self._next_id()}", "name": turn.name,
                           "input": turn.arguments}  # fmt: skip
            stop_reason = "tool_use"
        else:
            block = {"type": "text", "text": turn.text}
            stop_reason = "end_turn"
        usage: JSON = {"input_tokens": 1, "output_tokens": 1}
        message: JSON = {"id": message_id, "type": "message", "role": "assistant", "model": body.get("model"),
                         "content": [block], "stop_reason": stop_reason, "stop_sequence": None,
                         "usage": usage}  # fmt: skip
        if not body.get("stream"):
            return 200, "application/json", json.dumps(message).encode()
        if block["type"] == "tool_use":
            start: JSON = {**block, "input": {}}
            delta: JSON = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        events: list[tuple[str | None, JSON]] = [
            ("message_start", {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": 1},
                },
            ),  # fmt: skip
            ("message_stop", {"type": "message_stop"}),
        ]
        return 200, "text/event-stream", _sse(iter(events))
