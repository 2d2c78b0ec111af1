"""Resource bombs and escape attempts on every engine: each is contained (proven from inside the sandbox), and
the server answers the next call."""

from __future__ import annotations

import logging
import secrets
import tempfile
import textwrap
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError

from llm_sandbox_mcp.errors import InstallFailed
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry
from tests.engines.conftest import RecordingBackend, engine_settings
from tests.support.egress import loopback_name
from tests.support.registries import npm_registry, serve

pytestmark = pytest.mark.anyio


async def run(executor: Executor, code: str, language: str = "python", timeout: float = 60) -> tuple[str, str]:
    result = await executor.execute(textwrap.dedent(code), language, timeout=timeout)
    assert not result.timed_out, result
    return result.stdout, result.stderr


async def still_answers(executor: Executor) -> None:
    after = await executor.execute("print(1)")
    assert (after.exit_code, after.stdout) == (0, "1\n"), after


async def test_a_disk_bomb_stops_at_the_workspace_and_tmp_sizes(executor: Executor) -> None:
    code = """
    import errno, os
    block = b"\\0" * (1 << 20)
    for directory in ("/workspace", "/tmp"):
        written = 0
        try:
            with open(os.path.join(directory, "fill"), "wb") as handle:
                while written < (8 << 30):
                    handle.write(block)
                    handle.flush()
                    written += len(block)
            outcome = "no limit"
        except OSError as exc:
            outcome = errno.errorcode.get(exc.errno, str(exc.errno))
        print(directory, outcome, written >> 20)
    """
    stdout, _ = await run(executor, code)
    limits = executor.limits
    for line, ceiling in zip(stdout.splitlines(), (limits.workspace_bytes, limits.tmp_bytes), strict=True):
        _, outcome, mib = line.split()
        assert outcome in ("ENOSPC", "EFBIG", "EDQUOT"), line
        assert int(mib) <= ceiling >> 20, line
    await still_answers(executor)


async def test_a_file_descriptor_bomb_stops_at_the_open_files_limit(executor: Executor) -> None:
    code = """
    import os
    opened = []
    try:
        while len(opened) < 1_000_000:
            opened.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as exc:
        print(len(opened), exc.errno)
    """
    stdout, _ = await run(executor, code)
    count, error = stdout.split()
    assert 0 < int(count) <= executor.limits.nofile and error == "24", stdout  # EMFILE
    await still_answers(executor)


async def test_a_thread_bomb_stops_at_the_pids_limit(executor: Executor) -> None:
    code = """
    import threading, time
    started = 0
    try:
        while started < 100_000:
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
            started += 1
    except RuntimeError:
        pass
    print(started)
    """
    stdout, _ = await run(executor, code)
    assert 0 < int(stdout) < executor.limits.pids, stdout
    await still_answers(executor)


# On Kubernetes the kubelet sets the score from the pod's QoS class, on a node the server does not run on.
@pytest.mark.parametrize(
    "engine", [pytest.param(e, marks=getattr(pytest.mark, e)) for e in ("docker", "podman", "bubblewrap", "nsjail")]
)
async def test_out_of_memory_the_kernel_kills_a_sandbox_before_the_server(
    executor: Executor, registry: SessionRegistry
) -> None:
    """Every kind of sandbox runs the code at the highest OOM score (a one-shot Python call, forked or pooled,
    another language's pooled runtime, a session's cell), so the kernel's OOM killer picks it, not the server."""
    read = "print(open('/proc/self/oom_score_adj').read().strip())"
    python, _ = await run(executor, read)
    node, _ = await run(executor, "console.log(require('fs').readFileSync('/proc/self/oom_score_adj', 'utf8').trim())",
                        "javascript")  # fmt: skip
    session = await registry.create("python", [])
    try:
        cell = await registry.execute(session.id, read, [], 60)
    finally:
        await registry.close(session.id)
    assert (python, node, cell.stdout) == ("1000\n", "1000\n", "1000\n")


async def test_raw_and_packet_sockets_devices_and_kernel_knobs_are_out_of_reach(executor: Executor) -> None:
    code = """
    import os, socket
    def attempt(name, action):
        try:
            action()
            print(name, "ALLOWED")
        except OSError as exc:
            print(name, "refused", exc.errno)
    attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
    attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
    for device in ("/dev/mem", "/dev/kmem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1"):
        attempt(device, lambda: os.close(os.open(device, os.O_RDONLY)))
    for knob in ("/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"):
        attempt(knob, lambda: open(knob, "w").write("1"))
    print("devices", " ".join(sorted(os.listdir("/dev"))))
    """
    stdout, _ = await run(executor, code)
    lines = stdout.splitlines()
    assert not [line for line in lines if line.endswith("ALLOWED")], stdout
    devices = set(lines[-1].split()[1:])
    # Only the pseudo-devices a program needs: no disks, memory or kernel consoles.
    assert not devices & {"mem", "kmem", "kmsg", "sda", "vda", "nvme0n1", "port"}, devices
    await still_answers(executor)


async def test_links_in_the_outputs_never_bring_back_files_from_outside(executor: Executor) -> None:
    code = """
    const fs = require("fs");
    const out = process.env.OUTPUT_DIR;
    fs.mkdirSync(out, { recursive: true });
    fs.symlinkSync("/etc/passwd", out + "/passwd.txt");
    fs.symlinkSync("/proc/self/environ", out + "/environ.txt");
    fs.writeFileSync("/tmp/secret.txt", "kept out");
    try { fs.linkSync("/tmp/secret.txt", out + "/hard.txt"); } catch (e) { console.log("no hard link:", e.code); }
    fs.writeFileSync(out + "/real.txt", "ok");
    """
    result = await executor.execute(textwrap.dedent(code), "javascript", timeout=60)
    names = {artifact.name for artifact in result.artifacts}
    assert "real.txt" in names and "passwd.txt" not in names and "environ.txt" not in names, result
    for artifact in result.artifacts:
        assert artifact.data is None or b"root:" not in artifact.data
    python = await executor.execute(
        "import os\nos.makedirs(os.environ['OUTPUT_DIR'], exist_ok=True)\n"
        "os.symlink('/etc/passwd', os.path.join(os.environ['OUTPUT_DIR'], 'passwd.txt'))"
    )
    assert python.exit_code == 0 and python.artifacts == [], python
    await still_answers(executor)


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "import sys\nchunk = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(chunk)\n"),
        ("python", "import os\nchunk = b'y' * (1 << 20)\nwhile True:\n    os.write(2, chunk)\n"),
        ("ruby", "chunk = 'z' * (1 << 20)\nloop { $stdout.syswrite(chunk) }\n"),
    ],
    ids=["python-stdout", "python-stderr-raw", "ruby-stdout"],
)
async def test_an_endless_output_flood_is_stopped_at_the_read_budget_not_at_the_timeout(
    executor: Executor, language: str, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    """However long its timeout, a run that writes without end makes the server read a bounded number of bytes.

    And its processes are killed as any others are, proven gone: not left to the sandbox's removal after the
    kill's whole bound, as on Podman and Kubernetes while the kill waited with their output unread."""
    caplog.set_level(logging.WARNING, logger="llm_sandbox_mcp.backends")
    result = await executor.execute(code, language, timeout=240)
    assert not result.timed_out, result.stderr[-500:]
    assert result.exit_code != 0 and result.truncated
    flooded = result.stderr if "os.write(2" in code else result.stdout
    assert "bytes here; it was stopped]" in flooded[-200:], flooded[-300:]
    assert len(result.stdout) + len(result.stderr) < 4 * executor.settings.sandbox_output_limit
    unproven = [r.getMessage() for r in caplog.records if r.name.startswith("llm_sandbox_mcp.backends")]
    assert unproven == [], unproven
    await still_answers(executor)


# A package whose install script writes 40 MiB into the store under a directory it then makes unreadable, and
# ends: measured as its own user while it could still read, only the rest counted.
_STORE_HIDER = (
    "node -e \"const fs = require('fs'); fs.mkdirSync('hidden'); for (let i = 0; i < 40; i++)"
    " fs.writeFileSync('hidden/' + i, Buffer.alloc(1 << 20, 1)); fs.chmodSync('hidden', 0)\""
)


# A package whose install script writes 64 MiB into the store, then never ends.
_STORE_FILLER = (
    "node -e \"const fs = require('fs'); for (let i = 0; i < 64; i++) fs.appendFileSync('fill', Buffer.alloc(1 << 20));"
    ' setInterval(() => {}, 1000)"'
)


@pytest.mark.parametrize(
    ("postinstall", "refusal"),
    [
        pytest.param(_STORE_FILLER, "was stopped: its store grew past", id="filling-it-and-never-ending"),
        pytest.param(_STORE_HIDER, "above the limit of 16 MiB", id="hiding-it-from-the-measure"),
    ],
)
async def test_a_library_that_fills_its_store_is_stopped_while_it_installs(
    backend: RecordingBackend, engine: str, postinstall: str, refusal: str
) -> None:
    """The filler is measured while the install runs, not once it ends (it would only end at its 600 s timeout);
    the hider, which ends, once every process of it is gone and the modes it set are undone."""
    name, address = loopback_name()
    with (
        tempfile.TemporaryDirectory(prefix="llm-sandbox-store-filler-") as tmp,
        serve(Path(tmp), address, name) as url,
    ):
        package = npm_registry(Path(tmp), str(secrets.randbelow(10**9)), url, postinstall=postinstall)
        settings = engine_settings(
            engine, sandbox_npm_registry=url, sandbox_cache_max_size=16 * 1024**2, sandbox_install_timeout=600
        )
        async with Executor(settings, backend) as executor:
            with anyio.fail_after(120), pytest.raises(InstallFailed, match=refusal):
                await executor.execute(package.code, "javascript", [package.spec])
            await still_answers(executor)


# A package whose install script keeps what it can see of its registry settings: its environment and every npm
# configuration file.
_CREDENTIAL_SNOOPER = "(env; cat $HOME/.npmrc /etc/npmrc /usr/local/etc/npmrc; npm config list -l) > seen.txt 2>&1"
_READ_SEEN = (
    "const fs = require('fs'), path = require('path');\n"
    "process.stdout.write(fs.readFileSync(path.join(path.dirname(require.resolve('greet-egress')), 'seen.txt')));\n"
)


async def test_registry_credentials_never_reach_the_installer(backend: RecordingBackend, engine: str) -> None:
    """A registry URL with user:password@ is refused at start, naming the way round it and never repeating the
    value: before, the installer's environment and configuration carried it, read here by a package's own install
    script."""
    name, address = loopback_name()
    token = "reader-token-" + secrets.token_hex(8)
    with (
        tempfile.TemporaryDirectory(prefix="llm-sandbox-credentials-") as tmp,
        serve(Path(tmp), address, name) as url,
    ):
        package = npm_registry(Path(tmp), str(secrets.randbelow(10**9)), url, postinstall=_CREDENTIAL_SNOOPER)
        credentialed = url.replace("http://", f"http://reader:{token}@", 1)
        try:
            settings = engine_settings(engine, sandbox_npm_registry=credentialed, sandbox_install_timeout=300)
        except ValidationError as exc:
            (error,) = exc.errors()
            assert "carries credentials" in error["msg"] and "a mirror or proxy of yours" in error["msg"], error
            assert token not in error["msg"]
            return
        async with Executor(settings, backend) as executor:
            with anyio.fail_after(300):
                result = await executor.execute(_READ_SEEN, "javascript", [package.spec])
        assert result.exit_code == 0 and "PATH=" in result.stdout, result
        assert token not in result.stdout, "the installer saw the registry's credential"
