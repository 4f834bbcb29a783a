"""docs/install.md's "Install on a Jetson-class board (aarch64)", as far as a resolver can check it here.

No board is here: the pip step is resolved for the board's platform (manylinux aarch64 up to glibc 2.35,
Python 3.10) with ``pip install --dry-run --only-binary=:all:``, minus torch and torchvision, which are
JetPack's builds on the board (PyPI has none for JetPack's CUDA): nothing else may pull them in, or pip
would replace NVIDIA's torch. Every other requirement must resolve to the pinned version as a wheel for
aarch64 (or a pure-Python one). Skipped, with the reason, when PyPI cannot be reached (CI reaches it).
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import urllib.request

import pytest

from test.support import REPO_ROOT as ROOT

JETSON = ROOT / "constraints" / "jetson.txt"
JETPACK = {"torch", "torchvision"}            # NVIDIA's builds on the board: never pinned, never replaced


def required() -> dict[str, str]:
    """requirements/python.txt: {name: line}."""
    lines = [line.strip() for line in (ROOT / "requirements" / "python.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {re.split(r"[<>=!~ ]", line)[0].lower(): line for line in lines}


def readme_pip_step() -> str:
    text = (ROOT / "docs" / "install.md").read_text()
    section = text[text.index("## Install on a Jetson-class board"):]
    section = section.split("\n## ", 1)[0]
    lines = [line.split("#")[0].strip() for line in section.splitlines()
             if line.strip().startswith("python -m pip install -c constraints/jetson.txt")]
    assert len(lines) == 1, lines
    return lines[0]


def test_jetson_constraints_pin_everything_but_jetpacks_torch_as_humble_does(constraint_pins):
    jetson, humble = constraint_pins(JETSON), constraint_pins(ROOT / "constraints" / "humble.txt")
    assert set(jetson) == set(required()) - JETPACK              # torch / torchvision: JetPack's, unpinned
    assert {n: v for n, v in jetson.items() if humble.get(n) != v} == {}    # same Ubuntu 22.04, Python 3.10
    header = JETSON.read_text().splitlines()[0]
    assert "Python 3.10, glibc 2.35" in header and "Python 3.10, glibc 2.35" in (
        ROOT / "constraints" / "humble.txt").read_text().splitlines()[0]
    step = readme_pip_step()
    assert "-c jetpack-torch.txt" in step and "-r requirements/python.txt" in step


def _pypi_problem() -> str | None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/numpy/", timeout=10).close()
        return None
    except OSError as exc:
        return f"PyPI is not reachable from this machine ({exc}); CI resolves the aarch64 step"


@pytest.mark.slow
def test_jetson_pip_step_resolves_for_aarch64_without_touching_torch(tmp_path, constraint_pins):
    problem = _pypi_problem()
    if problem:
        pytest.skip(problem)
    wanted = tmp_path / "requirements.txt"             # requirements/python.txt without JetPack's two
    wanted.write_text("\n".join(line for name, line in required().items() if name not in JETPACK) + "\n")
    command = readme_pip_step().replace("-c jetpack-torch.txt", "").replace("-r requirements/python.txt",
                                                                             f"-r {wanted}")
    command = command.replace("constraints/jetson.txt", str(JETSON)).replace("python -m pip", f"{sys.executable} -m pip")
    report = tmp_path / "report.json"
    platforms = [f"manylinux_2_{n}_aarch64" for n in range(35, 16, -1)] + ["manylinux2014_aarch64"]
    flags = ["--dry-run", "--ignore-installed", "--only-binary=:all:", "--python-version", "3.10", "--quiet",
             "--report", str(report), *[a for p in platforms for a in ("--platform", p)]]
    out = subprocess.run(shlex.split(command) + flags, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    installed = {i["metadata"]["name"].lower(): (i["metadata"]["version"], i["download_info"]["url"].rsplit("/", 1)[-1])
                 for i in json.loads(report.read_text())["install"]}
    assert not JETPACK & set(installed), "something pulls torch in: pip would replace JetPack's build"
    assert not [n for n in installed if n.startswith(("nvidia-", "triton"))], sorted(installed)
    for name, version in constraint_pins(JETSON).items():
        assert installed[name][0] == version, (name, version, installed.get(name))
    wheels = [w for _, w in installed.values()]
    assert all(w.endswith(("-none-any.whl", "_aarch64.whl")) for w in wheels), wheels
