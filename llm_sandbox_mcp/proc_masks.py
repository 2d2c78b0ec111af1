"""What of /proc and /sys sandboxed code must not read or write: what Docker and Podman hide by default (their
union, and /proc/interrupts, whose counts are a known timing side channel), for every sandbox whatever made it.

Docker and Podman mask these themselves in the containers they make; a zygote template's children mask them
again in their own mount namespace (`run/zygote/containers.py`), and bubblewrap and NsJail mask what their
fresh /proc has of them.
"""

# Files go behind /dev/null, directories behind an empty read-only tmpfs.
MASKED = (
    "/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/sched_debug", "/proc/scsi", "/proc/timer_list", "/proc/timer_stats", "/sys/dev/block",
    "/sys/devices/virtual/powercap", "/sys/firmware", "/sys/fs/selinux",
)  # fmt: skip
# Of those, what is in /proc (the daemonless engines mount no /sys).
PROC_MASKED = tuple(path for path in MASKED if path.startswith("/proc/"))
# Made read-only.
READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
