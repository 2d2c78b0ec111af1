"""When a process started, as the operating system records it: what tells a live server from a dead one whose
pid was handed to another process.

Linux reads `/proc/<pid>/stat`; macOS asks the kernel with `sysctl(KERN_PROC_PID)`; Windows opens the process
and reads its creation time. Each answers a string of digits for a live process, "" for one that is gone (or
a zombie, which is gone but not reaped), and None where it cannot tell (no permission, another system, or a
kernel answer that does not look as expected): callers then judge nothing dead.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _linux(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()
    return "" if fields[0] == "Z" else fields[19]


if sys.platform == "darwin":
    import ctypes
    import struct

    # <sys/sysctl.h>: CTL_KERN, KERN_PROC, KERN_PROC_PID; struct kinfo_proc is 648 bytes on 64-bit macOS and
    # begins with struct extern_proc: p_starttime (timeval: int64 seconds, int32 microseconds) at 0, p_stat
    # (char) at 36, p_pid (int32) at 40. SZOMB is 5.
    _MIB = (1, 14, 1)
    _KINFO_PROC_SIZE = 648
    _SZOMB = 5
    _libc = ctypes.CDLL(None, use_errno=True)

    def _macos(pid: int) -> str | None:
        mib = (ctypes.c_int * 4)(*_MIB, pid)
        buffer = ctypes.create_string_buffer(_KINFO_PROC_SIZE)
        size = ctypes.c_size_t(_KINFO_PROC_SIZE)
        if _libc.sysctl(mib, 4, buffer, ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
            return None
        if size.value == 0:
            return ""  # no such process
        raw = buffer.raw
        seconds, microseconds = struct.unpack_from("=qi", raw, 0)
        (found_pid,) = struct.unpack_from("=i", raw, 40)
        if size.value != _KINFO_PROC_SIZE or found_pid != pid:
            return None  # not the layout assumed above: say nothing rather than something wrong
        return "" if raw[36] == _SZOMB else f"{seconds}{microseconds:06d}"

elif sys.platform == "win32":
    import ctypes
    from ctypes import wintypes

    _PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
    _STILL_ACTIVE = 259
    _ERROR_INVALID_PARAMETER = 87  # what OpenProcess says for a pid no process has
    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _kernel32.OpenProcess.restype = wintypes.HANDLE
    _kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)

    def _windows(pid: int) -> str | None:
        handle = _kernel32.OpenProcess(_PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
        if not handle:
            return "" if ctypes.get_last_error() == _ERROR_INVALID_PARAMETER else None
        try:
            code = wintypes.DWORD()
            if not _kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
                return None
            if code.value != _STILL_ACTIVE:
                return ""  # exited; a handle someone still holds keeps its record
            created, exited, kernel, user = (wintypes.FILETIME() for _ in range(4))
            if not _kernel32.GetProcessTimes(
                handle, ctypes.byref(created), ctypes.byref(exited), ctypes.byref(kernel), ctypes.byref(user)
            ):
                return None
            return str(created.dwHighDateTime << 32 | created.dwLowDateTime)
        finally:
            _kernel32.CloseHandle(handle)


def process_start(pid: int) -> str | None:
    """The start time of process `pid` as digits, "" when no such process runs, None when this system cannot
    tell."""
    if sys.platform == "linux":
        return _linux(pid)
    if sys.platform == "darwin":
        return _macos(pid)
    if sys.platform == "win32":
        return _windows(pid)
    return None
