"""How many CPU threads torch uses when the command line is not told (``--threads``).

torch's own default is one thread per core. On a machine that other work shares, that
oversubscribes the cores: torch's threads wait on each other while the other job holds a core,
and a run slows by far more than the share it lost (``benchmarks/threads.py`` measures the default,
one thread and the core count, on a quiet machine and beside one busy process:
``benchmarks/results/threads.md``). The default here takes the cores this process may run on and
leaves out the ones the 1-minute load average says are busy, keeping at least one. In a container
the load average is the host's, which can only make the default smaller (never oversubscribed).
Standard library only: ``--help`` states the value without importing torch.
"""

from __future__ import annotations

import math
import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def busy_cores() -> int:
    """Cores busy with other work now: the 1-minute load average, rounded down (0 where the OS has
    none)."""
    try:
        return math.floor(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def default_threads() -> int:
    """:func:`usable_cores` minus :func:`busy_cores`, at least 1."""
    return max(1, usable_cores() - busy_cores())


__all__ = ["busy_cores", "default_threads", "usable_cores"]
