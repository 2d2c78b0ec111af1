"""The egress proxy: a sandbox's only way out, where it has one.

A sandbox that may reach the network (a library installer, a session given an allowlist) still has no
route: its network namespace holds only loopback. A relay inside it (runners/egress_forward.pl) listens on
that loopback as the proxy address and carries each connection over its own stdout and stdin, the stream the
server already holds for it, to a tunnel (tunnel.py) that hands the connection to the sandbox's proxy in this
process (proxy.py). The proxy allows host names from the sandbox's allowlist (CONNECT by name, no TLS
interception; plain HTTP by absolute URI), resolves them itself and refuses IP literals and names that resolve
to non-public addresses, unless the operator listed that exact host. The one exception to end-to-end TLS: a
session's secrets (bound.py), for whose hosts alone the proxy ends TLS with this server's CA (authority.py) to
put each value at its bound place (substitution.py).

One transport for every engine. Docker, Podman, Kubernetes, bubblewrap and NsJail all carry egress through the
tunnel: nothing of the server's filesystem is mounted into a sandbox, so an engine in another VM or machine
(Docker Desktop, Colima, a Podman machine, a remote DOCKER_HOST) works as a local one does, and no socket file
or port exists on the host for another local user to connect to (nor an AF_UNIX server, which Windows lacks).
Mounting the proxy's UNIX socket into local sandboxes is faster per byte, but it would be a second path to
test and to secure, and speed does not ask for it: measured with benchmarks/egress_transport.py on this
project's 2-core machine, the tunnel carries 50-100 MiB/s into a sandbox (the socket mount: 300-670 MiB/s),
more than a registry download reaches, and a library install of about 7 MB from the public registry takes
8-11 s either way (Docker 11.0 s against 8.6 s; bubblewrap and Podman the same within noise).

This module imports nothing: importing a part (`egress.policy`, `egress.proxy`...) loads that part only.
"""
