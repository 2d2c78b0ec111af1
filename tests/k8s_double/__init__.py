"""A Kubernetes API server test double whose pods run for real in the local Docker engine.

No cluster can run on the machines of this project, so the Kubernetes backend is tested with the
real `kubernetes` client against `KubeApiDouble`: it speaks the API server's wire format (JSON
objects, `Status` errors with their codes and reasons, watch streams, exec over WebSocket) and runs
each pod as one Docker container, so a backend's own code runs unchanged.

What it implements:

- Discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/networking.k8s.io/v1`), bearer-token
  authentication (401 `Status` without it), namespaces (every valid name exists).
- core/v1 pods: create, get, list (`labelSelector`, `fieldSelector`), delete (grace period), delete
  collection, `watch=true` (ADDED/MODIFIED/DELETED, `resourceVersion`, `timeoutSeconds`, 410 ERROR for
  expired versions), `pods/log`, and `pods/exec` over WebSocket (`v5.channel.k8s.io`,
  `v4.channel.k8s.io`, `channel.k8s.io`). Status moves Pending -> Running -> Succeeded/Failed, with
  the kubelet's waiting reasons (`CreateContainerConfigError`, `ErrImagePull`, ...).
- The pod spec where Docker can express it: image, command/args (with `$(VAR)` expansion), env,
  workingDir, pod and container securityContext (user/group, runAsNonRoot check, read-only root,
  capabilities, no-new-privileges, privileged, seccomp: `Localhost` profiles are read from the
  `seccomp_root` directory, as a kubelet reads its own), CPU/memory limits, emptyDir (tmpfs sized by
  sizeLimit) and PVC volumes, init containers, activeDeadlineSeconds.
- core/v1 persistentvolumeclaims backed by Docker named volumes (Bound at once, protected from
  deletion while a pod uses them), networking.k8s.io/v1 networkpolicies (stored; a deny-all egress
  policy gives the selected pods Docker network "none", other pods get the host network).

Exec behaves like the kubelet: v5 clients end stdin with `close_channel(0)`; v4 has no end-of-stdin
signal (an empty stdin frame is a zero-byte write), so stdin ends only when the client disconnects;
and a process still running when the client disconnects gets EOF on stdin but is not killed. A
command that cannot start gives an `InternalError` status, as on a real cluster (the client's
`returncode` then raises). Pod deletion honours the grace period (SIGTERM, then SIGKILL); grace 0
deletes the object at once and removes the container in the background.

What it deliberately does not: scheduling and nodes (one pretend node; pods bind at once), real
pod networking (no pod IPs, services, DNS or ingress rules; egress is all or nothing), admission
(no ServiceAccount token volume, no Pod Security, no quota, runtime classes are not API objects),
image pulls (images must exist locally), container restarts, updates (PUT/PATCH), multi-container pods
(422), and any other resource (404).

How tests use it::

    from tests.k8s_double import KubeApiDouble

    @pytest.fixture(scope="session")
    def kube_double(docker_client):
        KubeApiDouble.remove_leftovers(docker_client)  # what a killed earlier run left behind
        with KubeApiDouble(docker_client=docker_client, runtime_classes=("gvisor",)) as double:
            yield double  # stop() force-removes every container and volume it made

    def test_backend(kube_double, tmp_path):
        kubeconfig = kube_double.write_kubeconfig(tmp_path / "kubeconfig")
        api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        ...  # or Settings(backend="kubernetes", kubeconfig=kubeconfig)

`tests/k8s_double_tests/` has fixtures (`conftest.py`) and helpers (`pods.py`) to copy from.
"""

from .server import KubeApiDouble

__all__ = ("KubeApiDouble",)
