"""How much physical memory this host has (what the default memory budget of all sandboxes is a share of), and
how much of it is available now."""

from __future__ import annotations

import os
import sys

if sys.platform == "win32":
    import ctypes
    from ctypes import wintypes

    class _MemoryStatus(ctypes.Structure):
        # MEMORYSTATUSEX, for GlobalMemoryStatusEx.
        _fields_ = (
            ("dwLength", wintypes.DWORD),
            ("dwMemoryLoad", wintypes.DWORD),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
        )

    def physical_memory() -> int:
        """Bytes of physical memory (GlobalMemoryStatusEx)."""
        status = _MemoryStatus()
        status.dwLength = ctypes.sizeof(_MemoryStatus)
        if not ctypes.WinDLL("kernel32", use_last_error=True).GlobalMemoryStatusEx(ctypes.byref(status)):
            raise OSError(ctypes.get_last_error(), "GlobalMemoryStatusEx failed")
        return int(status.ullTotalPhys)

else:

    def physical_memory() -> int:
        """Bytes of physical memory (sysconf: Linux and macOS both have SC_PHYS_PAGES)."""
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int | None:
    """Bytes the kernel estimates can be given to new work without swapping (Linux's MemAvailable), or None
    where the host does not say (no /proc/meminfo: macOS, Windows)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
