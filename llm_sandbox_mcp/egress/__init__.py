"""The egress proxy: a sandbox's only way out, where it has one.

A sandbox that may reach the network (a library installer, a session given an allowlist) still has no
route: its network namespace holds only loopback. The server serves an HTTP(S) proxy on a UNIX socket
mounted into the sandbox, and a relay inside it (runners/egress_forward.pl) makes that socket a proxy
address on the sandbox's loopback. Where no socket can be mounted (Kubernetes pods), the relay carries its
connections over its own exec stream instead, to a tunnel (tunnel.py) that connects them to the socket.
The proxy allows host names from the sandbox's allowlist (CONNECT by name, no TLS interception; plain HTTP
by absolute URI), resolves them itself and refuses IP literals and names that resolve to non-public
addresses, unless the operator listed that exact host.
"""

from llm_sandbox_mcp.egress.policy import EgressPolicy, HostRule, Refusal
from llm_sandbox_mcp.egress.proxy import EgressListener, open_listener

__all__ = ["EgressListener", "EgressPolicy", "HostRule", "Refusal", "open_listener"]
