"""The README's layout table matches the tree: every path it names exists, every top-level folder of
the checkout and every room of the two Python packages is in it."""
from __future__ import annotations

import re
import subprocess

import pytest

from test.support import REPO_ROOT as ROOT



def layout_rows() -> list[tuple[list[str], str]]:
    """[(paths of the first column, the row)] of the README's ``## Layout`` table."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout\n"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [(re.findall(r"`([^`]+)`", row.split(" | ")[0]), row) for row in rows]


def rooms(package: str) -> list[str]:
    """The modules and sub-packages directly in ``package`` (as paths)."""
    return sorted(f"{package}/{p.name}" + ("/" if p.is_dir() else "") for p in (ROOT / package).iterdir()
                  if (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
                  or (p.is_dir() and (p / "__init__.py").is_file()))


def test_every_path_the_layout_names_exists():
    paths = [path for firsts, _ in layout_rows() for path in firsts]
    assert len(paths) > 30
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README layout names paths that do not exist: {missing}"


def test_every_room_of_the_core_has_a_row_and_every_ros_room_is_named():
    named = {path for firsts, _ in layout_rows() for path in firsts}
    assert [r for r in rooms("wam_diff2_core") if r not in named] == []
    text = " ".join(row for _, row in layout_rows())
    assert [r for r in rooms("wam_diff2_ros") if f"`{r.split('/', 1)[1].rstrip('/')}" not in text
            and f"`{r}`" not in text] == []


def test_every_top_level_folder_of_the_checkout_is_in_the_layout():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an installed copy): the tracked folders are unknown")
    folders = sorted({f.split("/")[0] for f in files if "/" in f and not f.startswith(".")})
    named = {path.split("/")[0] for firsts, _ in layout_rows() for path in firsts}
    assert [f for f in folders if f not in named] == []


def test_every_package_folder_has_a_readme():
    packages = [p.parent for p in ROOT.glob("wam_diff2_*/**/__init__.py") if "__pycache__" not in p.parts]
    assert [str(p.relative_to(ROOT)) for p in packages if not (p / "README.md").is_file()] == []
