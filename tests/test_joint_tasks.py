"""K tasks' α fitted in one joint run (:func:`sitelens.site.fit_alpha_tasks`) equal the same K
fits run one by one (:func:`sitelens.site.fit_alpha`), on a tiny random model, both backends.

The tasks have different prompt lengths, so every joint pass left-pads some tasks' prefix caches
(:func:`sitelens.models.concat_caches`), and ``max_rows=16`` puts two tasks in a pass, so a step
runs several passes. Tolerance ``ATOL`` = 1e-5 on the kept logits and on every history number: a
joint pass sums the same float32 terms in another order (a wider, padded softmax; a matmul over more
rows), about 1e-7 relative per pass; over the 10 steps Adam carries that forward and the numbers
measured here differ by at most ~5e-7 (logits of order 1, losses of order 5). The broken variants
below (padding that is attended to, one task's embedding as every task's target) move the
kept logits or the losses by more than 1e-3, so the tolerance separates them by two orders of
magnitude. The kept step must be equal: the checks (steps 0, 5, 10) differ by far more than the
rounding.

Also: :func:`sitelens.site.fit_site_tasks` (stage 1 pooled) against :func:`sitelens.fit_site`,
the evaluation of many tasks in shared generation batches
(:func:`sitelens.eval.joint.evaluate_site_tasks`) against :func:`sitelens.evaluate` item by item
(the same predictions), and :func:`sitelens.models.concat_caches` on every cache kind."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import sitelens.site.joint as J
from sitelens import FitConfig, fit_site, load_task
from sitelens.eval.evaluation import evaluate
from sitelens.eval.joint import evaluate_site_tasks
from sitelens.models import concat_caches
from sitelens.site import fit_alpha, fit_alpha_tasks, fit_site_tasks, task_embedding
from sitelens.site.training import FitData, training_batches

NAMES = ("antonym", "choose_first_of_3", "present_past", "capitalize")
FIT = FitConfig(n_examples=80, n_valid=8, eval_every=5)  # 10 steps, checks at 0, 5 and 10
ATOL = 1e-5  # see the module docstring


@pytest.fixture(scope="module")
def setup(tiny_mha):
    tasks = [load_task(n) for n in NAMES]
    embs = [task_embedding(tiny_mha, t, n_prompts=4, n_shots=2) for t in tasks]
    alone = [fit_alpha(tiny_mha, t, e, FIT) for t, e in zip(tasks, embs)]
    return tasks, embs, alone


def check_joint_equals_one_by_one(model, tasks, embs, alone, **bounds) -> None:
    bounds = {"max_rows": 16, **bounds}  # two tasks per pass
    joint = fit_alpha_tasks(model, tasks, embs, FIT, **bounds)
    assert len(joint) == len(tasks)
    for task, j, a in zip(tasks, joint, alone):
        assert torch.allclose(j.logits, a.logits, rtol=0, atol=ATOL), (
            task.name, (j.logits - a.logits).abs().max())
        assert torch.allclose(j.alpha, a.alpha, rtol=0, atol=ATOL)
        assert j.best_step == a.best_step, task.name
        assert [h["step"] for h in j.history] == [h["step"] for h in a.history]
        for key in ("train_loss", "valid_loss"):
            assert [h[key] for h in j.history] == pytest.approx(
                [h[key] for h in a.history], rel=0, abs=ATOL, nan_ok=True), (task.name, key)
        assert j.data == a.data  # the same batches and validation items
        assert a.joint_tasks == 1
        assert j.joint_tasks == (1 if bounds.get("memory_bytes") == 1 else len(tasks))


def test_tasks_have_different_prompt_lengths(tiny_mha, setup):
    tasks, _, _ = setup
    widths = {J.cache_width(FitData.build(
        tiny_mha, t, list(training_batches(list(range(len(t.train))), FIT)), n_valid=FIT.n_valid
    ).train.cache) for t in tasks}
    assert len(widths) >= 3, widths  # three prompt lengths: every join pads some task


def test_joint_fit_equals_one_by_one(tiny_mha, setup):
    tasks, embs, alone = setup
    assert sum(a.best_step > 0 for a in alone) >= 3  # fits that moved: not a comparison of starts
    check_joint_equals_one_by_one(tiny_mha, tasks, embs, alone)


def test_joint_fit_task_order_does_not_matter(tiny_mha, setup):
    tasks, embs, alone = setup
    rev = slice(None, None, -1)
    check_joint_equals_one_by_one(tiny_mha, tasks[rev], embs[rev], alone[rev])


def test_joint_fit_in_chunks_equals_one_by_one(tiny_mha, setup):
    check_joint_equals_one_by_one(tiny_mha, *setup, memory_bytes=1)  # one task per chunk


def _attended_padding(caches):
    """concat_caches with the padding's mask set to 1: padded zeros are attended to."""
    joined = concat_caches(caches)
    mask = getattr(joined, "attention_mask", None)
    if mask is None:
        mask = joined.previous_attention_mask
    mask.fill_(1)
    return joined


def test_mutation_attended_padding_is_caught(tiny_mha, setup, monkeypatch):
    monkeypatch.setattr(J, "concat_caches", _attended_padding)
    with pytest.raises(AssertionError):
        check_joint_equals_one_by_one(tiny_mha, *setup)


def test_mutation_one_shared_target_is_caught(tiny_mha, setup, monkeypatch):
    tasks, embs, alone = setup
    real = J.place_layer_rows
    first = embs[0]
    monkeypatch.setattr(J, "place_layer_rows", lambda emb, model, **kw: real(first, model, **kw))
    with pytest.raises(AssertionError):
        check_joint_equals_one_by_one(tiny_mha, tasks, embs, alone)


def test_pass_groups_bound_rows_and_bytes():
    # widths ascending; 8 rows each; 100 bytes a position
    groups = J.pass_groups([2, 3, 5, 40], [8] * 4, 100, max_rows=16, budget_bytes=10_000)
    assert groups == [range(0, 2), range(2, 3), range(3, 4)]
    # the budget alone splits: 16 rows × 5 positions × 100 bytes > 4,000
    assert J.pass_groups([2, 5], [8, 8], 100, max_rows=64, budget_bytes=4_000) == [range(0, 1), range(1, 2)]
    # one task over the budget still gets its own pass
    assert J.pass_groups([500], [8], 100, max_rows=4, budget_bytes=1) == [range(0, 1)]


def test_bad_input():
    with pytest.raises(ValueError, match="one embedding per task"):
        fit_alpha_tasks(None, [load_task("antonym")], [], FIT)
    assert fit_alpha_tasks(None, [], [], FIT) == []


# ----------------------------------------------------------------------------------------------
# the evaluation: items of all tasks in shared generation batches

COLS = ["task", "method", "input", "target", "prediction", "first_token_correct", "correct"]


@pytest.fixture(scope="module")
def adapters(tiny_mha, setup):
    tasks, embs, _ = setup
    return [fit_site(tiny_mha, t, embedding=e, config=FIT) for t, e in zip(tasks, embs)]


def check_joint_evaluation_equals_one_task(model, tasks, adapters) -> None:
    one = pd.concat([evaluate(model, t, methods=["site"], adapter=a, limit=10)
                     for t, a in zip(tasks, adapters)], ignore_index=True)
    joint = evaluate_site_tasks(model, tasks, adapters, limit=10, batch_size=7)  # batches mix tasks
    assert len(joint) == len(one)
    assert joint[COLS].equals(one[COLS]), joint[COLS].compare(one[COLS])


def test_joint_evaluation_equals_one_task(tiny_mha, setup, adapters):
    check_joint_evaluation_equals_one_task(tiny_mha, setup[0], adapters)


def test_mutation_joint_evaluation_with_one_adapter_is_caught(tiny_mha, setup, adapters, monkeypatch):
    import sitelens.eval.joint as E

    real = E.HeadMix
    monkeypatch.setattr(E, "HeadMix", lambda w, t: real(w[:1].expand_as(w), t))  # row 0's α for all
    with pytest.raises(AssertionError):
        check_joint_evaluation_equals_one_task(tiny_mha, setup[0], adapters)


def test_joint_evaluation_bad_input(tiny_mha, setup, adapters):
    with pytest.raises(ValueError, match="one adapter per task"):
        evaluate_site_tasks(tiny_mha, setup[0], adapters[:1])


def test_fit_site_tasks_equals_fit_site(tiny_mha, setup):
    tasks = setup[0]
    joint = fit_site_tasks(tiny_mha, tasks, n_prompts=4, n_shots=2, config=FIT, max_rows=16)
    for t, j in zip(tasks, joint):
        a = fit_site(tiny_mha, t, n_prompts=4, n_shots=2, config=FIT)
        # stage 1 pooled: the same prompts in other batches (float32 rounding, values of order 1)
        assert torch.allclose(j.embedding, a.embedding, rtol=0, atol=ATOL)
        assert torch.allclose(j.alpha, a.alpha, rtol=0, atol=ATOL)
        assert j.meta["best_step"] == a.meta["best_step"]
        assert j.meta["joint_tasks"] == len(tasks) and "joint_tasks" not in a.meta
        skip = ("seconds", "joint_tasks", "valid_loss")  # timings; float-rounded losses
        assert {k: v for k, v in j.meta.items() if not k.endswith(skip)} == \
            {k: v for k, v in a.meta.items() if not k.endswith(skip)}


@pytest.mark.parametrize("recompute", [False, True])
def test_concat_caches_rows_equal_their_own_caches(tiny_mha, setup, recompute, monkeypatch):
    """Each row of joined prefix caches (three prompt lengths) gives the logits of its own cache,
    on every cache kind: TransformerLens's, the bridge's HF cache and its RecomputeCache. 1e-5:
    float32 rounding of a wider, padded softmax (logits of order 1); attended padding moves them
    by far more (checked below)."""
    import sitelens.models.kv as KV
    from sitelens.models import is_bridge, last_token_forward
    from sitelens.site.training import LastTokenSet

    if recompute:
        if not is_bridge(tiny_mha):
            pytest.skip("the RecomputeCache exists only on the bridge backend")
        monkeypatch.setitem(KV._DRIVEN, tiny_mha, False)
    sets = [LastTokenSet.build(tiny_mha, t.train[:3]) for t in setup[0][:3]]
    kinds = {type(s.cache) for s in sets}
    assert len(kinds) == 1 and (not recompute or kinds == {KV.RecomputeCache})
    assert len({J.cache_width(s.cache) for s in sets}) == 3
    with torch.no_grad():
        alone = torch.cat([last_token_forward(tiny_mha, s.cache, s.last) for s in sets])
        last = torch.cat([s.last for s in sets])
        joint = last_token_forward(tiny_mha, concat_caches([s.cache for s in sets]), last)
        assert torch.allclose(joint, alone, rtol=0, atol=1e-5)
        assert not torch.allclose(
            last_token_forward(tiny_mha, _attended_padding([s.cache for s in sets]), last),
            alone, rtol=0, atol=1e-3)
