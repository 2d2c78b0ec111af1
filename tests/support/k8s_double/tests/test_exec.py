"""pods/exec over WebSocket with the real client's `stream()`: channels, stdin, exit codes, errors."""

from __future__ import annotations

from typing import Any

import docker
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.k8s_double import KubeApiDouble

from .conftest import PodFactory
from .pods import (
    WAIT_SECONDS,
    exec_in_pod,
    exec_stream,
    failure_reason,
    model,
    open_exec,
    phase_is,
    run_pod,
    wait_for_pod,
)

pytestmark = pytest.mark.kubernetes


@pytest.fixture
def pod(core: client.CoreV1Api, namespace: str, make_pod: PodFactory) -> str:
    run_pod(core, namespace, make_pod("shell"))
    return "shell"


def test_client_negotiates_v5_and_cat_echoes_stdin_until_stdin_is_closed(
    core: client.CoreV1Api, namespace: str, pod: str
) -> None:
    with exec_stream(core, namespace, pod, ["cat"]) as ws:
        assert ws.subprotocol == "v5.channel.k8s.io"
        ws.write_stdin("first line\n")
        assert ws.readline_stdout(timeout=WAIT_SECONDS) == "first line"
        ws.write_stdin("second")
        ws.close_channel(0)
        ws.run_forever(timeout=WAIT_SECONDS)

        assert ws.read_stdout() == "second"
        assert ws.returncode == 0


def test_stdout_and_stderr_stream_separately_while_the_command_still_runs(
    core: client.CoreV1Api, namespace: str, pod: str
) -> None:
    script = "echo to-out; echo to-err >&2; read line; echo got-$line"
    with exec_stream(core, namespace, pod, ["sh", "-c", script]) as ws:
        assert ws.readline_stdout(timeout=WAIT_SECONDS) == "to-out"
        assert ws.readline_stderr(timeout=WAIT_SECONDS) == "to-err"
        assert ws.is_open()  # the command is blocked on `read`: output arrived before it finished
        ws.write_stdin("go\n")
        ws.run_forever(timeout=WAIT_SECONDS)

        assert ws.read_stdout() == "got-go\n"
        assert ws.read_stderr() == ""


@pytest.mark.parametrize("code", [0, 3, 137])
def test_returncode_is_the_exit_status_of_the_command(
    core: client.CoreV1Api, namespace: str, pod: str, code: int
) -> None:
    out, err, returncode = exec_in_pod(core, namespace, pod, ["sh", "-c", f"echo before; exit {code}"])

    assert (out, err, returncode) == ("before\n", "", code)


def test_non_zero_exit_status_frame_is_the_kubelet_v4_status(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    with exec_stream(core, namespace, pod, ["sh", "-c", "exit 3"], stdin=False) as ws:
        ws.run_forever(timeout=WAIT_SECONDS)
        status = ws.read_channel(3)

    assert status == (
        '{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: '
        'error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode",'
        '"details":{"causes":[{"reason":"ExitCode","message":"3"}]}}'
    )


def test_exec_into_a_missing_pod_is_404_before_the_upgrade(core: client.CoreV1Api, namespace: str) -> None:
    with pytest.raises(ApiException) as caught:
        open_exec(core, namespace, "ghost", ["true"])

    # The client reports a failed handshake as status 0 with the HTTP answer in the reason.
    assert "Handshake status 404" in failure_reason(caught.value)
    assert '"reason": "NotFound"' in failure_reason(caught.value)


def test_exec_into_a_finished_or_pending_pod_is_400(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("done", command=["true"])))
    core.create_namespaced_pod(
        namespace, model(client.V1Pod, make_pod("stuck", securityContext={"runAsNonRoot": True}))
    )
    wait_for_pod(core, namespace, "done", phase_is("Succeeded"))

    for name in ("done", "stuck"):
        with pytest.raises(ApiException) as caught:
            open_exec(core, namespace, name, ["true"])
        assert "Handshake status 400" in failure_reason(caught.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param({"container": "sidecar"}, "container sidecar is not valid for pod shell", id="unknown-container"),
        pytest.param({"tty": True}, "tty: not supported by the k8s test double", id="tty"),
        pytest.param(
            {"_headers": {"sec-websocket-protocol": "v3.channel.k8s.io"}},
            "requested protocol(s) are not supported",
            id="protocol-older-than-v4",
        ),
    ],
)
def test_exec_the_double_cannot_serve_is_400(
    core: client.CoreV1Api, namespace: str, pod: str, flags: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiException) as caught:
        open_exec(core, namespace, pod, ["true"], **flags)

    assert "Handshake status 400" in failure_reason(caught.value)
    assert message in failure_reason(caught.value)


def test_missing_executable_is_an_internal_error_status_as_on_a_real_cluster(
    core: client.CoreV1Api, namespace: str, pod: str
) -> None:
    with exec_stream(core, namespace, pod, ["no-such-binary"], stdin=False) as ws:
        ws.run_forever(timeout=WAIT_SECONDS)
        assert ws.read_stdout() == ""
        status = ws.peek_channel(3)
        # A real cluster answers InternalError here too; the client's `returncode` cannot parse it.
        with pytest.raises(ValueError, match="invalid literal"):
            _ = ws.returncode

    assert '"reason":"InternalError"' in status and "executable file not found" in status


def test_v4_client_gets_v4_and_stdin_ends_only_when_it_disconnects(
    core: client.CoreV1Api, namespace: str, pod: str
) -> None:
    with exec_stream(
        core,
        namespace,
        pod,
        ["sh", "-c", "cat; echo eof >&2"],
        _headers={"sec-websocket-protocol": "v4.channel.k8s.io"},
    ) as ws:
        assert ws.subprotocol == "v4.channel.k8s.io"
        ws.write_stdin("ping\n")
        assert ws.readline_stdout(timeout=WAIT_SECONDS) == "ping"
        ws.close_channel(0)  # no-op: v4 has no way to say "end of stdin"
        ws.write_stdin("")  # an empty stdin frame is a zero-byte write, not EOF (as in the kubelet)
        ws.write_stdin("pong\n")
        assert ws.readline_stdout(timeout=WAIT_SECONDS) == "pong"
        assert ws.is_open()


def test_process_keeps_running_after_the_client_disconnects_as_with_the_kubelet(
    kube: KubeApiDouble, core: client.CoreV1Api, namespace: str, pod: str, docker_client: docker.DockerClient
) -> None:
    with exec_stream(core, namespace, pod, ["sh", "-c", "echo started; exec sleep 1234"], stdin=False) as ws:
        assert ws.readline_stdout(timeout=WAIT_SECONDS) == "started"

    container_id = kube.container_id(pod, namespace)
    assert container_id is not None
    processes = docker_client.containers.get(container_id).top()["Processes"]
    assert any("sleep 1234" in " ".join(p) for p in processes)
    kill = "ps -o pid,args | awk '/[s]leep 1234/ {print $1}' | xargs kill"
    assert exec_in_pod(core, namespace, pod, ["sh", "-c", kill])[2] == 0


def test_large_binary_stdin_round_trips_through_cat(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB, every byte value
    with exec_stream(core, namespace, pod, ["sh", "-c", "cat | wc -c"], binary=True) as ws:
        for offset in range(0, len(payload), 65536):
            ws.write_stdin(payload[offset : offset + 65536])
        ws.close_channel(0)
        ws.run_forever(timeout=WAIT_SECONDS)

        assert ws.read_stdout().strip() == str(len(payload)).encode()
        assert ws.returncode == 0


def test_stdin_for_a_command_that_does_not_read_it_still_ends_with_its_status(
    core: client.CoreV1Api, namespace: str, pod: str
) -> None:
    with exec_stream(core, namespace, pod, ["sh", "-c", "exit 4"], binary=True) as ws:
        ws.write_stdin(b"x" * (1 << 20))  # more than a pipe holds: the write meets a closed pipe
        ws.run_forever(timeout=WAIT_SECONDS)

        assert ws.returncode == 4


def test_large_output_arrives_complete(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    out, _, returncode = exec_in_pod(core, namespace, pod, ["sh", "-c", "seq 1 200000"])

    assert returncode == 0
    assert out.splitlines() == [str(n) for n in range(1, 200001)]
