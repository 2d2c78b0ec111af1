"""A package index on 127.0.0.1 serving tiny stand-in wheels of the Python project image's libraries (same names
and pinned versions, each an importable module with `STAND_IN = True`), so the real recipe builds in seconds.

`gate`: while it is not set, the index's pages are held open (a space every second keeps pip's read timeout
from firing), so a test decides when the build can go on.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import threading
import zipfile
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llm_sandbox_mcp import images

# Distributions whose import name is not their own.
_MODULES = {"scikit-learn": "sklearn", "pillow": "PIL", "beautifulsoup4": "bs4"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel(name: str, version: str) -> tuple[str, bytes]:
    dist = re.sub(r"[-_.]+", "_", name)
    module = _MODULES.get(name.lower(), dist)
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"STAND_IN = True\n__version__ = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    record += f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, data in {**files, f"{info}/RECORD": record.encode()}.items():
            wheel.writestr(path, data)
    return f"{dist}-{version}-py3-none-any.whl", buffer.getvalue()


@dataclass
class StandInIndex:
    url: str
    gate: threading.Event
    # The paths requested so far.
    requests: list[str] = field(default_factory=lambda: [])


@contextmanager
def standin_index() -> Generator[StandInIndex]:
    wheels: dict[str, tuple[str, bytes]] = {}
    for spec in images.library_specs("python"):
        name, _, version = spec.partition("==")
        wheels[_normal(name)] = _wheel(name, version)
    gate = threading.Event()
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            page = re.fullmatch(r"/simple/([^/]+)/?", self.path)
            served = re.fullmatch(r"/files/([^/]+)", self.path)
            if page and _normal(page.group(1)) in wheels:
                file_name, data = wheels[_normal(page.group(1))]
                digest = hashlib.sha256(data).hexdigest()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                while not gate.wait(1.0):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                self.wfile.write(f'<html><body><a href="/files/{file_name}#sha256={digest}">{file_name}</a>'.encode())
                return
            found = [data for file_name, data in wheels.values() if served and file_name == served.group(1)]
            if not found:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(found[0])))
            self.end_headers()
            self.wfile.write(found[0])

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield StandInIndex(f"http://127.0.0.1:{server.server_address[1]}/simple", gate, requests)
    finally:
        gate.set()
        server.shutdown()
        server.server_close()
