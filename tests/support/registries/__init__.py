"""Local package registries for the ecosystems these machines cannot reach (Go module proxy, CRAN, RubyGems,
Maven Central), each built in a temporary directory with one tiny package the tests create, and served over
HTTP on a loopback address, which the install sandbox reaches through the host network
(SANDBOX_INSTALL_NETWORK_MODE=host) or through the egress proxy.

Every package carries a per-session `token` in its version (or, for R, whose specs have no versions, in its
name), so each test session really installs instead of finding an earlier session's cache.

Building the packages uses the host's own tools where the format needs them (`R CMD build` and
`tools::write_PACKAGES`, `gem build` and `gem generate_index`, `javac`); scripts/provision.sh installs them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import threading
import zipfile
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serve(root: Path, address: str = "127.0.0.1", name: str | None = None) -> Generator[str]:
    """Serve `root` over HTTP on `address` (a loopback address) from a thread; yields the base URL (no trailing
    slash), naming the server `name` when given (a name that resolves to `address` on the host)."""
    server = ThreadingHTTPServer((address, 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="local-registry", daemon=True)
    thread.start()
    try:
        yield f"http://{name or address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"building the local test registries needs {name!r} on the host (scripts/provision.sh)")
    return path


def _run(argv: list[str], cwd: Path) -> None:
    completed = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed in {cwd}:\n{completed.stdout}\n{completed.stderr}")


@dataclass(frozen=True)
class Package:
    """A package in a local registry: the `libraries` spec that installs it and a program that uses it."""

    spec: str
    code: str
    expected: str


def pip_index(root: Path, token: str, files_url: str = "../../files") -> Package:
    """A PEP 503 simple index holding one pure-Python wheel, greet-egress; its link points at `files_url`
    (another server, to model a mirror whose downloads come from a second host)."""
    version = f"1.0.{token}"
    wheel = f"greet_egress-{version}-py3-none-any.whl"
    info = f"greet_egress-{version}.dist-info"
    files = {
        "greet_egress/__init__.py": 'def hello(name):\n    return "hello, " + name\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: greet-egress\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    (root / "files").mkdir(parents=True)
    with zipfile.ZipFile(root / "files" / wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    page = root / "simple" / "greet-egress"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<html><body><a href="{files_url}/{wheel}">{wheel}</a></body></html>\n')
    code = "from greet_egress import hello\nprint(hello('pythonista'))\n"
    return Package(f"greet-egress=={version}", code, "hello, pythonista\n")


def npm_registry(root: Path, token: str, url: str, postinstall: str | None = None) -> Package:
    """An npm registry (the packument as a directory index, so `GET url/greet-egress` finds it after the
    server's redirect) holding one CommonJS package whose tarball is served from `url`; `postinstall`: the
    package's install script, which npm runs in the installer."""
    name, version = "greet-egress", f"1.0.{token}"
    manifest: dict[str, object] = {"name": name, "version": version, "main": "index.js"}
    if postinstall is not None:
        manifest["scripts"] = {"postinstall": postinstall}
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as archive:
        for member, text in {
            "package/package.json": json.dumps(manifest),
            "package/index.js": 'exports.hello = (name) => "hello, " + name;\n',
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    data = tarball.getvalue()
    file = f"{name}-{version}.tgz"
    (root / name / "-").mkdir(parents=True)
    (root / name / "-" / file).write_bytes(data)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    dist = {"tarball": f"{url}/{name}/-/{file}", "shasum": hashlib.sha1(data).hexdigest(), "integrity": integrity}
    packument = {
        "name": name,
        "dist-tags": {"latest": version},
        "versions": {version: {**manifest, "hasInstallScript": postinstall is not None, "dist": dist}},
    }
    (root / name / "index.html").write_text(json.dumps(packument))
    code = "const { hello } = require('greet-egress');\nconsole.log(hello('node'));\n"
    return Package(f"{name}@{version}", code, "hello, node\n")


def go_proxy(root: Path, token: str) -> Package:
    """A GOPROXY directory (the module proxy protocol is plain files) holding example.com/greet."""
    module, version = "example.com/greet", f"v1.0.{token}"
    files = {
        "go.mod": f"module {module}\n\ngo 1.21\n",
        "greet.go": 'package greet\n\n// Hello greets.\nfunc Hello(name string) string { return "hello, " + name }\n',
    }
    base = root / module / "@v"
    base.mkdir(parents=True)
    (base / "list").write_text(f"{version}\n")
    (base / f"{version}.info").write_text(json.dumps({"Version": version, "Time": "2024-01-01T00:00:00Z"}))
    (base / f"{version}.mod").write_text(files["go.mod"])
    with zipfile.ZipFile(base / f"{version}.zip", "w") as archive:
        for name, text in files.items():
            archive.writestr(f"{module}@{version}/{name}", text)
    code = (
        'package main\n\nimport (\n\t"fmt"\n\n\t"example.com/greet"\n)\n\n'
        'func main() {\n\tfmt.Println(greet.Hello("gopher"))\n}\n'
    )
    return Package(f"{module}@{version}", code, "hello, gopher\n")


def cran_repo(root: Path, token: str) -> Package:
    """A CRAN-like repository (src/contrib with a PACKAGES index) holding one pure-R package."""
    name = f"greet{token}"
    source = root / "build" / name
    (source / "R").mkdir(parents=True)
    (source / "DESCRIPTION").write_text(
        f"Package: {name}\nVersion: 1.0.0\nTitle: Greets\nDescription: Greets people.\n"
        "Authors@R: person('Test', 'Author', email = 'author@example.org', role = c('aut', 'cre'))\n"
        "License: MIT\nEncoding: UTF-8\n"
    )
    (source / "NAMESPACE").write_text("export(hello)\n")
    (source / "R" / "hello.R").write_text('hello <- function(name) paste0("hello, ", name)\n')
    contrib = root / "src" / "contrib"
    contrib.mkdir(parents=True)
    _run([_tool("R"), "CMD", "build", "--no-build-vignettes", "--no-manual", str(source)], contrib)
    _run([_tool("Rscript"), "-e", 'tools::write_PACKAGES(".", type = "source")'], contrib)
    shutil.rmtree(root / "build")
    return Package(name, f'library({name})\ncat(hello("useR"), "\\n", sep = "")\n', "hello, useR\n")


def gem_source(root: Path, token: str) -> Package:
    """A gem source (gems/ plus the indexes `gem generate_index` writes) holding one gem."""
    version = f"1.0.{token}"
    build = root / "build"
    (build / "lib").mkdir(parents=True)
    (build / "lib" / "greet.rb").write_text('module Greet\n  def self.hello(name)\n    "hello, #{name}"\n  end\nend\n')
    (build / "greet.gemspec").write_text(
        "Gem::Specification.new do |s|\n"
        "  s.name = 'greet'\n"
        f"  s.version = '{version}'\n"
        "  s.summary = 'Greets'\n"
        "  s.authors = ['Test Author']\n"
        "  s.license = 'MIT'\n"
        "  s.files = ['lib/greet.rb']\n"
        "end\n"
    )
    _run([_tool("gem"), "build", "greet.gemspec"], build)
    (root / "gems").mkdir()
    shutil.move(build / f"greet-{version}.gem", root / "gems")
    shutil.rmtree(build)
    _run([_tool("gem"), "generate_index", "--directory", str(root)], root)
    return Package(f"greet:{version}", "require 'greet'\nputs Greet.hello('rubyist')\n", "hello, rubyist\n")


def maven_repo(root: Path, token: str) -> Package:
    """A Maven repository layout holding org.example:greet, which needs org.example:greet-core (through a
    property and a parent POM) at compile scope, and declares test, provided and optional dependencies the
    repository does not have (which the resolver must skip)."""
    version = f"1.0.{token}"
    build = root / "build"
    sources = {
        "core": ("org/example/core/Core.java", "package org.example.core;\n\npublic class Core {\n"
                 '    public static String prefix() { return "hello, "; }\n}\n'),
        "greet": ("org/example/greet/Greet.java", "package org.example.greet;\n\n"
                  "import org.example.core.Core;\n\npublic class Greet {\n"
                  "    public static String hello(String name) { return Core.prefix() + name; }\n}\n"),
    }  # fmt: skip
    files: list[str] = []
    for path, text in sources.values():
        file = build / "src" / path
        file.parent.mkdir(parents=True)
        file.write_text(text)
        files.append(str(file))
    classes = build / "classes"
    _run([_tool("javac"), "--release", "17", "-d", str(classes), *files], build)
    for artifact, package in (("greet-core", "org/example/core"), ("greet", "org/example/greet")):
        jar = io.BytesIO()
        with zipfile.ZipFile(jar, "w") as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for compiled in sorted((classes / package).glob("*.class")):
                archive.write(compiled, compiled.relative_to(classes).as_posix())
        _publish(root, artifact, version, jar.getvalue(), _pom(artifact, version))
    _publish(root, "greet-parent", version, None, _pom("greet-parent", version))
    shutil.rmtree(build)
    code = (
        "import org.example.greet.Greet;\n\npublic class UsesGreet {\n"
        '    public static void main(String[] args) {\n        System.out.println(Greet.hello("duke"));\n    }\n}\n'
    )
    return Package(f"org.example:greet:{version}", code, "hello, duke\n")


def _pom(artifact: str, version: str) -> str:
    head = '<?xml version="1.0" encoding="UTF-8"?>\n<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
    if artifact == "greet-parent":
        body = (
            f"<groupId>org.example</groupId><artifactId>greet-parent</artifactId><version>{version}</version>"
            "<packaging>pom</packaging>"
        )
    elif artifact == "greet-core":
        body = (
            "<parent><groupId>org.example</groupId><artifactId>greet-parent</artifactId>"
            f"<version>{version}</version></parent><artifactId>greet-core</artifactId>"
        )
    else:
        body = (
            f"<groupId>org.example</groupId><artifactId>greet</artifactId><version>{version}</version>"
            "<properties><core.version>${project.version}</core.version></properties><dependencies>"
            "<dependency><groupId>org.example</groupId><artifactId>greet-core</artifactId>"
            "<version>${core.version}</version></dependency>"
            "<dependency><groupId>org.example</groupId><artifactId>absent-test</artifactId><version>1</version>"
            "<scope>test</scope></dependency>"
            "<dependency><groupId>org.example</groupId><artifactId>absent-provided</artifactId>"
            "<version>1</version><scope>provided</scope></dependency>"
            "<dependency><groupId>org.example</groupId><artifactId>absent-optional</artifactId>"
            "<version>1</version><optional>true</optional></dependency></dependencies>"
        )
    return f"{head}<modelVersion>4.0.0</modelVersion>{body}</project>\n"


def _publish(root: Path, artifact: str, version: str, jar: bytes | None, pom: str) -> None:
    directory = root / "org" / "example" / artifact / version
    directory.mkdir(parents=True)
    (directory / f"{artifact}-{version}.pom").write_text(pom)
    if jar is not None:
        (directory / f"{artifact}-{version}.jar").write_bytes(jar)


__all__ = ["Package", "cran_repo", "gem_source", "go_proxy", "maven_repo", "npm_registry", "pip_index", "serve"]
