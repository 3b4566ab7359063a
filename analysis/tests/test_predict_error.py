"""The model's own error in scalestudy-predict's intervals: Student's quantile against its
tables, the extrapolation rule and the jackknife coverage on hand-made residuals, and on
the committed example the width of the 4096-GPU intervals and the coverage the report
prints."""
import json
import re
import math
from pathlib import Path

import pandas as pd
import pytest

from scalestudy_analysis.predict.cli import main
from scalestudy_analysis.predict.error import (ModelError, Residual, growth,
                                               student_quantile, widen)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpt2-small-strong-4xh200"
NETWORKS = ROOT / "experiments" / "networks"
# The one out-of-sample test of the model: a fresh 4xH200 sweep, fitted on 1 and 2 GPUs,
# predicted the 4-GPU step 17.5 % too long (ddp). An interval at 4096 GPUs that claims
# less spread than the model showed at N = 4 claims a precision it does not have.
OUT_OF_SAMPLE_MISS = 0.175


@pytest.mark.parametrize("probability, dof, expected", [
    (0.95, 1, 6.313752), (0.95, 6, 1.943180), (0.975, 3, 3.182446), (0.95, 1000, 1.644854)])
def test_student_quantile_matches_the_tables(probability, dof, expected):
    # Tables give 6 decimals; Simpson's rule on 4000 panels is far finer than that.
    assert student_quantile(probability, dof) == pytest.approx(expected, abs=2e-6)


def _residual(size, fit_sizes, error):
    return Residual("s", "leave one N out", size, fit_sizes, 1.0 + error, 1.0)


def test_model_error_scales_residuals_by_their_extrapolation():
    # e = ln(1.1) at x = 4 (g = 3) and ln(0.95) at x = 1 (g = 1).
    residuals = [_residual(8, [1, 2], 0.1), _residual(2, [1, 4], -0.05)]
    error = ModelError(residuals, 0.9)
    expected = math.sqrt(((math.log(1.1) / 3) ** 2 + math.log(0.95) ** 2) / 2)
    assert growth(4) == 3 and growth(0.5) == 1
    assert error.scale == pytest.approx(expected, rel=1e-12)
    assert error.quantile == pytest.approx(2.919986, abs=2e-6)      # t(0.95, 2 dof)
    assert error.half_width(1024) == pytest.approx(error.quantile * expected * 11, rel=1e-12)
    # Jackknife: each judged against the band of the other alone, at its own x.
    t1 = student_quantile(0.95, 1)
    assert error.covered == [abs(math.log(1.1)) <= t1 * abs(math.log(0.95)) * 3,
                             abs(math.log(0.95)) <= t1 * abs(math.log(1.1)) / 3]
    assert error.coverage() == (sum(error.covered), 2)
    assert not ModelError([], 0.9).known and ModelError([], 0.9).half_width(8) == 0.0


def test_widen_combines_in_quadrature_and_stays_positive():
    low, high = widen(100.0, 99.0, 102.0, 0.5)
    assert low == pytest.approx(100 * math.exp(-math.hypot(math.log(100 / 99), 0.5)))
    assert high == pytest.approx(100 * math.exp(math.hypot(math.log(102 / 100), 0.5)))
    assert widen(100.0, 99.0, 102.0, 10.0)[0] > 0


@pytest.fixture(scope="module")
def example_prediction(tmp_path_factory):
    out = tmp_path_factory.mktemp("example") / "prediction"
    assert main([str(EXAMPLE), "--network", str(NETWORKS / "ib-ndr-400.ini"), "--no-ledger",
                 "--resamples", "20", "--out", str(out)]) == 0
    return out


def test_the_4096_gpu_intervals_would_have_covered_the_out_of_sample_miss(example_prediction):
    predictions = pd.read_csv(example_prediction / "predictions.csv")
    at_4096 = predictions[predictions["N"] == 4096]
    assert set(at_4096["strategy"]) == {"ddp+overlap", "zero2+overlap"}
    for _, row in at_4096.iterrows():
        # A prediction 17.5 % above the measurement: the measurement is step / 1.175.
        assert row["step_time_s_lo"] <= row["step_time_s"] / (1 + OUT_OF_SAMPLE_MISS), row
        assert row["step_time_s_hi"] >= row["step_time_s"] * (1 + OUT_OF_SAMPLE_MISS), row
        assert row["extrapolation_factor"] == 1024
    text = (example_prediction / "prediction.md").read_text()
    assert "Nominal level 90 %" in text and "Measured coverage on held-out points" in text
    document = json.loads((example_prediction / "predictions.json").read_text())
    error = document["model_error"]
    # Three N of two strategies, each predicted from the other two.
    assert len(error["residuals"]) == 6 and error["coverage_judged"] == 6
    assert f"**{error['coverage_inside']} of 6**" in text


def test_the_prediction_has_an_html_twin(example_prediction):
    page = (example_prediction / "prediction.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    # The HTML gives every heading an anchor id.
    assert re.search(r"<h2[^>]*>What would it take</h2>", page)
    assert re.search(r"<h2[^>]*>The model's own error</h2>", page)
