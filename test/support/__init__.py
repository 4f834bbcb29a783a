"""Helpers the tests import by their package path (``from test.support.ros_helpers import Probe``): plain
functions and classes. Fixtures are not here: they live in the conftest.py files, which pytest finds itself."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root: where the tests find config/, docs/, models/, scripts/ and the README."""
