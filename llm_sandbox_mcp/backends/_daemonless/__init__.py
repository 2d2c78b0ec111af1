"""What the daemonless engines (bubblewrap, NsJail) share, so neither imports the other: the holder-based sandbox
(`sandbox.HostSandbox`), the host-side paths and directories (`host`), cgroups (`cgroup`), process pipes
(`pipes`) and the command-line parts both build on (`argv`). Linux only, like the engines.
"""
