"""A Kubernetes API server test double whose pods run for real in the local Docker engine.

No cluster can run on the machines of this project, so the Kubernetes backend is tested with the
real `kubernetes` client against `KubeApiDouble`: it speaks the API server's wire format (JSON
objects, `Status` errors with their codes and reasons, watch streams, exec over WebSocket) and runs
each pod as one Docker container, so a backend's own code runs unchanged.

It serves what the Kubernetes backend sends, and answers everything else as an API server answers
what it does not serve, so a backend that starts relying on more finds out at once.

What it implements:

- `/version`, discovery of the groups it serves (`/apis`, `/apis/GROUP/VERSION`), bearer-token authentication
  (401 `Status` without it); every valid namespace name exists.
  The double's own token is an administrator's; `grant(role, user)` makes a token bound to one Role, whose
  requests RBAC authorizes (403 `Forbidden` as the API server words it; exec over WebSocket needs `get` and
  `create` on `pods/exec`, as since 1.35) and records (`Grant.asked`), see `rbac.py`.
- core/v1 pods: create, get, list, delete (grace period 0), `watch=true` (ADDED/MODIFIED/DELETED,
  `resourceVersion`, `timeoutSeconds`, 410 ERROR for expired versions), and `pods/exec` over
  WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`). Status moves Pending -> Running ->
  Succeeded/Failed, with the kubelet's waiting reasons (`CreateContainerConfigError`, `ErrImagePull`,
  ...) and pending conditions (`Unschedulable`, `FailedCreatePodSandBox`).
- Equality selectors: `labelSelector=key=value,...`, `fieldSelector=metadata.name=NAME`.
- The API server's validation where a backend can trip over it (names, labels, quantities, volumes,
  mounts, security-context combinations: 422 `Invalid` with field causes) and the kubelet's
  runAsNonRoot check.
- The pod spec where Docker can express it: one container's image, command/args, env, workingDir,
  pod and container securityContext (user/group, supplementalGroups/fsGroup, runAsNonRoot, read-only
  root, capabilities, no-new-privileges, privileged, seccomp: `Localhost` profiles are read from the
  `seccomp_root` directory, as a kubelet reads its own), CPU/memory limits, emptyDir (medium
  Memory: a tmpfs sized by sizeLimit; otherwise a host directory, measured every second against its
  sizeLimit, and the pod evicted once past it, as a kubelet's eviction manager does every 10 s: Failed,
  reason `Evicted`, the kubelet's message) and PVC volumes, runtimeClassName (only the
  configured classes start),
  `activeDeadlineSeconds` (the container is killed and the pod fails with `DeadlineExceeded`, counted from
  the pod's start as a kubelet does). `hostUsers` is validated and stored without effect (the double's
  containers share Docker's user namespace).
- core/v1 persistentvolumeclaims (create, get, list, delete) backed by Docker named volumes (Bound at
  once, protected from deletion while a pod uses them); networking.k8s.io/v1 networkpolicies (create,
  get, list): a pod that a policy selects (`matchLabels`) for Egress keeps a network as on a cluster
  (`pod_network`): a pod sandbox container holds its namespace, with `eth0`, an address, a default route
  and the cluster DNS server in `/etc/resolv.conf`, and everything it sends is dropped on the node side of
  its veth pair, so connections out time out as under a CNI that enforces the policy; other pods get the
  host network.
- With `agent_sandbox=True`, the agent-sandbox CRDs (v1beta1 `SandboxTemplate`, `SandboxWarmPool`,
  `SandboxClaim`, `Sandbox`: create, get, list, watch, delete) and what their controllers and the garbage
  collector do with them (`agent_sandbox.py`, which cites the published definitions and says how it differs);
  without it, they are not served (404, as on a cluster without the CRDs).

Exec behaves like the kubelet: v5 clients end stdin with `close_channel(0)`; v4 has no end-of-stdin
signal (an empty stdin frame is a zero-byte write), so stdin ends only when the client disconnects;
and a process still running when the client disconnects gets EOF on stdin but is not killed. A
command that cannot start gives an `InternalError` status, as on a real cluster (the client's
`returncode` then raises). A deleted pod's object goes at once and its container in the background.

What it deliberately does not serve, and how it answers:

- 404 NotFound: discovery of the core group (`/api`), namespaces, `pods/log`, any other resource.
- 405 MethodNotAllowed: delete collection, update and patch, deleting a network policy.
- 422 Invalid: `generateName`, init containers, multi-container pods, volume
  types other than emptyDir and persistentVolumeClaim, container `stdin`/`tty`, network policy rules
  and `matchExpressions`, and graceful deletion (a grace period other than 0).
- 400 BadRequest: other selector forms and field labels; exec with `tty` or over older protocols.
- `CreateContainerConfigError` (the pod stays Pending): `$(VAR)` references (not expanded),
  `valueFrom`/`envFrom`, Localhost seccomp profiles missing from the node, `subPath` mounts.

Not modelled: scheduling and nodes (one pretend node; pods bind at once), pod networking beyond the
deny-all case above (no `status.podIP`, services or a DNS server; a denied pod's resolver gives up after
one second per query, `timeout:1 attempts:1`, where a cluster's default resolver waits tens of seconds),
admission (no ServiceAccount token volume, no Pod Security, no quota, runtime classes are not API objects),
image pulls (images must exist locally), container restarts and probes. Other pod fields (tolerations,
nodeSelector, hostname, AppArmor and SELinux options, ...) are stored and echoed back without effect; a
container's hostname is its pod's name.

How tests use it::

    from tests.support.k8s_double import KubeApiDouble

    @pytest.fixture(scope="session")
    def kube_double(docker_client):
        KubeApiDouble.remove_leftovers(docker_client)  # what a killed earlier run left behind
        with KubeApiDouble(docker_client=docker_client, runtime_classes=("gvisor",)) as double:
            yield double  # stop() force-removes every container and volume it made

    def test_backend(kube_double, tmp_path):
        kubeconfig = kube_double.write_kubeconfig(tmp_path / "kubeconfig")
        api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        ...  # or Settings(backend="kubernetes", kubeconfig=kubeconfig)

`tests/support/k8s_double/tests/` has fixtures (`conftest.py`) and helpers (`pods.py`) to copy from.
"""

from .server import KubeApiDouble

__all__ = ("KubeApiDouble",)
