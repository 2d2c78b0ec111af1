"""The memory checks of the engine and hostile tiers measure their own window, not the process's lifetime peak."""

from __future__ import annotations

from tests.support.memory import RssWindow

_MIB = 1024**2


def _touch(size: int) -> bytearray:
    block = bytearray(size)
    block[::4096] = b"x" * len(block[::4096])  # resident, not only reserved
    return block


def test_growth_under_an_earlier_peak_is_seen() -> None:
    earlier = _touch(160 * _MIB)  # an earlier test's peak, which ru_maxrss would keep for the rest of the run
    del earlier
    window = RssWindow()
    held = _touch(64 * _MIB)
    assert window.growth() >= 60 * _MIB
    del held


def test_a_quiet_window_reads_near_zero_after_a_peak() -> None:
    spike = _touch(64 * _MIB)
    del spike
    window = RssWindow()
    assert window.growth() < 16 * _MIB
