"""Every entry point makes torch's OpenMP threads sleep, not spin, while they wait (wam_diff2_core/_openmp.py),
as the OpenMP runtime torch loads reports it (OMP_DISPLAY_ENV: libgomp shows its default as PASSIVE too, with
300,000 spins before a thread sleeps; the spin count tells them apart); a user's own choice is left alone."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from test.support import REPO_ROOT as ROOT

ENTRY_MODULES = sorted({m for m in re.findall(r'"[\w-]+=([\w.]+):\w+"', (ROOT / "setup.py").read_text())})


def _runtime_settings(code: str, **env: str) -> dict[str, str]:
    """The OpenMP settings libgomp reports when ``code`` (which loads torch) runs in a fresh interpreter."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, "OMP_DISPLAY_ENV": "VERBOSE", **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(re.findall(r"^\s+(\w+) = '([^']*)'", proc.stderr, re.M))


def test_the_entry_points_are_the_packages_console_scripts():
    assert "wam_diff2_core.cli" in ENTRY_MODULES and "wam_diff2_ros.entry_point" in ENTRY_MODULES
    assert len(ENTRY_MODULES) >= 3


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_every_entry_point_loads_torch_with_passive_waiting_threads(module):
    settings = _runtime_settings(f"import {module}, torch; torch.ones(4).sum()")
    assert settings["OMP_WAIT_POLICY"] == "PASSIVE" and settings["GOMP_SPINCOUNT"] == "0", settings


def test_a_users_own_choice_and_torch_loaded_first_are_left_alone():
    settings = _runtime_settings("import wam_diff2_core, torch", GOMP_SPINCOUNT="300000")
    assert settings["GOMP_SPINCOUNT"] == "300000"
    settings = _runtime_settings("import torch, wam_diff2_core, os; assert 'OMP_WAIT_POLICY' not in os.environ; "
                                 "from wam_diff2_core._openmp import wait_policy; assert 'spin' in wait_policy()")
    assert settings["GOMP_SPINCOUNT"] == "300000"


def test_torchaos_start_up_notice_is_dropped_and_nothing_else_of_its_logger():
    """Importing torchao (as transformers does when it is installed) logs two pytree notices in torch 2.14;
    the package's filter drops exactly those and lets the logger's other records through."""
    import logging

    import wam_diff2_core  # noqa: F401  (installs the filter)
    from wam_diff2_core._log_filters import ENUM_NOTICE, PYTREE_LOGGER

    logger = logging.getLogger(PYTREE_LOGGER)
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    handler = Keep()
    logger.addHandler(handler)
    try:
        logger.warning("<enum 'KernelPreference'> %s as an opaque value type.", ENUM_NOTICE)
        logger.warning("another pytree warning")
    finally:
        logger.removeHandler(handler)
    assert seen == ["another pytree warning"]
