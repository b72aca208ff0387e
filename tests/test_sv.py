"""State Vector (sitelens.baselines.sv) on a tiny random model: the states are hook_z at the
separators, inner and momentum optimization obey their exact identities, the intervention replaces
z in the first layers at the last prompt token of the prefill only, and fits are seeded."""

from __future__ import annotations

import random

import pytest
import torch
from tolerances import assert_activations_close, assert_logits_close, assert_within, reduction_tolerance

from sitelens.baselines import SV, get_method
from sitelens.baselines.sv import (
    capture_states,
    demo_prompt,
    demo_prompts,
    first_layers,
    inner_average,
    momentum,
    separator_positions,
    state_vector,
)
from sitelens.errors import FitError, TaskError
from sitelens.eval.evaluation import evaluate
from sitelens.models import encode, z_hook_name
from sitelens.site.injection import HeadMix, apply_hooks
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Example,
    Template,
    task_from_pairs,
    zero_shot_prompt,
    zero_shot_prompts,
)
from sitelens.testing import tiny_model

SMALL = dict(n_shots=6, inner_window=4, momentum_steps=3, n_valid=8)  # 7 states, 5 gradients


@pytest.fixture(scope="module")
def model(backend):
    return tiny_model(n_key_value_heads=2, backend=backend)


@pytest.fixture(scope="module")
def task():
    rng = random.Random(0)
    words = list(dict.fromkeys("".join(rng.choice("abcdefgh") for _ in range(3)) for _ in range(80)))
    return task_from_pairs("reverse", [(w, w[::-1]) for w in words])


def _z(model, prompts, hooks=()):
    """hook_z of every layer, ``[batch, pos, L, H, d_head]``, after ``hooks`` acted, and the logits."""
    enc = encode(model, prompts)
    names = [z_hook_name(model, layer) for layer in range(model.cfg.n_layers)]
    got = {}

    def grabber(name):
        def grab(z, hook=None):
            got[name] = z.detach().clone()

        return grab

    with torch.no_grad(), apply_hooks(model, list(hooks) + [(n, grabber(n)) for n in names]):
        logits = model(enc.tokens, attention_mask=enc.attention_mask)  # [batch, pos, d_vocab]
    return torch.stack([got[n] for n in names], dim=2), logits, enc


# ----------------------------------------------------------------------------------------------
# states


def test_separators_end_each_query_part():
    demos = [Example("abc", "cba"), Example("de", "ed")]
    p = demo_prompt(demos, Example("xyz", "zyx"), DEFAULT_TEMPLATE)
    assert p.text == "Q: abc\nA: cba\n\nQ: de\nA: ed\n\nQ: xyz\nA:"
    assert [p.text[:b][-6:] for b in p.boundaries] == ["abc\nA:", " de\nA:", "xyz\nA:"]
    with pytest.raises(TaskError, match="begin with its query part"):
        demo_prompt(demos, demos[0], Template(shot="{y} <- {x}\n", query="{x} ->"))


def test_states_are_z_at_each_separator(model, task):
    """Each state is hook_z at a separator of the full prompt; causal attention makes it the last
    token of the prompt cut at that separator, run alone."""
    prompt = demo_prompts(task, 1, 4, seed=3, template=DEFAULT_TEMPLATE)[0]
    states = capture_states(model, [prompt])[0]  # [5, L, H, d_head]
    assert states.shape == (5, model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    cut = torch.stack([_z(model, [prompt.text[:b]])[0][0, -1] for b in prompt.boundaries])
    # the prefix run alone has other lengths, so the kernels sum in another order: per-layer
    # activation tolerance (layer l after l + 1 blocks, at its own scale)
    assert_activations_close(states, cut, model, layer_dim=1, what="states vs cut prompts")
    # the last separator is the prompt's last token
    assert separator_positions(model, prompt)[-1] == encode(model, [prompt.text]).tokens.shape[1] - 1


def test_batched_states_equal_one_prompt_at_a_time(model, task):
    prompts = demo_prompts(task, 3, 4, seed=1, template=DEFAULT_TEMPLATE)
    batched = capture_states(model, prompts, batch_size=3)
    single = torch.stack([capture_states(model, [p])[0] for p in prompts])
    # left padding changes the attention's reduction lengths: the padded-batch tolerance
    assert_activations_close(batched, single, model, layer_dim=2, what="padded batch vs single")


# ----------------------------------------------------------------------------------------------
# inner and momentum optimization (synthetic states: exact identities)


def _states(n_states=7, seed=0):
    return torch.randn(n_states, 2, 3, 4, generator=torch.Generator().manual_seed(seed))


def test_momentum_weights_are_the_released_16_8_4_2_1():
    # states whose successive differences are the unit vectors e_1 .. e_5 (the query state last)
    demos = torch.cumsum(torch.eye(6), 0)  # [6, 6]: V_i − V_{i−1} = e_i
    states = torch.cat([demos, torch.zeros(1, 6)]).reshape(7, 6, 1, 1)  # [7 states, L=6, 1, 1]
    m = momentum(states, 0.5, 5).flatten()
    assert torch.allclose(m, torch.tensor([0, 1, 2, 4, 8, 16.0]) / 31, atol=0, rtol=1e-6)


def test_step_zero_is_the_inner_average_and_window_one_the_plain_state():
    s = _states()
    inner = inner_average(s, 4)
    assert torch.equal(inner, s[-4:].mean(0))
    assert torch.equal(state_vector(s, inner_window=4, momentum_steps=3, beta=0.7, step=0.0), inner)
    assert torch.equal(state_vector(s, inner_window=1, momentum_steps=3, step=0.0), s[-1])


def test_beta_zero_is_the_newest_gradient_alone():
    s = _states()
    v = state_vector(s, inner_window=4, momentum_steps=3, beta=0.0, step=1.5)
    # weights (0, 0, 1): the two zero terms add exact zeros, so the result is bit-identical
    assert torch.equal(v, inner_average(s, 4) + 1.5 * (s[-2] - s[-3]))


def test_beta_one_is_the_mean_gradient_which_telescopes():
    s = _states()
    k = 3
    m = momentum(s, 1.0, k)
    expect = (s[-2] - s[-2 - k]) / k
    # the sum of k differences telescopes only up to float32 rounding of k additions
    bound = reduction_tolerance(k, float(s.abs().max()) * 2)
    assert_within(m, expect, bound, what="β = 1 momentum vs (V_{n−1} − V_{n−1−k}) / k")


@pytest.mark.parametrize("kw, match", [
    (dict(inner_window=0), "inner_window"), (dict(inner_window=8), "inner_window"),
    (dict(momentum_steps=0), "momentum_steps"), (dict(momentum_steps=6), "momentum_steps"),
    (dict(beta=1.5), "beta"),
])
def test_bad_settings_are_fit_errors(kw, match):
    with pytest.raises(FitError, match=match):
        state_vector(_states(), **{"inner_window": 4, "momentum_steps": 3, **kw})


# ----------------------------------------------------------------------------------------------
# the fitted method


def test_fit_shapes_params_and_registry(model, task):
    f = SV(**SMALL).fit(model, task)
    L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    depth = f.state["depth"]
    assert 1 <= depth <= L and f.state["vector"].shape == (L, H, d)
    assert f.state["states"].shape == (SMALL["n_shots"] + 1, L, H, d)
    assert f.n_params == 0 and f.meta["stored_numbers"] == depth * H * d and f.scope == "prefill"
    assert isinstance(f.intervention, HeadMix)
    assert torch.equal(f.intervention.weights.cpu(), first_layers(L, H, depth))
    assert [r["depth"] for r in f.meta["depth_table"]] == list(range(1, L + 1))
    assert type(get_method("sv")) is SV and f.method == "sv"


def test_intervention_replaces_z_at_the_last_prompt_token_of_the_prefill_only(model, task):
    f = SV(**SMALL, depths=[model.cfg.n_layers]).fit(model, task)  # every layer injected
    prompts = [zero_shot_prompt("abc"), zero_shot_prompt("hgfed")]
    base_z, base_logits, enc = _z(model, prompts)
    P = enc.tokens.shape[1]
    z, logits, _ = _z(model, prompts, f.hooks(model, P))
    # exact: weight 1 gives (1 − 1)·z + 1·t = t, and other positions are copied untouched
    assert torch.equal(z[:, -1], f.state["vector"].expand(len(prompts), -1, -1, -1))
    assert torch.equal(z[:, :-1, 0], base_z[:, :-1, 0])  # layer 0: nothing before it changed
    # earlier positions cannot see the last one (causal); same inputs, same kernels: only the
    # last row of each matrix changed, so the logits agree within the logit tolerance
    assert_logits_close(logits[:, :-1], base_logits[:, :-1], model, what="positions before the last",
                        mask=enc.attention_mask[:, :-1])
    assert (logits[:, -1] - base_logits[:, -1]).abs().max() > 1e-3  # the last one moved
    # a pass of another length (a KV-cached decode step, a longer sequence) is left alone: exact
    _, other, _ = _z(model, prompts, f.hooks(model, P + 1))
    assert torch.equal(other, base_logits)


def test_fits_are_seeded(model, task):
    a, b = SV(**SMALL).fit(model, task, seed=5), SV(**SMALL).fit(model, task, seed=5)
    assert torch.equal(a.state["vector"], b.state["vector"]) and a.state["depth"] == b.state["depth"]
    c = SV(**SMALL).fit(model, task, seed=6)
    assert not torch.equal(a.state["vector"], c.state["vector"])


def test_too_few_training_items_name_the_fix(model):
    small = task_from_pairs("tiny", [(f"w{i}", f"o{i}") for i in range(8)])  # 6 train items
    with pytest.raises(TaskError, match="fewer shots"):
        SV(n_shots=10).fit(model, small)


def test_evaluate_runs_sv(model, task):
    """evaluate() runs the SV intervention on the zero-shot prompts: its predictions begin the greedy
    generations under SV's hooks (decoded here from greedy_generate), and they differ from
    zero-shot's (so a dropped intervention fails)."""
    from sitelens.eval.generation import greedy_generate

    f = SV(**SMALL).fit(model, task)
    items = task.test[:4]
    prompts = zero_shot_prompts(model, items, DEFAULT_TEMPLATE)
    df = evaluate(model, task, methods=["zero-shot", "sv"], interventions={"sv": f.intervention},
                  limit=4, labels=None)
    assert list(df["method"]) == ["zero-shot"] * 4 + ["sv"] * 4
    ids, _ = greedy_generate(model, encode(model, prompts), intervention=f.intervention)
    want = [model.tokenizer.decode(row, skip_special_tokens=True) for row in ids.tolist()]
    sv, zs = df[df.method == "sv"].prediction.tolist(), df[df.method == "zero-shot"].prediction.tolist()
    # evaluate() stops at the task's answer length: each prediction is a non-empty prefix
    assert all(p.strip() and w.strip().startswith(p.strip()) for p, w in zip(sv, want)), (
        "evaluate's sv predictions are not SV's greedy generations", sv, want)
    assert sv != zs
