"""Helpers the tests import by their package path (``from test.support.ros_helpers import Probe``): plain
functions and classes. Fixtures are not here: they live in the conftest.py files, which pytest finds itself."""
from __future__ import annotations

import signal
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root: where the tests find config/, docs/, models/, scripts/ and the README."""


def default_sigint() -> None:
    """``Popen(preexec_fn=default_sigint)``: the child starts with SIGINT's default action. A test run started
    in the background by a shell without job control (``cmd &`` in a script) inherits SIGINT ignored, and
    Python then never turns a SIGINT into KeyboardInterrupt: the Ctrl-C tests would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
