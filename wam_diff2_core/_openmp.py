"""torch's intra-op threads sleep instead of spinning while they wait.

torch's CPU wheels run their intra-op threads (ATen, MKL, oneDNN) on GNU OpenMP, whose idle threads
spin 300,000 times before they sleep. On cores other processes share (a vehicle computer's always
are) the spinning threads take the cores the work needs. ``GOMP_SPINCOUNT=0`` (what
``OMP_WAIT_POLICY=PASSIVE`` sets) makes a waiting thread sleep at once, at the price of a wake-up per
parallel region when the cores are free. Measured figures and the shorter spins tried: docs/reliability.md
(``scripts/contention_bench.py``).

libgomp reads its environment once, when torch loads it, so the spin count is set here, on the first
import of the package, when torch is not imported yet and the user set neither ``OMP_WAIT_POLICY``
nor ``GOMP_SPINCOUNT`` (theirs win: ``GOMP_SPINCOUNT=300000`` is torch's own behaviour, for cores
nobody shares). Every entry point imports this package before torch (``test/core/test_openmp.py``).
"""
from __future__ import annotations

import os
import sys

LIBGOMP_DEFAULT_SPIN = 300_000          # what libgomp spins when nobody chose (torch on its own)
SPIN_COUNT = 0                          # this package's default
USER_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def passive_openmp_by_default() -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` unless torch is loaded or the user chose; whether it was set."""
    if "torch" in sys.modules or any(name in os.environ for name in USER_CHOICES):
        return False
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return True


def wait_policy() -> str:
    """How this process's OpenMP threads wait, for the log: the variables that decide it, or the default."""
    chosen = [f"{name}={os.environ[name]}" for name in USER_CHOICES if name in os.environ]
    return ", ".join(chosen) or "libgomp's default spin (torch was imported before wam_diff2_core)"
