"""TGI's plans: modelled from its warm-up source, never checked against a log, and each plan says so."""

from __future__ import annotations

from tests.conftest import run_json


def test_every_tgi_plan_says_it_is_not_calibrated(runner):
    g = run_json(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "8192", "--gpu", "L4",
                 "--engine", "tgi")["gpus"][0]
    assert g["calibration"]["in_range"] is False and g["calibration"]["error_band"] == "unknown"
    assert any(n.startswith("not calibrated: no TGI start-up log") for n in g["notes"])
