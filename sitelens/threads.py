"""How many CPU threads torch uses when the command line is not told (``--threads``).

torch's own default is one thread per core. On a machine that other work shares, that
oversubscribes the cores: torch's threads wait on each other while the other job holds a core,
and a run slows by far more than the share it lost (``benchmarks/threads.py`` measures the default,
one thread and the core count, on a quiet machine and beside one busy process:
``benchmarks/results/threads.md``). The default here takes the cores this process may run on and
leaves out the ones busy with other work now, keeping at least one.

"Busy now" is measured, not averaged: the share of time each usable core was not idle over a
short window (``/proc/stat``, :data:`WINDOW` seconds, this process asleep meanwhile), summed and
rounded. The 1-minute load average lags by a minute, so it counts a run that just ended (even a
previous run of this very command) as busy; it is used only where ``/proc/stat`` is missing.
Standard library only: ``--help`` states the rule without importing torch.
"""

from __future__ import annotations

import math
import os
import time

WINDOW = 0.2  # seconds of /proc/stat sampling (a one-off cost at start-up)


def usable_cores() -> set[int] | int:
    """The cores this process may run on: their ids where the OS says (CPU affinity), else a count."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0)) or 1
    return max(1, os.cpu_count() or 1)


def _idle_and_total(cores: set[int]) -> tuple[int, int] | None:
    """Idle and total jiffies summed over ``cores`` (``/proc/stat``'s per-core lines), else None."""
    try:
        lines = open("/proc/stat", encoding="ascii").read().splitlines()
    except OSError:
        return None
    idle = total = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            values = [int(x) for x in fields[:8]]
            idle += values[3] + values[4]  # idle + iowait
            total += sum(values)
    return (idle, total) if total else None


def busy_cores(window: float = WINDOW) -> int:
    """How many of the usable cores other work keeps busy now (rounded; 0 where unmeasurable)."""
    cores = usable_cores()
    if isinstance(cores, set) and (first := _idle_and_total(cores)) is not None:
        time.sleep(window)
        second = _idle_and_total(cores)
        if second is not None and second[1] > first[1]:
            busy = 1 - (second[0] - first[0]) / (second[1] - first[1])  # share of the cores' time
            return round(max(0.0, busy) * len(cores))
    try:
        return math.floor(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def default_threads() -> int:
    """The usable cores minus :func:`busy_cores`, at least 1."""
    cores = usable_cores()
    return max(1, (len(cores) if isinstance(cores, set) else cores) - busy_cores())


__all__ = ["WINDOW", "busy_cores", "default_threads", "usable_cores"]
