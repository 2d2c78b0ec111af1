"""What is specific to the Podman backend: finding the socket, explicit rlimits, what `describe` says, labels,
the sweep of dead servers' sandboxes and cleanup at shutdown.

The contract suite (test_contract.py) covers everything Podman shares with the other engines.
"""

# The podman SDK is unannotated.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from podman import PodmanClient

from llm_sandbox_mcp.backends import _owner, _podman
from llm_sandbox_mcp.backends._container import INIT
from llm_sandbox_mcp.backends._podman import PodmanEngine, dropped_limits
from llm_sandbox_mcp.backends._podman.libpod import container_spec, network_fields, security_fields
from llm_sandbox_mcp.backends._podman.service import Candidate, Engine, candidates
from llm_sandbox_mcp.backends._threaded import Threaded
from llm_sandbox_mcp.errors import BackendUnavailable, ImageMissing, SandboxFailure
from llm_sandbox_mcp.images import run_image
from llm_sandbox_mcp.models import Limits, SandboxSpec
from tests.engines.conftest import engine_settings, require

pytestmark = pytest.mark.anyio

ROOTFUL = "unix:///run/podman/podman.sock"
DOCKER_SOCKET = "unix:///var/run/docker.sock"
_DESCRIBED = re.compile(
    r"^Podman (?P<version>\d+\.\d+\.\d+\S*) \(API \S+, (?P<mode>rootful|rootless), cgroup v\d, (?P<runtime>\S+)\) "
    r"at (?P<url>\S+) \(from (?P<source>.+)\)$"
)


def urls(found: list[Candidate]) -> list[tuple[str, str]]:
    return [(c.url, c.source) for c in found]


# Discovery order (no engine needed).


def test_podman_host_is_the_only_socket_tried_when_set() -> None:
    found = candidates("tcp://podman:8888", DOCKER_SOCKET, {"CONTAINER_HOST": "unix:///c.sock"}, 0)
    assert urls(found) == [("tcp://podman:8888", "PODMAN_HOST")]
    assert found[0].explicit


def test_container_host_comes_next_and_is_then_the_only_socket_tried() -> None:
    found = candidates(None, DOCKER_SOCKET, {"CONTAINER_HOST": "unix:///c.sock"}, 1000)
    assert urls(found) == [("unix:///c.sock", "CONTAINER_HOST")]
    assert found[0].explicit


def test_root_tries_docker_host_then_the_rootful_then_the_rootless_socket() -> None:
    found = candidates(None, DOCKER_SOCKET, {"XDG_RUNTIME_DIR": "/run/user/0"}, 0)
    assert urls(found) == [
        (DOCKER_SOCKET, "DOCKER_HOST"),
        (ROOTFUL, "the rootful default socket"),
        ("unix:///run/user/0/podman/podman.sock", "the rootless default socket"),
    ]
    assert not any(c.explicit for c in found)


def test_a_user_tries_their_own_rootless_socket_before_the_rootful_one() -> None:
    found = candidates(None, None, {"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000)
    assert urls(found) == [
        ("unix:///run/user/1000/podman/podman.sock", "the rootless default socket"),
        (ROOTFUL, "the rootful default socket"),
    ]


def test_without_xdg_runtime_dir_the_rootless_socket_is_under_run_user() -> None:
    assert urls(candidates(None, None, {}, 1234))[0] == (
        "unix:///run/user/1234/podman/podman.sock",
        "the rootless default socket",
    )


def test_docker_host_naming_a_default_socket_is_tried_once() -> None:
    found = candidates(None, "http+unix://%2Frun%2Fpodman%2Fpodman.sock", {}, 0)
    assert [c.source for c in found] == ["DOCKER_HOST", "the rootless default socket"]


# Translation into libpod's spec (no engine needed).


def test_the_spec_keeps_a_bare_sleeper_as_pid_1_and_kills_it_at_once_on_removal() -> None:
    spec = container_spec(SandboxSpec("python:3.12-slim", Limits()), {"a": "b"})
    assert spec["command"] == INIT and spec["init"] is False
    assert (spec["stop_signal"], spec["stop_timeout"]) == (9, 0)
    assert spec["httpproxy"] is False and spec["read_write_tmpfs"] is False
    assert spec["no_new_privileges"] is True and spec["cap_drop"] == ["ALL"]
    assert spec["netns"] == {"nsmode": "none"}


@pytest.mark.parametrize(
    ("options", "fields"),
    [
        (["no-new-privileges:true"], {"no_new_privileges": True}),
        (["no-new-privileges"], {"no_new_privileges": True}),
        (["no-new-privileges=false"], {"no_new_privileges": False}),
        (
            ["seccomp=unconfined", "apparmor=unconfined", "label=disable"],
            {
                "no_new_privileges": False,
                "seccomp_profile_path": "unconfined",
                "apparmor_profile": "unconfined",
                "selinux_opts": ["disable"],
            },
        ),
        (["systempaths=unconfined"], {"no_new_privileges": False, "unmask": ["ALL"]}),
    ],
)
def test_docker_security_options_become_podman_fields(options: list[str], fields: dict[str, object]) -> None:
    assert security_fields(options) == fields


def test_an_unknown_security_option_names_the_variable() -> None:
    with pytest.raises(ValueError, match="SANDBOX_SECURITY_OPT: Podman does not understand 'no-fun'"):
        security_fields(["no-fun"])


@pytest.mark.parametrize(
    ("mode", "fields"),
    [
        ("none", {"netns": {"nsmode": "none"}}),
        ("host", {"netns": {"nsmode": "host"}}),
        ("container:abc", {"netns": {"nsmode": "container", "value": "abc"}}),
        ("sandbox-net", {"netns": {"nsmode": "bridge"}, "networks": {"sandbox-net": {}}}),
    ],
)
def test_docker_network_modes_become_podman_namespaces(mode: str, fields: dict[str, object]) -> None:
    assert network_fields(mode) == fields


@pytest.mark.parametrize(
    ("rootless", "cgroup", "controllers", "problem"),
    [
        (False, "v1", (), None),
        (True, "v2", ("cpu", "memory", "pids"), None),
        (True, "v1", ("cpu", "memory", "pids"), "cgroup v1"),
        (True, "v2", ("cpu", "memory"), "the pids cgroup controllers not delegated"),
    ],
)
def test_rootless_podman_that_would_drop_limits_is_refused(
    rootless: bool, cgroup: str, controllers: tuple[str, ...], problem: str | None
) -> None:
    found = Engine("4.3.1", "4.3.1", rootless, cgroup, controllers, "crun").limits_problem()
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found and "cannot enforce memory, CPU and pids limits" in found


def test_the_warning_of_rootless_podman_on_cgroup_v1_refuses_the_sandbox() -> None:
    # What rootless Podman 4.3 answers to a create with limits on a cgroup v1 host (seen on this machine).
    warning = "Resource limits are not supported and ignored on cgroups V1 rootless systems"
    assert dropped_limits([warning]) == [warning]
    assert dropped_limits(["some unrelated notice"]) == []


# Errors before any engine is reached.


async def test_no_socket_anywhere_names_every_place_tried_and_how_to_start_podman(tmp_path: Path) -> None:
    backend = Threaded(
        PodmanEngine(
            [
                Candidate(f"unix://{tmp_path}/a.sock", "the rootless default socket"),
                Candidate(f"unix://{tmp_path}/b.sock", "the rootful default socket"),
            ]
        )
    )
    with pytest.raises(BackendUnavailable) as raised:
        await backend.describe()
    message = str(raised.value)
    assert f"{tmp_path}/a.sock (the rootless default socket): No such file or directory" in message
    assert f"{tmp_path}/b.sock (the rootful default socket): No such file or directory" in message
    assert "systemctl --user enable --now podman.socket" in message and "PODMAN_HOST" in message


async def test_ssh_addresses_say_how_to_forward_the_socket() -> None:
    backend = _podman.from_settings(engine_settings("podman", podman_host="ssh://core@host/run/podman/podman.sock"))
    with pytest.raises(BackendUnavailable, match=r"^PODMAN_HOST: ssh:// addresses are not supported.*ssh -L"):
        await backend.describe()


# Against the real service.


@pytest.fixture
async def service(request: pytest.FixtureRequest) -> dict[str, str]:
    """What `describe` says of the Podman service the engine tier uses, found by the default discovery."""
    await require(request, "podman")
    return await described(_podman.from_settings(engine_settings("podman")))


@pytest.fixture
def podman_url(service: dict[str, str]) -> str:
    return service["url"]


async def described(backend: Threaded) -> dict[str, str]:
    try:
        line = await backend.describe()
    finally:
        await backend.aclose()
    match = _DESCRIBED.match(line)
    assert match is not None, line
    return match.groupdict()


@pytest.mark.podman
async def test_describe_reports_the_version_the_socket_and_rootful_or_rootless(podman_url: str) -> None:
    fields = await described(_podman.from_settings(engine_settings("podman", podman_host=podman_url)))
    assert fields["url"] == podman_url and fields["source"] == "PODMAN_HOST"
    assert fields["mode"] == ("rootful" if podman_url == ROOTFUL else fields["mode"])


@pytest.mark.podman
async def test_podman_host_wins_over_container_host(podman_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTAINER_HOST", "unix:///nonexistent/podman.sock")
    fields = await described(_podman.from_settings(engine_settings("podman", podman_host=podman_url)))
    assert fields["source"] == "PODMAN_HOST"
    monkeypatch.setenv("CONTAINER_HOST", podman_url)
    fields = await described(_podman.from_settings(engine_settings("podman")))
    assert (fields["url"], fields["source"]) == (podman_url, "CONTAINER_HOST")


@pytest.mark.podman
async def test_docker_host_is_used_only_when_it_is_a_podman_socket(
    podman_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTAINER_HOST", raising=False)
    fields = await described(_podman.from_settings(engine_settings("podman", docker_host=podman_url)))
    assert (fields["url"], fields["source"]) == (podman_url, "DOCKER_HOST")
    # Docker's own socket (or none at all) is passed over for the default sockets.
    fields = await described(_podman.from_settings(engine_settings("podman", docker_host=DOCKER_SOCKET)))
    assert fields["url"] == podman_url and fields["source"] != "DOCKER_HOST"


async def test_an_explicit_socket_that_does_not_answer_is_an_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = f"unix://{tmp_path}/podman.sock"
    backend = _podman.from_settings(engine_settings("podman", podman_host=missing))
    with pytest.raises(BackendUnavailable) as raised:
        await backend.create(SandboxSpec("python:3.12-slim", Limits()))
    assert str(raised.value).startswith(
        f"The Podman service at {missing} (PODMAN_HOST) does not answer (No such file or directory). Start"
    )
    monkeypatch.setenv("CONTAINER_HOST", missing)
    with pytest.raises(BackendUnavailable, match=re.escape(f"at {missing} (CONTAINER_HOST) does not answer")):
        await _podman.from_settings(engine_settings("podman")).describe()


@pytest.mark.docker
async def test_docker_named_as_the_podman_socket_is_reported_as_not_podman(request: pytest.FixtureRequest) -> None:
    await require(request, "docker")
    backend = _podman.from_settings(engine_settings("podman", podman_host=DOCKER_SOCKET))
    with pytest.raises(
        BackendUnavailable, match=r"\(PODMAN_HOST\) does not answer \(answers, but is not the Podman API"
    ):
        await backend.describe()


@pytest.fixture
async def podman_backend(podman_url: str) -> AsyncIterator[Threaded]:
    backend = _podman.from_settings(engine_settings("podman", podman_host=podman_url))
    try:
        yield backend
    finally:
        await backend.aclose()


LIMITS_PROBE = ["sh", "-c", "ulimit -n; grep -E '^Max (open files|processes|core file size) ' /proc/self/limits"]


def limits_seen(output: bytes) -> tuple[str, dict[str, tuple[str, str]]]:
    """`ulimit -n`, and soft and hard of each limit in /proc/self/limits."""
    first, *rows = output.decode().splitlines()
    table = {name: tuple(re.split(r"\s+", rest.strip())[:2]) for name, rest in (r[4:].split("  ", 1) for r in rows)}
    return first, {name: (soft, hard) for name, (soft, hard) in table.items()}


@pytest.mark.podman
async def test_rlimits_are_explicit_and_lowered(podman_url: str) -> None:
    settings = engine_settings("podman", podman_host=podman_url, sandbox_nofile_limit=512)
    backend = _podman.from_settings(settings)
    ref = await backend.create(SandboxSpec(run_image(settings, "python"), settings.limits()))
    try:
        result = await backend.exec(ref, LIMITS_PROBE, timeout=30)
    finally:
        await backend.aclose()
    ulimit_n, table = limits_seen(result.stdout)
    assert ulimit_n == "512"  # SANDBOX_NOFILE_LIMIT, not the service's containers.conf (1024 here)
    assert table == {"core file size": ("0", "0"), "processes": ("4096", "4096"), "open files": ("512", "512")}


@pytest.fixture
def bare_service(service: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A private, socket-activated Podman service whose containers.conf names only the runtime: no default_ulimits.

    Where the host refuses Podman's own default (raised) rlimits, a container without explicit ones cannot start
    on it.
    """
    podman = shutil.which("podman")
    assert podman is not None
    conf = tmp_path / "containers.conf"
    conf.write_text(f'[engine]\nruntime = "{service["runtime"]}"\n')
    path = tmp_path / "podman.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    # Socket activation: the service takes fd 3; connections wait in the backlog until it serves them.
    activate = (
        "import os, sys\nfd = int(sys.argv[1])\nif fd != 3:\n    os.dup2(fd, 3)\n    os.close(fd)\n"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')\n"
        "os.execv(sys.argv[2], [sys.argv[2], 'system', 'service', '--time=0'])\n"
    )
    with (tmp_path / "service.log").open("wb") as log, listener:
        process = subprocess.Popen(
            [sys.executable, "-c", activate, str(listener.fileno()), podman],
            pass_fds=(listener.fileno(),),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CONTAINERS_CONF": str(conf)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        yield f"unix://{path}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.podman
async def test_sandboxes_start_on_a_service_without_configured_ulimits(bare_service: str) -> None:
    settings = engine_settings("podman", podman_host=bare_service, sandbox_nofile_limit=777)
    backend = _podman.from_settings(settings)
    try:
        ref = await backend.create(SandboxSpec(run_image(settings, "python"), settings.limits()))
        result = await backend.exec(ref, LIMITS_PROBE, timeout=30)
    finally:
        await backend.aclose()
    assert limits_seen(result.stdout)[0] == "777", result.stderr


@pytest.mark.podman
async def test_a_missing_image_is_pulled_once_then_reported_with_the_way_to_load_it(
    podman_backend: Threaded,
) -> None:
    with pytest.raises(ImageMissing) as raised:
        await podman_backend.create(SandboxSpec("llm-sandbox-no-such-image:1", Limits()))
    message = str(raised.value)
    assert message.startswith("Image 'llm-sandbox-no-such-image:1' is not in Podman's image store and could not be")
    assert "docker save llm-sandbox-no-such-image:1 | podman load" in message and "SANDBOX_IMAGE_" in message


@pytest.mark.podman
async def test_output_survives_a_process_that_exits_without_reading_its_input(podman_backend: Threaded) -> None:
    # Podman 4.3 loses the output of about half of these when the unread input is left behind.
    settings = engine_settings("podman")
    ref = await podman_backend.create(SandboxSpec(run_image(settings, "python"), settings.limits()))
    for _ in range(20):
        result = await podman_backend.exec(
            ref, ["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30, stdin=b"unread" * 200
        )
        assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")


@pytest.mark.podman
async def test_a_large_input_echoed_back_does_not_deadlock(podman_backend: Threaded) -> None:
    settings = engine_settings("podman")
    ref = await podman_backend.create(SandboxSpec(run_image(settings, "python"), settings.limits()))
    data = bytes(range(256)) * 8192  # 2 MiB: more than the socket buffers on either side hold
    result = await podman_backend.exec(ref, ["cat"], timeout=60, stdin=data)
    assert (result.exit_code, result.timed_out, result.stdout == data) == (0, False, True)


@pytest.mark.podman
async def test_a_sandbox_where_the_kill_cannot_run_is_removed_instead(
    podman_backend: Threaded, podman_url: str
) -> None:
    settings = engine_settings("podman")
    ref = await podman_backend.create(SandboxSpec(run_image(settings, "python"), settings.limits()))
    # A paused sandbox refuses new processes, as one whose pids limit is exhausted may.
    with PodmanClient(base_url=podman_url) as client:
        client.api.post(f"/containers/{ref.id}/pause").raise_for_status()
    await podman_backend.kill_all(ref)
    with pytest.raises(SandboxFailure, match="is gone"):
        await podman_backend.exec(ref, ["true"], timeout=10)


@pytest.fixture
def client(podman_url: str) -> Iterator[PodmanClient]:
    with PodmanClient(base_url=podman_url) as api:
        yield api


def ours(client: PodmanClient) -> list[str]:
    found = client.containers.list(all=True, filters={"label": f"{_owner.INSTANCE}={_owner.INSTANCE_ID}"})
    return [str(c.id) for c in found]


@pytest.mark.podman
async def test_sandboxes_are_labelled_hardened_and_removed_at_shutdown(client: PodmanClient, podman_url: str) -> None:
    settings = engine_settings("podman", podman_host=podman_url)
    backend = _podman.from_settings(settings)
    ref = await backend.create(SandboxSpec(run_image(settings, "python"), settings.limits()))
    attrs = client.containers.get(ref.id).attrs
    config, host = attrs["Config"], attrs["HostConfig"]
    assert config["Labels"][_owner.MANAGED] == "true" and config["Labels"][_owner.INSTANCE] == _owner.INSTANCE_ID
    assert config["User"] == "65534:65534" and config["Cmd"] == INIT and host.get("Init") in (None, False)
    assert host["ReadonlyRootfs"] is True and host["NetworkMode"] == "none" and host["Privileged"] is False
    assert "CAP_SYS_ADMIN" not in host["CapAdd"] and "CAP_CHOWN" in host["CapDrop"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Memory"] == host["MemorySwap"] == 512 * 1024**2
    assert host["PidsLimit"] == 128 and (host["CpuQuota"], host["CpuPeriod"]) == (100_000, 100_000)
    assert host["Binds"] in (None, []) and attrs["Mounts"] == []
    assert set(host["Tmpfs"]) == {"/workspace", "/tmp"}
    assert "HOME=/tmp" in config["Env"] and not any(
        e.lower().startswith(("http_proxy", "https_proxy")) for e in config["Env"]
    )
    assert ref.id in ours(client)
    await backend.aclose()
    assert ours(client) == []


@pytest.mark.podman
async def test_sweep_removes_sandboxes_of_dead_servers_only(client: PodmanClient, podman_url: str) -> None:
    dead = {**_owner.owner_labels(), _owner.INSTANCE: "dead-server", _owner.PID: "999999999", _owner.STARTED: "1"}
    elsewhere = {**dead, _owner.INSTANCE: "other-host", _owner.HOST: "some-other-machine"}
    image = run_image(engine_settings("podman"), "python")
    stale = client.containers.create(image, ["sleep", "infinity"], labels=dead, network_mode="none")
    foreign = client.containers.create(image, ["sleep", "infinity"], labels=elsewhere, network_mode="none")
    settings = engine_settings("podman", podman_host=podman_url)
    backend = _podman.from_settings(settings)
    try:
        mine = await backend.create(SandboxSpec(image, settings.limits()))
        swept = await backend.sweep()
        remaining = {c.id for c in client.containers.list(all=True)}
        assert swept >= 1
        assert stale.id not in remaining
        assert foreign.id in remaining  # another host's server may be alive: never judged dead
        assert mine.id in remaining
    finally:
        await backend.aclose()
        foreign.remove(force=True)


@pytest.mark.podman
async def test_the_seccomp_profile_is_written_again_when_its_volume_was_pruned(
    podman_backend: Threaded, client: PodmanClient
) -> None:
    """The profile lives in a volume of the service that no container mounts, so `podman volume prune` removes
    it; the next sandbox writes it again instead of failing."""
    settings = engine_settings("podman")
    spec = SandboxSpec(run_image(settings, "python"), settings.limits())
    await podman_backend.destroy(await podman_backend.create(spec))
    profiles = client.volumes.list(filters={"label": f"{_owner.KIND}=seccomp-profile"})
    assert profiles, "the profile's volume was not made"
    for volume in profiles:
        volume.remove(force=True)
    ref = await podman_backend.create(spec)
    result = await podman_backend.exec(ref, ["grep", "-E", "^(Seccomp|NoNewPrivs):", "/proc/self/status"], timeout=30)
    assert result.stdout.split() == [b"NoNewPrivs:", b"1", b"Seccomp:", b"2"], result.stderr
