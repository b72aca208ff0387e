"""benchmarks/scaling.py: it orders every published shape (``benchmarks/lib/shapes.py``), its synthetic
prompts have the requested lengths, and the log-log fit it uses recovers known exponents. (The benchmark
itself is a script; ``bash benchmarks/gpu.sh --dry-run`` runs it end to end.)"""

import math

import pytest
from bench_util import bench_module

scaling = bench_module("scaling")

def test_every_model_is_in_the_order():
    assert sorted(scaling.ORDER) == sorted(scaling.SHAPES)


@pytest.mark.parametrize("length", [64, 256, 1024])
def test_synthetic_prompts_have_the_requested_length(length):
    from sitelens.tasks import embedding_prompts, zero_shot_prompt

    # one token per byte plus BOS (tiny_tokenizer); the few-shot input length is rounded to whole
    # characters shared by N_SHOTS + 1 inputs, so the prompt is within N_SHOTS + 1 tokens of it
    few = scaling.make_task("few", length, n_train=12)
    for p in embedding_prompts(few, 3, scaling.N_SHOTS):
        assert abs(len(p.encode()) + 1 - length) <= scaling.N_SHOTS + 1
    zero = scaling.make_task("zero", length, n_train=2)
    assert all(len(zero_shot_prompt(ex.input).encode()) + 1 == length for ex in zero.train)


def test_power_law_fit_recovers_exponents():
    import pandas as pd

    from sitelens.pipelines.experiment import fit_power_law, predict

    rows = [{"params_compute": P, "prompt_tokens": T, "y": 3e-9 * P**0.9 * T**1.2}
            for P in (1e8, 5e8, 2e9) for T in (64, 256, 1024)]
    fit = fit_power_law(pd.DataFrame(rows), "y")
    # noiseless data: least squares on the logs is exact to float rounding
    assert fit["a"] == pytest.approx(0.9, abs=1e-9)
    assert fit["b"] == pytest.approx(1.2, abs=1e-9)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)
    assert predict(fit, 4e9, 512) == pytest.approx(3e-9 * 4e9**0.9 * 512**1.2, rel=1e-9)
    one_length = pd.DataFrame([r for r in rows if r["prompt_tokens"] == 256])
    assert math.isnan(fit_power_law(one_length, "y")["b"])
    assert fit_power_law(pd.DataFrame(rows[:2]), "y") is None
