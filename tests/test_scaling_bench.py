"""benchmarks/scaling.py: its model configurations are the published models' shapes, its synthetic
prompts have the requested lengths, and its log-log fit recovers known exponents. (The benchmark
itself is a script; ``bash benchmarks/gpu.sh --dry-run`` runs it end to end.)"""

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling.py"
spec = importlib.util.spec_from_file_location("scaling_bench", SCRIPT)
scaling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scaling)

# Parameter counts the model cards / Hugging Face checkpoints report (tied embeddings counted
# once): a configuration with a wrong width, depth, head count, vocabulary or MLP size misses them.
PUBLISHED = {
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "qwen2.5-0.5b": 494_032_768,
    "llama-3.2-1b": 1_235_814_400,
    "gemma-3-1b": 999_885_952,
    "llama-3.1-8b": 8_030_261_248,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_configs_have_the_published_parameter_counts(name):
    spec_ = scaling.CONFIGS[name]
    assert scaling.hf_param_count(spec_["cfg"], spec_["tied"], spec_["family"]) == PUBLISHED[name]


def test_every_model_is_in_the_order_and_has_a_source():
    assert sorted(scaling.ORDER) == sorted(scaling.CONFIGS)
    for spec_ in scaling.CONFIGS.values():
        assert spec_["hf"] and spec_["cfg"]["positional_embedding_type"] == "rotary"


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

    rows = [{"params_compute": P, "prompt_tokens": T, "y": 3e-9 * P**0.9 * T**1.2}
            for P in (1e8, 5e8, 2e9) for T in (64, 256, 1024)]
    fit = scaling.fit_power_law(pd.DataFrame(rows), "y")
    # noiseless data: least squares on the logs is exact to float rounding
    assert fit["a"] == pytest.approx(0.9, abs=1e-9)
    assert fit["b"] == pytest.approx(1.2, abs=1e-9)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)
    assert scaling.predict(fit, 4e9, 512) == pytest.approx(3e-9 * 4e9**0.9 * 512**1.2, rel=1e-9)
    one_length = pd.DataFrame([r for r in rows if r["prompt_tokens"] == 256])
    assert math.isnan(scaling.fit_power_law(one_length, "y")["b"])
