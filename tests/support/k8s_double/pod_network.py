"""The network of a pod that a deny-all egress NetworkPolicy selects, as a cluster's CNI leaves it.

A cluster keeps such a pod's interface and filters its traffic: code in the pod sees `eth0` with an address and a
default route, its packets leave the pod and are dropped on the node, and its DNS server (the cluster's, in
`/etc/resolv.conf`) never answers. The double builds the same: a pod sandbox container (the kubelet's "pause"
container) holds the pod's network namespace, with `eth0` one end of a veth pair whose other end lies in a
node-side namespace (one per double) that has no address and forwards nothing, so every packet sent out of the
pod is dropped there; the default route goes through a link-local gateway with a fixed neighbour entry, as
Calico lays pods out, so packets really leave (no ARP failure decides the outcome). The pod's containers join
that namespace. Connections out therefore time out rather than fail at once, as on a cluster.

Differences kept on purpose (and listed in the package docstring): the resolver options `timeout:1 attempts:1`
make a refused lookup take seconds rather than the tens of seconds a cluster's default resolver takes, and the
pod's address is not reported in `status.podIP`.

Needs root and the host's `ip` and `nsenter` (iproute2, util-linux), which the double's machines have.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping

import docker
from docker.models.containers import Container

GATEWAY = "169.254.1.1"
_GATEWAY_MAC = "ee:ee:ee:ee:ee:ee"
CLUSTER_DNS = "10.96.0.10"  # the conventional ClusterIP of kube-dns (a kubelet's --cluster-dns)
_RESOLV_OPTIONS = "ndots:5 timeout:1 attempts:1"


class PodNetworkError(Exception):
    """The pod sandbox's network could not be set up; `str()` is the kubelet's message."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PodNetworkError(f"failed to set up pod network: the k8s test double needs {name!r} on the host")
    return path


def _in_netns(pid: int, argv: list[str]) -> None:
    completed = subprocess.run(
        [_tool("nsenter"), f"--net=/proc/{pid}/ns/net", _tool("ip"), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if completed.returncode != 0:
        raise PodNetworkError(f"failed to set up pod network: ip {' '.join(argv)}: {completed.stderr.strip()}")


def _pid(container: Container) -> int:
    container.reload()
    return int(container.attrs["State"]["Pid"])


def node_namespace(client: docker.DockerClient, image: str, labels: Mapping[str, str]) -> Container:
    """The node side of every denied pod's veth pair: a network namespace with no address and no forwarding."""
    node = client.containers.create(
        image,
        entrypoint=["sleep", "infinity"],
        network_mode="none",
        labels={**labels, "io.kubernetes.container.name": "k8s-double-node-network"},
        cap_drop=["ALL"],
        detach=True,
    )
    node.start()
    return node


def pod_sandbox(
    client: docker.DockerClient,
    image: str,
    *,
    name: str,
    hostname: str,
    labels: Mapping[str, str],
    node: Container,
    address: str,
    namespace: str,
) -> Container:
    """Start the pod's sandbox container and give its namespace `eth0` (at `address`), the route out and the
    cluster's resolver; the pod's containers join it with network mode `container:<id>`.

    Raises:
        PodNetworkError: the network could not be made (the kubelet's FailedCreatePodSandBox).
    """
    sandbox = client.containers.create(
        image,
        name=name,
        entrypoint=["sleep", "infinity"],
        network_mode="none",
        hostname=hostname,
        labels={**labels, "io.kubernetes.container.name": "POD"},
        cap_drop=["ALL"],
        detach=True,
    )
    sandbox.start()
    pod_pid, node_pid = _pid(sandbox), _pid(node)
    peer = f"k8sd{str(sandbox.id)[:10]}"
    _in_netns(pod_pid, ["link", "add", "eth0", "type", "veth", "peer", "name", peer])
    _in_netns(pod_pid, ["link", "set", peer, "netns", str(node_pid)])
    _in_netns(node_pid, ["link", "set", peer, "address", _GATEWAY_MAC, "up"])
    _in_netns(pod_pid, ["addr", "add", f"{address}/32", "dev", "eth0"])
    _in_netns(pod_pid, ["link", "set", "eth0", "up"])
    _in_netns(pod_pid, ["route", "add", GATEWAY, "dev", "eth0", "scope", "link"])
    _in_netns(pod_pid, ["route", "add", "default", "via", GATEWAY, "dev", "eth0"])
    _in_netns(pod_pid, ["neigh", "add", GATEWAY, "lladdr", _GATEWAY_MAC, "dev", "eth0", "nud", "permanent"])
    resolv = (
        f"nameserver {CLUSTER_DNS}\n"
        f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
        f"options {_RESOLV_OPTIONS}\n"
    )
    written = sandbox.exec_run(["sh", "-c", 'printf "%s" "$0" > /etc/resolv.conf', resolv], user="0")
    if written.exit_code != 0:
        raise PodNetworkError(f"failed to set up pod DNS: {written.output!r}")
    return sandbox
