"""scripts/detection_schedule.py on the tiny checkpoint: every schedule steps the same frames, the boxes come on
the frames its N says (the detect prompt decoded there and nowhere else) and the plan every frame."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from test.support import REPO_ROOT as ROOT


def test_each_schedule_decodes_boxes_on_its_own_frames(tiny_checkpoint, tmp_path):
    out = tmp_path / "schedule.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "detection_schedule.py"), "--model",
                           str(tiny_checkpoint), "--frames", "3", "--first", "0", "--every", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["schedules"]
    assert list(rows) == ["plan", "both/1", "both/2"] and result["frames"] == 3
    assert all(len(r["ms"]) == 3 and min(r["ms"]) > 0 for r in rows.values())
    # detection decodes: none planning alone, every frame batched, frames 1 and 3 of 3 at N = 2
    assert [len(rows[name]["tokens"]) for name in rows] == [0, 3, 2]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("detection schedule:") and [line.split()[0] for line in lines[2:]] == list(rows)
    assert lines[2].split()[2] == "1.00"                              # planning alone is the reference
