"""The scoring protocol (wam_diff2_core/sim/protocol.py): the one place the sets' seeds live."""
from __future__ import annotations

import subprocess
import sys

import pytest

from wam_diff2_core.sim.protocol import REPORT, SELECTION, check_training_route_seed, held_out_route_seeds
from wam_diff2_core.sim.route_runs import ClosedLoopSettings


def test_the_shell_form_is_what_score_demo_evaluates():
    script = ('eval "$(' + sys.executable + ' -m wam_diff2_core.sim.protocol --shell report)"; '
              'printf "%s|" "$data" "$samples" "$every" "$route_seeds" "$routes" "${#synth[@]}" "${synth[@]}"')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split("|")
    assert out[:6] == ["runs/report_set", "runs/report_set/train.json", "5", "8001 8002", "10", str(len(REPORT.synth))]
    assert out[6:-1] == list(REPORT.synth) and "8000" in out[6:-1]


def test_held_out_route_seeds_refuse_training_labels():
    assert held_out_route_seeds() == {2000, 2001, 2002, 8001, 8002}
    assert ClosedLoopSettings().seed == SELECTION.route_seeds[0]        # the default routes are for choosing
    for seed in (2001, 8002):
        with pytest.raises(ValueError, match=f"route seed {seed} belongs to the"):
            check_training_route_seed(seed)
    check_training_route_seed(5000)


def test_closed_loop_expert_labels_refuse_a_report_seed(tmp_path, capsys):
    from wam_diff2_core.cli import main

    out = tmp_path / "labels"
    assert main(["closed-loop", "--oracle", "--expert-labels", "--seed", "8001", "--routes", "1",
                 "--out", str(out)]) == 2
    assert "--expert-labels: route seed 8001 belongs to the report set" in capsys.readouterr().err
    assert not out.exists()
