"""Command line: `llm-sandbox-mcp` serves MCP over stdio (`serve --http HOST:PORT`: over HTTP); `doctor` checks
the engines; `run` runs a file once;
`install` / `uninstall` put the server into an MCP client's configuration or take it out."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, get_args

import anyio

from llm_sandbox_mcp import __version__
from llm_sandbox_mcp.config import BackendChoice, Settings, load_settings
from llm_sandbox_mcp.errors import ConfigError, SandboxError

# The other commands' modules are imported where they are used: serving, the default, answers tools/list
# sooner without them (the installer's TOML library, the executor, the engines).

logger = logging.getLogger("llm_sandbox_mcp")
# The server's stderr lines (benchmarks/stages.py reads SANDBOX_TRACE_STAGES's accounts from them).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _parser() -> argparse.ArgumentParser:
    from llm_sandbox_mcp.commands import cache as cache_commands
    from llm_sandbox_mcp.commands import images as image_commands
    from llm_sandbox_mcp.languages import LANGUAGES

    parser = argparse.ArgumentParser(
        prog="llm-sandbox-mcp",
        description="MCP server that runs code in hardened sandboxes. Configured through environment variables.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="serve MCP over stdio (the default), or over HTTP with --http")
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio; needs SANDBOX_HTTP_TOKENS_FILE "
        "or the SANDBOX_HTTP_OAUTH_* settings (see docs/http.md)",
    )
    serve.add_argument(
        "--allow-unauthenticated-loopback",
        action="store_true",
        help="with --http on a loopback address and neither tokens file nor OAuth: serve without authentication, "
        "every process and user of this machine as one principal",
    )
    commands.add_parser("doctor", help="check which backends are usable here")
    commands.add_parser(
        "seccomp-profile", help="print the sandboxes' seccomp profile (Docker/OCI JSON), to install on a host or node"
    )
    run = commands.add_parser("run", help="run a program once in a sandbox and print its output")
    run.add_argument("file", help="source file, or - for standard input")
    run.add_argument("--language", "-l", default="python", choices=sorted(LANGUAGES))
    run.add_argument("--library", action="append", default=[], dest="libraries", help="install first (repeatable)")
    run.add_argument("--timeout", type=float, default=None)
    run.add_argument("--json", action="store_true", help="print the whole result as JSON")
    _client_parsers(commands.add_parser)
    cache_commands.add_parser(commands.add_parser)
    image_commands.add_parser(commands.add_parser)
    return parser


def _client_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    from llm_sandbox_mcp.commands import install

    clients = sorted(install.CLIENTS)
    scopes = ", ".join(f"{name}: {'|'.join(client.scopes)}" for name, client in sorted(install.CLIENTS.items()))
    for command, what in (("install", "add this server to"), ("uninstall", "remove this server from")):
        sub = add_parser(
            command,
            help=f"{what} an MCP client's configuration",
            description=f"{what.capitalize()} an MCP client's own configuration file. Scopes (first is the "
            f"default): {scopes}.",
        )
        sub.add_argument("--client", required=True, choices=clients)
        sub.add_argument("--scope", choices=get_args(install.Scope), help="where the entry goes (see above)")
        sub.add_argument("--name", default=install.SERVER_NAME, help="server name in the client (default: %(default)s)")
        sub.add_argument("--project", help="project directory for project and local scopes (default: current)")
        sub.add_argument("--dry-run", action="store_true", help="print the entry and its file; change nothing")
        if command == "uninstall":
            continue
        sub.add_argument(
            "--env", action="append", default=[], metavar="K=V", help="set a variable for the server (K= leaves K out)"
        )
        sub.add_argument("--backend", choices=get_args(BackendChoice), help="set BACKEND for the server")
        sub.add_argument("--force", action="store_true", help="replace a different entry of the same name")
        sub.add_argument(
            "--command",
            dest="command_path",
            metavar="PATH",
            help="run this installed console script instead of `uvx llm-sandbox-mcp`",
        )


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    args = argparse.Namespace(command="serve") if arguments in ([], ["serve"]) else _parser().parse_args(arguments)
    if args.command in ("install", "uninstall"):
        from llm_sandbox_mcp.commands import install

        return install.main(args)
    try:
        settings = load_settings()
    except ConfigError as exc:
        for line in exc.problems:
            sys.stderr.write(f"llm-sandbox-mcp: invalid configuration: {line}\n")
        return 2
    logging.basicConfig(stream=sys.stderr, level=settings.sandbox_log_level, format=LOG_FORMAT)
    if args.command == "doctor":
        return anyio.run(_doctor, settings)
    if args.command == "seccomp-profile":
        from llm_sandbox_mcp.seccomp import oci

        sys.stdout.write(json.dumps(oci.oci_profile(), indent=2) + "\n")
        return 0
    if args.command == "run":
        return anyio.run(_run, settings, args)
    if args.command == "cache":
        from llm_sandbox_mcp.commands import cache as cache_commands

        return anyio.run(cache_commands.run, settings, args)
    if args.command == "images":
        from llm_sandbox_mcp.commands import images as image_commands

        return anyio.run(image_commands.run, settings, args)
    if getattr(args, "http", None):
        return _serve_http(settings, args.http, args.allow_unauthenticated_loopback)
    anyio.run(_serve, settings)
    _exit_at_once(0)


def _serve_http(settings: Settings, listen_text: str, unauthenticated_loopback: bool) -> int:
    from llm_sandbox_mcp.server.http import check_authentication, parse_listen, serve_http

    try:
        listen = parse_listen(listen_text)
        authentication = check_authentication(settings, listen, unauthenticated_loopback)
        anyio.run(serve_http, settings, listen, authentication)
    except ConfigError as exc:
        for line in exc.problems:
            sys.stderr.write(f"llm-sandbox-mcp: {line}\n")
        return 2
    _exit_at_once(0)


async def _serve(settings: Settings) -> None:
    """Serve stdio until the client goes away (the lifespan cleans up) or SIGTERM/SIGHUP arrives (not on Windows).

    The stdio transport reads stdin in a worker thread that no cancellation can stop, so on a signal the
    sandboxes are removed here and the process exits at once.
    """
    from llm_sandbox_mcp.server.app import build_server
    from llm_sandbox_mcp.server.state import AppState

    state = AppState(settings)
    server = build_server(settings, state=state)
    if sys.platform == "win32":
        # No signal handlers in Windows' event loop: a client ends the server by closing stdin (the lifespan
        # cleans up) or by terminating the process, which no handler could see anyway.
        await server.run_stdio_async()
        return
    async with anyio.create_task_group() as tasks:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
                async for received in signals:
                    logger.info("Received %s; removing sandboxes and stopping", signal.Signals(received).name)
                    await state.close_now()
                    _exit_at_once(128 + received)

        tasks.start_soon(stop_on_signal)
        await server.run_stdio_async()
        tasks.cancel_scope.cancel()


def _exit_at_once(status: int) -> NoReturn:
    """End the process without the interpreter's teardown, once serving has cleaned up everything it made.

    Unloading the MCP SDK's few hundred modules and collecting their objects takes longer (150-250 ms on 2
    cores) than all of the server's own shutdown, and nothing of ours is left for it to do: the lifespan has
    removed every sandbox, closed the engine and joined the work it started.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


async def _doctor(settings: Settings) -> int:
    from llm_sandbox_mcp.backends import BACKENDS, load_backend, select_backend
    from llm_sandbox_mcp.commands import images as image_commands
    from llm_sandbox_mcp.run.libraries import egress_report

    usable: dict[str, bool] = {}
    for name in BACKENDS:
        try:
            backend = load_backend(name, settings)
            try:
                line = await backend.describe()
                sys.stdout.write(f"{name:<11} ok           {line}; {_seccomp_line(name, settings)}\n")
                for image_line in await image_commands.doctor_lines(settings, backend):
                    sys.stdout.write(image_line + "\n")
            finally:
                await backend.aclose()
            usable[name] = True
        except SandboxError as exc:
            usable[name] = False
            sys.stdout.write(f"{name:<11} unavailable  {exc}\n")
    try:
        chosen, why = await select_backend(settings)
        await chosen.aclose()
    except SandboxError as exc:
        sys.stdout.write(f"configured backend: {settings.backend} (NOT usable: {exc})\n")
        return 1
    if not usable.get(chosen.name):
        sys.stdout.write(f"configured backend: {chosen.name} (NOT usable)\n")
        return 1
    sys.stdout.write(f"configured backend: {chosen.name} (usable; {why})\n")
    for line in egress_report(settings, chosen.install_network):
        sys.stdout.write(f"egress: {line}\n")
    sys.stdout.write(f"pool: {_pool_line(settings)}\n")
    if settings.sandbox_zygote:
        sys.stdout.write(f"zygote: {await _zygote_line(settings)}\n")
    return 0


def _pool_line(settings: Settings) -> str:
    from llm_sandbox_mcp.run.pool import IDLE_SECONDS

    mib = 1024**2
    return (
        f"{settings.sandbox_pool_size} warm sandbox(es) per language in use (SANDBOX_POOL_SIZE), growing under "
        f"back-to-back or parallel calls to {settings.sandbox_max_concurrency} (SANDBOX_MAX_CONCURRENCY) and back "
        f"after {IDLE_SECONDS:g} s idle; each may use {settings.limits().memory_bytes // mib} MiB "
        f"(SANDBOX_MEM_LIMIT), all sandboxes together {settings.memory_budget() // mib} MiB (SANDBOX_MEMORY_BUDGET)"
    )


async def _zygote_line(settings: Settings) -> str:
    from llm_sandbox_mcp.backends import select_backend
    from llm_sandbox_mcp.languages import get_language
    from llm_sandbox_mcp.run.executor import Executor

    backend, _ = await select_backend(settings)
    try:
        async with Executor(settings, backend) as executor:
            python = get_language("python")
            return await executor.check_zygote(python)
    except SandboxError as exc:
        return f"not checked: {exc}"
    finally:
        await backend.aclose()


def _seccomp_line(name: str, settings: Settings) -> str:
    from llm_sandbox_mcp.seccomp import oci

    return oci.in_force(
        name, settings.sandbox_security_opt, settings.sandbox_privileged, settings.sandbox_k8s_seccomp_profile
    )


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    from llm_sandbox_mcp.backends import select_backend
    from llm_sandbox_mcp.models import Execution
    from llm_sandbox_mcp.run.executor import Executor

    code = sys.stdin.read() if args.file == "-" else await anyio.Path(args.file).read_text(encoding="utf-8")
    try:
        backend, _ = await select_backend(settings)
    except SandboxError as exc:
        sys.stderr.write(f"llm-sandbox-mcp: {exc}\n")
        return 2
    failure: SandboxError | None = None
    execution: Execution | None = None
    try:
        async with Executor(settings.model_copy(update={"sandbox_pool_size": 0}), backend) as executor:
            # Caught inside: leaving the executor's task group would wrap it in an ExceptionGroup.
            try:
                execution = await executor.execute(code, args.language, args.libraries, args.timeout)
            except SandboxError as exc:
                failure = exc
    finally:
        await backend.aclose()
    if failure is not None or execution is None:
        sys.stderr.write(f"llm-sandbox-mcp: {failure}\n")
        return 2
    if args.json:
        sys.stdout.write(execution.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(execution.stdout)
        sys.stderr.write(execution.stderr)
        for artifact in execution.artifacts:
            sys.stderr.write(f"[artifact] {artifact.name} ({artifact.mime_type}, {artifact.size} bytes)\n")
    return execution.exit_code if execution.exit_code is not None else 1
