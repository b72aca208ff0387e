"""The training runner with R conditions (:func:`sitelens.site.training.run_training`): R fits run
at once equal the same R fits run one by one, on a toy problem with no model.

Each condition r pulls its parameters ``w_r`` toward ``x_i + c_r`` (a squared error over the
batch's items) and is validated against ``c_r / 2``, so the validation loss falls and then rises:
with targets of different sizes each condition keeps a different step, and a rule that kept one
step for all would show. Everything is float64 and elementwise but for each condition's own sum
and mean over its rows, which a joint pass computes on the same numbers as a single one; the
tolerance ``ATOL`` = 1e-12 (about 1e4 float64 ulps at the values' size, ~1) leaves room only for a
reduction that sums in another order, while the broken variants below move the kept parameters
by more than 1e-3."""

from __future__ import annotations

import pytest
import torch

from sitelens.errors import FitError
from sitelens.site import training

N_DIM, N_ITEMS, STEPS = 4, 12, 40
X = torch.randn(N_ITEMS, N_DIM, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.1
C = torch.tensor([1.0, 3.0, 6.0], dtype=torch.float64)[:, None] * torch.ones(N_DIM, dtype=torch.float64)
ATOL = 1e-12  # see the module docstring


def run(targets: torch.Tensor, per_pass: int | None = None, keep: str = "best", bad_step: int | None = None,
        patience: int = 0):
    """One runner call over ``len(targets)`` conditions (one row of ``w`` each)."""
    w = torch.zeros(len(targets), N_DIM, dtype=torch.float64)  # [R, n_dim]
    batches = [[(3 * s + j) % N_ITEMS for j in range(3)] for s in range(STEPS)]

    def objective(batch, conds):
        x = X[torch.tensor(batch)]  # [batch, n_dim]
        diff = w[conds.start:conds.stop, None] - x[None] - targets[conds.start:conds.stop, None]
        loss = diff.pow(2).sum(-1).mean(-1)  # [len(conds)]
        if batch[0] == bad_step:
            loss = loss * float("nan")
        return loss, loss.detach()

    def valid_loss():
        return (w.detach() - targets / 2).pow(2).sum(-1)  # [R]

    return training.run_training(
        [w], batches, objective, valid_loss, snapshot=lambda r: w[r].detach().clone(),
        config=training.RunConfig(lr=0.1, eval_every=2, keep=keep, conditions=len(targets),
                                  per_pass=per_pass, check_params=True, patience=patience))


def check_joint_equals_one_by_one(keep: str = "best") -> None:
    joint = run(C, per_pass=2, keep=keep)  # two passes a step: conditions {0, 1} and {2}
    alone = [run(C[r:r + 1], keep=keep)[0] for r in range(len(C))]
    assert len(joint) == len(C)
    for j, a in zip(joint, alone):
        assert torch.allclose(j.kept, a.kept, rtol=0, atol=ATOL), (j.kept, a.kept)
        assert j.best_step == a.best_step
        assert j.valid_loss == pytest.approx(a.valid_loss, rel=0, abs=ATOL)
        assert [h["step"] for h in j.history] == [h["step"] for h in a.history]
        for key in ("train_loss", "valid_loss"):
            assert [h[key] for h in j.history] == pytest.approx(
                [h[key] for h in a.history], rel=0, abs=ATOL, nan_ok=True)
    assert len({a.best_step for a in alone}) == len(C)  # each condition keeps its own step
    assert all(0 < a.best_step < STEPS for a in alone)


@pytest.mark.parametrize("keep", ["best", "last_check"])
def test_r_conditions_equal_r_runs_of_one(keep):
    if keep == "best":
        check_joint_equals_one_by_one(keep)
    else:  # every check replaces what is kept: the final parameters, per condition
        joint = run(C, per_pass=2, keep=keep)
        for r, j in enumerate(joint):
            (a,) = run(C[r:r + 1], keep=keep)
            assert j.best_step == a.best_step == STEPS
            assert torch.allclose(j.kept, a.kept, rtol=0, atol=ATOL)


class SharedAdam(torch.optim.Adam):
    """A broken runner's optimizer: one second moment shared by every condition (each
    parameter's ``exp_avg_sq`` pooled over its rows after every step)."""

    @torch.no_grad()
    def step(self, closure=None):
        out = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                v = self.state[p]["exp_avg_sq"]
                v.copy_(v.mean(0, keepdim=True).expand_as(v))
        return out


def test_mutation_shared_adam_state_is_caught(monkeypatch):
    monkeypatch.setattr(torch.optim, "Adam", SharedAdam)
    with pytest.raises(AssertionError):
        check_joint_equals_one_by_one()


def test_mutation_one_kept_step_for_all_conditions_is_caught(monkeypatch):
    real = training._per_condition

    def pooled(x, n):  # every condition judged by the mean validation loss: one kept step for all
        v = real(x, n)
        return [sum(v) / n] * n

    monkeypatch.setattr(training, "_per_condition", pooled)
    with pytest.raises(AssertionError):
        check_joint_equals_one_by_one()


@pytest.mark.parametrize("eager", [True, False])
def test_a_non_finite_condition_raises_naming_its_step(monkeypatch, eager):
    """At once on the CPU, at the next check where the runner defers reading (a GPU's path)."""
    monkeypatch.setattr(training, "_read_every_step", lambda params: eager)
    with pytest.raises(FitError, match="Non-finite loss at step 4 "):
        run(C, per_pass=2, bad_step=(3 * 3) % N_ITEMS)  # the batch of step 4 starts at item 9


def test_conditions_are_grouped_per_pass():
    cfg = training.RunConfig(lr=0.1, conditions=5, per_pass=2)
    assert cfg.groups() == [range(0, 2), range(2, 4), range(4, 5)]
    assert training.RunConfig(lr=0.1, conditions=5).groups() == [range(0, 5)]
    with pytest.raises(ValueError):
        training.RunConfig(lr=0.1, conditions=0)


def test_a_fit_that_keeps_its_start_warns(tiny_mha):
    """lr = 1e-30 moves no logit in float32 (sigmoid(±1e-30) == 0.5), so every validation loss
    ties the start and the kept α is the start: that fit warns; one that moves does not."""
    import warnings

    from sitelens import FitConfig, fit_site, load_task
    from sitelens.site import StalledFitWarning

    task = load_task("antonym")
    with pytest.warns(StalledFitWarning, match="no step improved the validation loss"):
        ad = fit_site(tiny_mha, task, n_prompts=4, n_shots=2,
                      config=FitConfig(n_examples=16, lr=1e-30))
    assert ad.meta["best_step"] == 0 and bool((ad.alpha == 0.5).all())
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalledFitWarning)
        moved = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=FitConfig(n_examples=32))
    assert moved.meta["best_step"] > 0


EVAL_EVERY = 2  # run()'s validation interval


@pytest.mark.parametrize("patience", [1, 3])
def test_patience_stops_that_many_checks_after_the_best_keeping_it(patience):
    """The same batches and seed: the stopped run is the full run cut at the check ``patience``
    checks after its best, and it keeps the full run's best (exactly: the same numbers)."""
    for r in range(len(C)):
        (full,) = run(C[r:r + 1])
        (cut,) = run(C[r:r + 1], patience=patience)
        stop = full.best_step + patience * EVAL_EVERY
        assert stop < STEPS  # the toy's validation loss rises well before the end
        assert [h["step"] for h in cut.history] == list(range(stop + 1))
        for key in ("train_loss", "valid_loss"):  # the same numbers (NaN where not checked)
            assert [h[key] for h in cut.history] == pytest.approx(
                [h[key] for h in full.history[:stop + 1]], rel=0, abs=0, nan_ok=True)
        assert cut.best_step == full.best_step and torch.equal(cut.kept, full.kept)


def test_patience_with_conditions_waits_for_the_last_to_stop_improving():
    """Several conditions stop together: after ``patience`` checks in which none improved, so each
    keeps the best of its own full run."""
    full = run(C)
    cut = run(C, patience=2)
    stop = max(f.best_step for f in full) + 2 * EVAL_EVERY
    assert len({f.best_step for f in full}) == len(C)  # the conditions' bests differ
    for f, c in zip(full, cut):
        assert c.history[-1]["step"] == stop and c.best_step == f.best_step
        assert torch.equal(c.kept, f.kept)


def test_patience_zero_runs_every_batch_and_negative_is_refused():
    (a,) = run(C[:1], patience=0)
    assert a.history[-1]["step"] == STEPS
    with pytest.raises(ValueError, match="patience"):
        training.RunConfig(lr=0.1, patience=-1)


# ----------------------------------------------------------------------------------------------
# FitConfig's schedule options through fit_alpha (tiny model)


@pytest.fixture(scope="module")
def antonym_embedding(tiny_mha):
    from sitelens import load_task
    from sitelens.site.embedding import task_embedding

    task = load_task("antonym")
    return task, task_embedding(tiny_mha, task, n_prompts=4, n_shots=2)


def test_lr_rule_sqrt_is_the_scaled_lr(tiny_mha, antonym_embedding):
    """``lr_rule="sqrt"`` at batch 16 is exactly the fixed rule at lr·√(16/8); it does move α
    away from the unscaled lr's."""
    import math

    from sitelens import FitConfig
    from sitelens.site.alpha import fit_alpha

    task, emb = antonym_embedding
    wide = dict(batch_size=16, n_examples=48, n_valid=16)
    cfg = FitConfig(lr_rule="sqrt", **wide)
    assert cfg.step_lr == pytest.approx(0.2 * math.sqrt(2), rel=1e-15)
    assert FitConfig(lr_rule="linear", **wide).step_lr == pytest.approx(0.4, rel=1e-15)
    assert FitConfig(**wide).step_lr == 0.2
    ruled = fit_alpha(tiny_mha, task, emb, cfg)
    scaled = fit_alpha(tiny_mha, task, emb, FitConfig(lr=0.2 * math.sqrt(2), **wide))
    plain = fit_alpha(tiny_mha, task, emb, FitConfig(**wide))
    assert torch.equal(ruled.logits, scaled.logits)
    assert not torch.equal(ruled.logits, plain.logits)


def test_patience_stops_a_fit_and_records_the_examples_seen(tiny_mha, antonym_embedding):
    """lr = 1e-30 moves no logit (every check ties the start), so with a check every step and
    patience 2 the fit stops at step 2 of 8; the data record counts the 2 batches run."""
    from sitelens import FitConfig
    from sitelens.site import StalledFitWarning
    from sitelens.site.alpha import fit_alpha

    task, emb = antonym_embedding
    cfg = FitConfig(lr=1e-30, n_examples=64, eval_every=1, n_valid=16, patience=2)
    with pytest.warns(StalledFitWarning):
        res = fit_alpha(tiny_mha, task, emb, cfg)
    assert [h["step"] for h in res.history] == [0, 1, 2]
    assert res.data["train_examples"] == 2 * cfg.batch_size
    with pytest.warns(StalledFitWarning):
        full = fit_alpha(tiny_mha, task, emb, FitConfig(lr=1e-30, n_examples=64, eval_every=1, n_valid=16))
    assert full.history[-1]["step"] == 8 and full.data["train_examples"] == 64


def test_schedule_options_are_checked_and_left_out_of_records_at_their_defaults():
    from dataclasses import asdict

    from sitelens import FitConfig

    with pytest.raises(FitError, match="patience"):
        FitConfig(patience=-1)
    with pytest.raises(FitError, match="lr_rule"):
        FitConfig(lr_rule="cosine")
    base = asdict(FitConfig())
    assert FitConfig().settings() == {k: v for k, v in base.items() if k not in ("patience", "lr_rule")}
    assert FitConfig(patience=2, lr_rule="sqrt").settings() == dict(base, patience=2, lr_rule="sqrt")
    from sitelens.provenance import settings_hash  # a set option changes the hash; unset, it does not

    assert settings_hash(FitConfig(patience=2)) != settings_hash(FitConfig())
    assert settings_hash(FitConfig(lr_rule="fixed")) == settings_hash(FitConfig())
    assert FitConfig.official().step_lr == FitConfig.official().lr  # the official schedule is unscaled


def test_joint_fits_refuse_patience(tiny_mha, antonym_embedding):
    from sitelens import FitConfig
    from sitelens.lenses.joint_fit import fit_many
    from sitelens.tasks import DEFAULT_TEMPLATE

    task, emb = antonym_embedding
    with pytest.raises(FitError, match="patience"):
        fit_many(tiny_mha, task, emb, FitConfig(patience=1), torch.sigmoid, 2,
                 template=DEFAULT_TEMPLATE, what="α")
