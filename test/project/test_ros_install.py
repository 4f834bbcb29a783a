"""docs/install.md's "Install on a ROS 2 distribution", followed step by step where this machine can.

There is no ROS distribution here: the set-up's ``.venv`` (the ROS 2 Kilted wheels from PyPI,
colcon, ament_cmake_pytest) plays its part: its ``bin/`` first on ``PATH``, ``VIRTUAL_ENV`` and
``AMENT_PREFIX_PATH`` set, as ``source /opt/ros/<distro>/setup.bash`` plus ``source
venv/bin/activate`` would. Every command line of the document's block is either run here, taken
from the document itself (``COMMANDS_RUN_HERE``), or named with the reason it cannot run here
(``COMMANDS_NOT_RUN_HERE``); a line in neither fails ``test_every_readme_line_is_followed``.

Run: ``python -m colcon build`` in both modes, each in its own workspace whose ``src/`` holds a
copy of the checkout's files (CMake refuses include paths inside its source tree, and ``.venv``
lives inside the checkout); ``source install/setup.bash`` and nothing else; the document's
``ros2 run`` line as the executable ``ros2 run`` would start, answering a camera frame with a
trajectory over DDS, with its modules and message libraries from the workspace's ``install/``
(not the checkout's editable install); the controller and the localization executables;
``colcon test`` + ``colcon test-result``; the pip step with each distribution's constraints, as a
``pip install --dry-run`` for that distribution's Python version and platform (PyPI is reachable
from CI).
"""
from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from test.support import REPO_ROOT as ROOT

rclpy = pytest.importorskip("rclpy", reason="needs the ROS 2 wheels (bash scripts/setup.sh)")

from std_msgs.msg import String  # noqa: E402

from wam_diff2_ros.msg import PlannerStatus  # noqa: E402
from wam_diff2_ros.planner.launching import demo_model  # noqa: E402
from test.support.ros_helpers import Probe, image_msg, unique_domain_id  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]
INSTALL_DOC = ROOT / "docs" / "install.md"
VENV = ROOT / ".venv"
PACKAGE = "wam_diff2_ros"
MODES = ("copy", "symlink")
BUILD_TIMEOUT_S = 900
START_S = 180.0          # importing torch + transformers, loading and warming up the demo model
DISTRIBUTIONS = ("humble", "jazzy", "kilted")

# docs/install.md line (regular expression) -> the test here that runs it
COMMANDS_RUN_HERE = {
    r"mkdir -p ~/wam_ws/src && cd ~/wam_ws": "the workspaces fixture: a temporary folder with src/",
    r"source venv/bin/activate": "distro_env: the set-up's .venv (bin/ first on PATH, VIRTUAL_ENV)",
    r"python -m pip install -c src/wam_diff2_ros/constraints/\$ROS_DISTRO\.txt -r "
    r"src/wam_diff2_ros/requirements/python\.txt": "test_constraints_resolve (--dry-run, per distribution)",
    r"python -m colcon build --symlink-install": "the workspaces fixture (and without --symlink-install)",
    r"source install/setup\.bash": "installed_env",
    r"ros2 run wam_diff2_ros wam-diff2-planner .+": "test_planner_from_the_install_tree_answers_over_dds",
    r"python -m colcon test --packages-select wam_diff2_ros && python -m colcon test-result --verbose":
        "test_colcon_test_runs_the_fast_subset",
}
COMMANDS_NOT_RUN_HERE = {
    r"sudo apt install .+": "no ROS apt repository (the machines reach PyPI, Debian and npm only): colcon from "
                            "PyPI (requirements/colcon.txt) instead",
    r"sudo rosdep init; rosdep update": "rosdep cannot reach the rosdistro index from these machines",
    r"source /opt/ros/jazzy/setup\.bash": "no ROS distribution: the set-up's .venv plays it (distro_env)",
    r"git clone .+": "a copy of the checkout's files (git ls-files: the tree a clone of HEAD gives CI)",
    r"rosdep install .+": "rosdep cannot reach the rosdistro index: test_package_manifest.py checks package.xml "
                          "against every import instead",
    r"python3 -m venv --system-site-packages venv && touch venv/COLCON_IGNORE":
        "the set-up's .venv is the distribution's Python here (a venv over it would not see its packages)",
    r"ros2 launch wam_diff2_ros planner\.launch\.py": "launch / launch_ros / ros2cli are not on PyPI: "
                                                      "test_launch_default_model_is_the_installed_demo_model",
}


# ----------------------------------------------------------------------------- the document's block
def readme_commands() -> list[str]:
    text = INSTALL_DOC.read_text()
    section = text[text.index("## Install on a ROS 2 distribution"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = []
    for line in block.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()          # trailing comments
        if command and not command.startswith("#"):
            lines.append(command)
    return lines


def readme_command(pattern: str) -> str:
    (line,) = [c for c in readme_commands() if re.fullmatch(pattern, c)]
    return line


def test_every_readme_line_is_followed():
    commands = readme_commands()
    patterns = {**COMMANDS_RUN_HERE, **COMMANDS_NOT_RUN_HERE}
    for command in commands:
        matching = [p for p in patterns if re.fullmatch(p, command)]
        assert len(matching) == 1, f"docs/install.md line {command!r} is neither run here nor said why not: {matching}"
    for pattern in patterns:
        assert any(re.fullmatch(pattern, c) for c in commands), f"no docs/install.md line matches {pattern!r} any more"
    assert len(commands) == len(patterns)


# ----------------------------------------------------------------------------- environments
def distro_env() -> dict[str, str]:
    """The distribution plus the activated venv, as the document's shell has them (nothing else)."""
    return {"HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "VIRTUAL_ENV": str(VENV),
            "PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin", "AMENT_PREFIX_PATH": str(VENV),
            "OMP_NUM_THREADS": "1", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}


def installed_env(ws: Path) -> dict[str, str]:
    """``source install/setup.bash`` on top of the venv's python3 (no distribution, no scripts/env.sh)."""
    base = {k: v for k, v in distro_env().items() if k not in ("AMENT_PREFIX_PATH", "VIRTUAL_ENV")}
    out = subprocess.run(["bash", "-c", f"source {shlex.quote(readme_command(r'source install/setup.bash').split()[1])}"
                          " && env -0"], cwd=ws, env=base, capture_output=True, timeout=60, check=True)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


def checkout_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True, timeout=60)
    return [f for f in out.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


def build(ws: Path, mode: str) -> float:
    src = ws / "src" / PACKAGE
    for rel in checkout_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    command = readme_command(r"python -m colcon build --symlink-install")
    if mode == "copy":
        command = command.replace(" --symlink-install", "")
    t0 = time.monotonic()
    with open(ws / "colcon_build.log", "w") as log:
        code = subprocess.run(["bash", "-c", command], cwd=ws, env=distro_env(), stdout=log,
                              stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S).returncode
    seconds = time.monotonic() - t0
    assert code == 0, f"{command} failed in {ws}:\n{(ws / 'colcon_build.log').read_text()[-6000:]}"
    return seconds


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory):
    """{mode: workspace} after ``python -m colcon build`` (copy) and ``--symlink-install``."""
    out, times = {}, {}
    for mode in MODES:
        ws = tmp_path_factory.mktemp(f"wam_ws_{mode}")
        (ws / "src").mkdir()
        times[mode] = build(ws, mode)
        out[mode] = ws
    print(f"colcon build: {', '.join(f'{m} {s:.0f} s' for m, s in times.items())}")
    return out


def prefix(ws: Path) -> Path:
    return ws / "install" / PACKAGE


def site_packages(ws: Path) -> Path:
    (site,) = (prefix(ws) / "lib").glob("python3.*/site-packages")
    return site


# ----------------------------------------------------------------------------- the build
@pytest.mark.parametrize("mode", MODES)
def test_colcon_build_installs_modules_messages_launch_config_and_models(workspaces, mode):
    ws = workspaces[mode]
    site, share = site_packages(ws), prefix(ws) / "share" / PACKAGE
    ours = site / PACKAGE
    # our modules beside the generated messages, and our __init__.py, not the generated empty one
    assert (ours / "msg" / "_trajectory.py").is_file() and (ours / "planner" / "node.py").is_file()
    assert (ours / "__init__.py").read_text() == (ROOT / PACKAGE / "__init__.py").read_text()
    assert (site / "wam_diff2_core" / "policy.py").is_file()
    assert list(ours.glob("wam_diff2_ros_s__rosidl_typesupport_c*.so"))
    for name in ("planner.launch.py", "carla_planner.launch.py", "bag_replay.launch.py", "leaderboard.launch.py",
                 "two_planners.launch.py"):
        assert (share / "launch" / name).is_file()
    assert (share / "config" / "planner.yaml").is_file() and (share / "config" / "controller.yaml").is_file()
    for model in ("wam-diff2-demo-b32", "wam-diff2-demo-ar"):
        assert (share / "models" / model / "model.safetensors").is_file()
    assert (share / "package.xml").is_file() and (share / "agents" / "wam_diff2_agent.py").is_file()
    for exe in ("wam-diff2", "wam-diff2-planner", "wam-diff2-controller", "wam-diff2-localization", "wam-diff2-ros"):
        assert os.access(prefix(ws) / "lib" / PACKAGE / exe, os.X_OK), exe
    module = ours / "planner" / "node.py"
    if mode == "symlink":      # links to the workspace's sources, not copies (and not the checkout)
        assert module.is_symlink() and module.resolve() == (ws / "src" / PACKAGE / PACKAGE / "planner" / "node.py")
    else:
        assert not module.is_symlink()


IMPORTS = ["wam_diff2_ros", "wam_diff2_ros.msg", "wam_diff2_ros.entry_point", "wam_diff2_ros.planner.node",
           "wam_diff2_ros.planner.launching",
           "wam_diff2_ros.controller_node", "wam_diff2_ros.localization_node", "wam_diff2_core",
           "wam_diff2_core.policy"]


@pytest.mark.parametrize("mode", MODES)
def test_with_only_setup_bash_the_modules_and_share_come_from_the_install_tree(workspaces, mode, tmp_path):
    ws = workspaces[mode]
    code = ("import importlib, json, sys; from ament_index_python.packages import get_package_share_directory; "
            "from wam_diff2_ros.entry_point import ros_problem; "
            f"files = {{m: importlib.import_module(m).__file__ for m in {IMPORTS!r}}}; "
            f"print(json.dumps({{'files': files, 'share': get_package_share_directory({PACKAGE!r}), "
            "'problem': ros_problem(), 'python': sys.executable}))")
    out = subprocess.run(["python3", "-c", code], cwd=tmp_path, env=installed_env(ws), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["problem"] is None
    assert Path(found["python"]).parent == VENV / "bin"
    for module, file in found["files"].items():
        assert Path(file).is_relative_to(site_packages(ws)), (module, file)
        assert not Path(file).resolve().is_relative_to(ROOT), (module, file)      # not the checkout
    share = Path(found["share"])
    assert share == prefix(ws) / "share" / PACKAGE
    assert {p.name for p in (share / "launch").glob("*.launch.py")} >= {"planner.launch.py", "leaderboard.launch.py"}


def launch_default(launch_file: Path, argument: str, share: str):
    """The default of a launch argument, evaluated with ``share`` the package's share folder: a
    DeclareLaunchArgument's default_value, or a keyword of declare_planner_arguments (planner/launching.py)."""
    tree = ast.parse(launch_file.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        default = None
        if ast.unparse(node.func) == "DeclareLaunchArgument" and node.args \
                and ast.literal_eval(node.args[0]) == argument:
            default = next(k.value for k in node.keywords if k.arg == "default_value")
        elif ast.unparse(node.func) == "declare_planner_arguments":
            default = next((k.value for k in node.keywords if k.arg == argument), None)
        if default is not None:
            return eval(compile(ast.Expression(default), str(launch_file), "eval"),
                        {"os": os, "share": share, "demo_model": demo_model})
    raise AssertionError(f"no {argument} argument in {launch_file}")


def test_launch_default_model_is_the_installed_demo_model(workspaces):
    ws = workspaces["copy"]
    share = prefix(ws) / "share" / PACKAGE
    launch_file = share / "launch" / "planner.launch.py"
    assert 'share = get_package_share_directory("wam_diff2_ros")' in launch_file.read_text()
    default = Path(launch_default(launch_file, "model_path", str(share)))
    assert default == share / "models" / "wam-diff2-demo-b32" and (default / "diffusion_config.json").is_file()
    # the document's ros2 run line loads the same model
    run_line = shlex.split(readme_command(r"ros2 run wam_diff2_ros wam-diff2-planner .+"))
    assert f"model_path:={default.relative_to(ws)}" in run_line


def test_installed_agent_finds_the_installed_demo_model_when_asked(workspaces, tmp_path):
    """TEAM_AGENT=share/wam_diff2_ros/agents/wam_diff2_agent.py (docs/carla.md) with WAM_DIFF2_MODEL_PATH=demo:
    its model_path() (run alone: the leaderboard's modules it imports are not here) finds and checks the demo
    model installed beside it."""
    ws = workspaces["copy"]
    agent = prefix(ws) / "share" / PACKAGE / "agents" / "wam_diff2_agent.py"
    code = ("import ast, sys; tree = ast.parse(open(sys.argv[1]).read()); "
            "keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and not "
            "str(getattr(n, 'module', '')).startswith('leaderboard') or isinstance(n, ast.Assign) and "
            "ast.unparse(n.targets[0]) == 'DEMO_MODEL' or isinstance(n, ast.FunctionDef) and n.name == 'model_path']; "
            "ns = {}; exec(compile(ast.Module(keep, []), sys.argv[1], 'exec'), ns); "
            "print(ns['model_path']({'WAM_DIFF2_MODEL_PATH': 'demo'}))")
    out = subprocess.run(["python3", "-c", code, str(agent)], cwd=tmp_path, env=installed_env(ws),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == prefix(ws) / "share" / PACKAGE / "models" / "wam-diff2-demo-b32"


# ----------------------------------------------------------------------------- running from install/
def installed_command(ws: Path, readme_line: str) -> list[str]:
    """A ``ros2 run PACKAGE EXECUTABLE ARGS`` line as what ros2 run starts: <prefix>/lib/PACKAGE/EXECUTABLE ARGS."""
    words = shlex.split(readme_line)
    assert words[:3] == ["ros2", "run", PACKAGE]
    return [str(prefix(ws) / "lib" / PACKAGE / words[3]), *words[4:]]


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(30.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10.0)


def mapped_files(pid: int) -> set[str]:
    return {line.split(maxsplit=5)[5] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(line.split(maxsplit=5)) == 6}


def test_planner_from_the_install_tree_answers_over_dds(workspaces, tmp_path):
    # the document's mode (--symlink-install); the copy mode's install tree runs the controller and
    # the localization node below and colcon test (one planner start: torch + the model cost ~30 s)
    mode = "symlink"
    ws = workspaces[mode]
    domain = unique_domain_id(6)
    env = dict(installed_env(ws), ROS_DOMAIN_ID=str(domain))
    cmd = installed_command(ws, readme_command(r"ros2 run wam_diff2_ros wam-diff2-planner .+"))
    cmd += ["-p", "diagnostics_period_s:=0.2", "-p", "image_timeout_s:=10.0"]
    log_path = tmp_path / "planner.log"
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ws, env=env, stdout=log, stderr=subprocess.STDOUT)
    probe = Probe("/wam_diff2_planner", context=context).start()
    try:
        ready = probe.wait_for(lambda: probe.with_status(PlannerStatus.READY) or proc.poll() is not None, START_S)
        assert proc.poll() is None and ready, log_path.read_text()
        assert probe.wait_for(lambda: probe.state() == "active", 30.0)
        # the running process loaded the message libraries of the workspace (install/, or for
        # --symlink-install the build/ files its links point to), not the checkout's
        libraries = {Path(f) for f in mapped_files(proc.pid) if "wam_diff2_ros" in Path(f).name}
        assert any(f.name.startswith("libwam_diff2_ros__rosidl_typesupport_fastrtps_c") for f in libraries), libraries
        assert all(f.is_relative_to(ws / ("install" if mode == "copy" else "")) for f in libraries), libraries
        assert not any(f.is_relative_to(ROOT) for f in libraries), libraries
        probe.command_pub.publish(String(data="straight"))
        stamp, answers = None, []
        for _ in range(10):          # the first frames may race discovery: resend until answered
            stamp = probe.now_ns()
            time.sleep(0.06)           # let the odometry stream pass the stamp
            probe.image_pub.publish(image_msg(stamp, encoding="bgra8"))
            answers = probe.wait_for(lambda: probe.with_stamp("trajectory", stamp), 20.0)
            if answers:
                break
        assert answers, log_path.read_text()
        assert answers[-1].header.frame_id == "ego_vehicle" and answers[-1].command == "straight"
        assert answers[-1].stats.tokens > 0            # the demo model decoded an answer
    finally:
        probe.stop()
        rclpy.shutdown(context=context)
        code = stop(proc)
    assert code == 0, log_path.read_text()
    text = log_path.read_text()
    assert "Traceback" not in text and "wam-diff2-demo-b32" in text, text


def test_controller_and_localization_start_from_the_install_tree(workspaces, tmp_path):
    ws = workspaces["copy"]
    domain = unique_domain_id(6)
    env = dict(installed_env(ws), ROS_DOMAIN_ID=str(domain))
    procs = {}
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    probe = Probe("/wam_diff2_planner", context=context).start()
    try:
        for node in ("controller", "localization"):
            cmd = installed_command(ws, f"ros2 run {PACKAGE} wam-diff2-{node} --ros-args -p diagnostics_period_s:=0.2")
            log = open(tmp_path / f"{node}.log", "w")
            procs[node] = (subprocess.Popen(cmd, cwd=ws, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        for node in procs:
            values = probe.wait_for(lambda: probe.diagnostic_values(f"wam_diff2_{node}: {node}"), 60.0)
            assert values, (tmp_path / f"{node}.log").read_text()
        # the installed controller's handshake: the distribution's environment has no carla_msgs, so no READY
        # but an ERROR naming why
        controller = probe.diagnostic_values("wam_diff2_controller: controller")
        assert controller["__level__"] == 2 and "carla_msgs is not importable" in controller["__message__"]
    finally:
        probe.stop()
        rclpy.shutdown(context=context)
        codes = {node: stop(proc) for node, (proc, _) in procs.items()}
        for _, log in procs.values():
            log.close()
    for node, code in codes.items():
        text = (tmp_path / f"{node}.log").read_text()
        assert code == 0 and "Traceback" not in text, text


def test_colcon_test_runs_the_fast_subset(workspaces):
    ws = workspaces["copy"]
    command = readme_command(r"python -m colcon test .+")
    out = subprocess.run(["bash", "-c", command], cwd=ws, env=distro_env(), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    results = sorted((ws / "build" / PACKAGE / "test_results" / PACKAGE).glob("*.xunit.xml"))
    assert [r.name.split(".")[0] for r in results] == ["test_package_manifest", "test_ros_units"]
    for result in results:
        suite = ET.parse(result).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        assert int(suite.get("tests")) > 0 and suite.get("failures") == "0" and suite.get("errors") == "0", result
    assert re.search(r"Summary: (\d+) tests, 0 errors, 0 failures", out.stdout), out.stdout[-2000:]


# ----------------------------------------------------------------------------- the pip step
def constraints_platform(distro: str) -> tuple[str, int]:
    """(Python version, glibc minor) from the first line of constraints/<distro>.txt."""
    header = (ROOT / "constraints" / f"{distro}.txt").read_text().splitlines()[0]
    match = re.search(r"Python (3\.\d+), glibc 2\.(\d+)", header)
    assert match, header
    return match.group(1), int(match.group(2))


def dry_run(distro: str, report: Path) -> subprocess.CompletedProcess:
    python, glibc = constraints_platform(distro)
    command = readme_command(r"python -m pip install -c .+").replace("$ROS_DISTRO", distro)
    command = command.replace("src/wam_diff2_ros/", f"{ROOT}/").replace("python -m pip", f"{sys.executable} -m pip")
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(glibc, 16, -1)] + ["manylinux2014_x86_64"]
    flags = ["--dry-run", "--ignore-installed", "--only-binary=:all:", "--python-version", python, "--quiet",
             "--report", str(report), *[a for p in platforms for a in ("--platform", p)]]
    return subprocess.run(shlex.split(command) + flags, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """The three distributions' dry runs at once (each waits on the network more than on the CPU)."""
    folder = tmp_path_factory.mktemp("pip_reports")
    with concurrent.futures.ThreadPoolExecutor(len(DISTRIBUTIONS)) as pool:
        futures = {d: pool.submit(dry_run, d, folder / f"{d}.json") for d in DISTRIBUTIONS}
        return {d: (f.result(), folder / f"{d}.json") for d, f in futures.items()}


@pytest.mark.parametrize("distro", DISTRIBUTIONS)
def test_constraints_resolve(dry_runs, distro, constraint_pins):
    out, report = dry_runs[distro]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    installed = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    pinned = constraint_pins(ROOT / "constraints" / f"{distro}.txt")
    wanted = {re.split(r"[<>=!~ ]", line.strip())[0].lower() for line in (ROOT / "requirements" / "python.txt")
              .read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert wanted <= set(pinned), f"constraints/{distro}.txt pins no exact version of {sorted(wanted - set(pinned))}"
    for name, version in pinned.items():
        assert installed.get(name) == version, (name, version, installed.get(name))
    assert int(pinned["numpy"].split(".")[0]) < 2            # the distributions' extensions are numpy-1 builds
