"""ROS 2 on a Python without it: wheels unpacked onto a prefix (never installed), then ROS packages built into it
with plain CMake. What scripts/device_ros.sh does on the lent GPU image (no ROS, no registry).

    python scripts/ros_prefix.py unpack device_ros_wheels /tmp/ros      # then: . /tmp/ros/env.sh
    python scripts/ros_prefix.py build /tmp/ros . device_ros_wheels/src/ros_environment \\
        device_ros_wheels/src/carla_msgs device_ros_wheels/src/tf2_msgs

``unpack`` lays each wheel out as pip would install it into a virtual environment at the prefix: the wheel's
root and its ``.data/purelib|platlib`` into ``lib/pythonX.Y/site-packages``, ``.data/data`` into the prefix
itself (the ROS wheels' ``lib/``, ``share/``, ``include/``), ``.data/scripts`` into ``bin/``, keeping file modes.
It refuses a wheel built for another CPython. The ROS wheels' exported CMake targets name the wheel builder's
Python and numpy include folders (``/opt/python/cpXY-cpXY/...``); those are rewritten to this interpreter's in the
unpacked copies. It writes ``<prefix>/env.sh``, the variables a shell sources to use the prefix (the search paths,
Fast DDS as the RMW, discovery on this host only). ros-wheels-bootstrapper is skipped: it re-executes Python to
set LD_LIBRARY_PATH, which env.sh sets.

``build`` configures, builds and installs each package folder into the prefix with CMake (``-j`` the machine's
cores), a package after the ones among them it depends on (package.xml), the others in parallel; this checkout
(``.``) is configured with ``-DWAM_DIFF2_MSGS_ONLY=ON``, its messages only, as scripts/setup.sh builds them, and the
generated ``wam_diff2_ros/__init__.py`` is removed so that the source package (first on PYTHONPATH) extends its
path to the generated ``wam_diff2_ros.msg``. Logs in ``<prefix>/build/<package>.log``; one line per package.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIPPED_WHEELS = ("ros_wheels_bootstrapper-",)
# the wheel builder's include folders, as the ROS wheels' exported CMake files name them
BUILDER_PYTHON = re.compile(r"/opt/python/cp\d+-cp\d+/include/python\d+\.\d+")
BUILDER_NUMPY = re.compile(r"/opt/python/cp\d+-cp\d+/lib/python\d+\.\d+/site-packages/numpy/_core/include")
DEPENDENCY_TAGS = ("depend", "build_depend", "buildtool_depend")


def python_dir() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / python_dir() / "site-packages"


def check_tag(wheel: Path) -> None:
    """A wheel for this CPython (cpXY) or pure Python; otherwise SystemExit naming it."""
    tags = wheel.stem.split("-")[-3:]               # python tag, abi tag, platform tag
    ours = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if tags[2] == "any" or tags[0] == ours:
        return
    raise SystemExit(f"ros_prefix: {wheel.name} is for {tags[0]}, not this Python ({ours}); download the set for "
                     f"it (PY_VERSION={sys.version_info.major}.{sys.version_info.minor} scripts/device_ros_wheels.sh)")


def unpack_wheel(wheel: Path, prefix: Path) -> int:
    """Lay ``wheel`` out under ``prefix`` as pip installs it into a venv there; the files written."""
    site = site_packages(prefix)
    written = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            name = info.filename
            top, _, rest = name.partition("/")
            if top.endswith(".data"):
                scheme, _, rest = rest.partition("/")
                target = {"data": prefix, "purelib": site, "platlib": site, "scripts": prefix / "bin",
                          "headers": prefix / "include"}[scheme] / rest
            else:
                target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(target, mode)
            written += 1
    return written


def point_cmake_at_this_python(prefix: Path) -> int:
    """Rewrite the builder's Python and numpy include folders in the prefix's CMake files; the files changed."""
    import numpy
    include, numpy_include = sysconfig.get_paths()["include"], numpy.get_include()
    changed = 0
    for path in (prefix / "share").rglob("*.cmake"):
        text = path.read_text()
        new = BUILDER_NUMPY.sub(numpy_include, BUILDER_PYTHON.sub(include, text))
        if new != text:
            path.write_text(new)
            changed += 1
    return changed


def env_script(prefix: Path) -> str:
    """The shell lines that put ``prefix`` on the search paths (sourced by scripts/device_ros.sh)."""
    site = site_packages(prefix)
    libs = ":".join(str(p) for p in sorted(site.glob("ros_*.libs")))       # the wheels' vendored libraries
    return "\n".join([
        f"# written by scripts/ros_prefix.py unpack: source this to use the ROS 2 prefix {prefix}",
        f'export AMENT_PREFIX_PATH="{prefix}${{AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}}"',
        f'export CMAKE_PREFIX_PATH="{prefix}${{CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}}"',
        f'export PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"',
        f'export LD_LIBRARY_PATH="{prefix}/lib{":" + libs if libs else ""}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
        f'export PATH="{prefix}/bin:$PATH"',
        "export RMW_IMPLEMENTATION=rmw_fastrtps_cpp ROS_VERSION=2 ROS_DISTRO=kilted ROS_PYTHON_VERSION=3",
        "export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST", ""])


def unpack(wheels: Path, prefix: Path) -> int:
    t0 = time.perf_counter()
    found = sorted(w for w in wheels.glob("*.whl") if not w.name.startswith(SKIPPED_WHEELS))
    if not found:
        raise SystemExit(f"ros_prefix: no wheels in {wheels} (scripts/device_ros_wheels.sh)")
    for wheel in found:
        check_tag(wheel)
    files = sum(unpack_wheel(wheel, prefix) for wheel in found)
    patched = point_cmake_at_this_python(prefix)
    (prefix / "env.sh").write_text(env_script(prefix))
    print(f"ros_prefix: {len(found)} wheels, {files} files unpacked onto {prefix} in {time.perf_counter() - t0:.1f} s; "
          f"{patched} CMake files pointed at this Python's include folders; source {prefix}/env.sh")
    return 0


def package_name(folder: Path) -> tuple[str, set[str]]:
    """(the package's name, the names it depends on at build time) from its package.xml."""
    root = ET.parse(folder / "package.xml").getroot()
    return root.findtext("name").strip(), {e.text.strip() for tag in DEPENDENCY_TAGS for e in root.iter(tag)}


def build_one(folder: Path, prefix: Path, jobs: int) -> tuple[str, float]:
    name, _ = package_name(folder)
    work = prefix / "build" / name
    shutil.rmtree(work, ignore_errors=True)
    src = folder
    options = []
    if folder.resolve() == REPO:
        # this package: its messages only, from a copy of its build files (as scripts/setup.sh: CMake refuses
        # include folders inside the source tree, where a venv or prefix may sit)
        src = work / "src"
        src.mkdir(parents=True)
        for part in ("CMakeLists.txt", "package.xml"):
            shutil.copy(REPO / part, src / part)
        shutil.copytree(REPO / "msg", src / "msg")
        options = ["-DWAM_DIFF2_MSGS_ONLY=ON"]
    log = prefix / "build" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    commands = [["cmake", "-S", str(src), "-B", str(work / "build"), f"-DCMAKE_INSTALL_PREFIX={prefix}",
                 f"-DCMAKE_PREFIX_PATH={prefix}", f"-DPython3_EXECUTABLE={sys.executable}",
                 f"-DCMAKE_INSTALL_RPATH={prefix}/lib", "-DBUILD_TESTING=OFF", *options],
                ["cmake", "--build", str(work / "build"), "--target", "install", "-j", str(jobs)]]
    env = {**os.environ, "AMENT_PREFIX_PATH": str(prefix), "ROS_VERSION": "2", "ROS_DISTRO_OVERRIDE": "kilted"}
    with log.open("w") as f:
        for cmd in commands:
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode != 0:
                tail = "\n".join(log.read_text().splitlines()[-30:])
                raise SystemExit(f"ros_prefix: {name}: {' '.join(cmd[:2])} failed (log {log}):\n{tail}")
    if options:
        (site_packages(prefix) / "wam_diff2_ros" / "__init__.py").unlink(missing_ok=True)
    return name, time.perf_counter() - t0


def build(prefix: Path, folders: list[Path]) -> int:
    t0 = time.perf_counter()
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():          # the messages' Python bindings are C extensions of this Python
        raise SystemExit(f"ros_prefix: {header} is missing: the messages' Python bindings cannot be built for "
                         f"{sys.executable} (install its development headers, e.g. python3-dev)")
    packages = {package_name(f)[0]: f for f in folders}
    waiting = {name: package_name(f)[1] & set(packages) for name, f in packages.items()}
    jobs = os.cpu_count() or 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(packages)) as pool:
        running: dict[concurrent.futures.Future, str] = {}
        while waiting or running:
            for name in [n for n, deps in waiting.items() if not deps]:
                del waiting[name]
                running[pool.submit(build_one, packages[name], prefix, jobs)] = name
            if not running:
                raise SystemExit(f"ros_prefix: a dependency cycle among {', '.join(waiting)}")
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                name, seconds = future.result()
                del running[future]
                for deps in waiting.values():
                    deps.discard(name)
                print(f"ros_prefix: built {name} in {seconds:.1f} s", flush=True)
    print(f"ros_prefix: {len(packages)} packages built into {prefix} in {time.perf_counter() - t0:.1f} s "
          f"({jobs} jobs each)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("unpack", help="unpack a folder of wheels onto a prefix and write its env.sh")
    u.add_argument("wheels", type=Path)
    u.add_argument("prefix", type=Path)
    b = sub.add_parser("build", help="build ROS package folders into a prefix with CMake (after sourcing env.sh)")
    b.add_argument("prefix", type=Path)
    b.add_argument("packages", type=Path, nargs="+", help="package folders (. = this checkout's messages)")
    args = p.parse_args(argv)
    if args.command == "unpack":
        return unpack(args.wheels, args.prefix.resolve())
    return build(args.prefix.resolve(), [f.resolve() for f in args.packages])


if __name__ == "__main__":
    sys.exit(main())
