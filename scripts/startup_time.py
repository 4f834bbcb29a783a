"""How long the planner node takes to configure: a random tiny checkpoint and the demo model, on this CPU.

    . scripts/env.sh && python scripts/startup_time.py                     # both, warm-up on (the default)
    python scripts/startup_time.py --model models/wam-diff2-demo-b32 --threads 1

Configures a real ``PlannerNode`` (lifecycle configure: load, the fast-path check, the warm-up; both
start-up decodes at most ``wam_diff2_core.policy.STARTUP_BLOCKS`` blocks) and prints what it reports on
``/diagnostics``: ``configure_s`` and its parts (``load_s``, ``fast_path_check_s``, ``warmup_s``). The
random tiny checkpoint (``wam_diff2_core.model.tiny``, built into a temporary folder) never stops early:
before start-up was bounded its decodes ran the whole answer budget three times. Targets: the tiny
checkpoint <= 30 s, the demo model <= its load time + 5 s (docs/reliability.md, Start-up time).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_MODEL = REPO / "models" / "wam-diff2-demo-b32"


def configure_times(model_path: str, threads: int, domain_id: int) -> dict[str, float]:
    import rclpy
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from wam_diff2_ros.planner.node import PlannerNode

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id)
    node = PlannerNode("startup_time_planner", context=context, parameter_overrides=[
        Parameter("model_path", value=model_path), Parameter("device", value="cpu"),
        Parameter("autostart", value=False), Parameter("warmup", value=True),
        Parameter("engine.cpu_threads", value=threads)])
    try:
        if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            raise SystemExit(f"configure failed: {node.diagnostic_status().message}")
        values = {kv.key: kv.value for kv in node.diagnostic_status().values}
        return {k: float(values[k]) for k in ("configure_s", "load_s", "fast_path_check_s", "warmup_s")}
    finally:
        node.stop_worker()
        node.destroy_node()
        rclpy.shutdown(context=context)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="a checkpoint folder (repeatable); default: a random "
                        "tiny checkpoint and the demo model")
    parser.add_argument("--threads", type=int, default=1, help="engine.cpu_threads (default 1)")
    parser.add_argument("--domain-id", type=int, default=int(os.environ.get("ROS_DOMAIN_ID", "0")))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        models = args.model
        if not models:
            from wam_diff2_core.model.tiny import build_tiny_checkpoint
            models = [str(build_tiny_checkpoint(Path(tmp) / "tiny", seed=0)), str(DEMO_MODEL)]
        for model in models:
            label = "random tiny" if Path(model).parent == Path(tmp) else model
            t = configure_times(model, args.threads, args.domain_id)
            print(f"{label}: configure {t['configure_s']:.1f} s (load {t['load_s']:.1f} s, fast-path check "
                  f"{t['fast_path_check_s']:.1f} s, warm-up {t['warmup_s']:.1f} s; over load: "
                  f"{t['configure_s'] - t['load_s']:.1f} s), {args.threads} thread(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
