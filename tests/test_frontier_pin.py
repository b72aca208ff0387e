"""A tiny-model frontier pinned before and after the frontier's speed work
(``tests/data/frontier_pin.json``, written by the code before it): every selector's sets, every
(selector, k, injection) accuracy on test and on valid (where k* is chosen) and k*. Speed-ups
of the engine (batched rows, prefix caches, one batched scoring of all sets) must leave all of it
as it was. The table is of ``CFG``, where greedy runs to its largest budget
(``greedy_stop=False``: every step pinned); greedy's stopping rule (stop once a step reaches full
SITE's valid accuracy, the default) is pinned apart (``"greedy_stop"``: the valid target, the
valid accuracy of each step, where it stopped and why).

Tolerance: none. The pinned accuracies are counts over the same items through the same float32
paths, and the sets are argmax/argsort results: a change of numerics large enough to matter shows
up as a different set or count, which is what this test exists to catch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sitelens import FitConfig, load_task, tiny_model
from sitelens.lenses.attribution import AttributionConfig
from sitelens.lenses.frontier import frontier, frontier_sets
from sitelens.lenses.selectors import FrontierConfig
from sitelens.patching import patched_last_logits
from sitelens.tasks import Example, Task, Template, answer_token_ids, zero_shot_prompts

PIN = Path(__file__).parent / "data" / "frontier_pin.json"
BUDGETS = (1, 2, 5)
CFG = FrontierConfig(
    fit=FitConfig(n_examples=24, n_valid=8),
    attribution=AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4, n_boot=20, n_alpha_items=6),
    n_prompts=4, n_shots=2, n_valid=8, test_limit=10, exact_match=True, sparsity_grid=(1.0, 5.0),
    template=Template(answer_prefix=""), greedy_stop=False,
)


def planted(model, task: Task) -> Task:
    """``task`` with every answer set to the model's own zero-shot top token (odd items) or its
    runner-up (even items), so that accuracies sit near 1/2 and move with every injection (a random
    model scores 0 on the real answers, which would pin nothing)."""
    tpl = CFG.template

    def split(items):
        logits = patched_last_logits(model, zero_shot_prompts(model, items, tpl))
        top2 = logits.topk(2, dim=-1).indices  # [n, 2]
        out = []
        for i, ex in enumerate(items):
            tok = int(top2[i, int(i % 2 == 0)])
            text = model.tokenizer.decode([tok])
            if text.strip() and answer_token_ids(model, [text], tpl) == [tok]:
                out.append(Example(ex.input, text))
        return out

    return Task("planted", split(task.train), split(task.valid), split(task.test))


def pinned_table(backend: str, config: FrontierConfig = CFG) -> dict:
    """The frontier of a 3-layer, 4-head tiny model: ``{"rows": [...], "k_star": {...}}``."""
    model = tiny_model(n_layers=3, n_heads=4, d_head=8, seed=1, backend=backend)
    res = frontier(model, planted(model, load_task("antonym")), budgets=BUDGETS, config=config)
    cols = ["selector", "k", "injection", "heads", "first_token_acc", "exact_match", "full_site",
            "zero_shot", "valid_acc", "full_site_valid"]
    rows = res.table[cols].astype(object).where(res.table[cols].notna(), None).to_dict("records")
    return {"rows": rows, "k_star": {s: v["k_star"] for s, v in res.summary["selectors"].items()}}


def pinned_greedy_stop(backend: str) -> dict:
    """Greedy on the same model and task with its stopping rule on: ``{"valid_target",
    "valid_acc_by_step", "stop", "sets"}``."""
    model = tiny_model(n_layers=3, n_heads=4, d_head=8, seed=1, backend=backend)
    (sel,) = frontier_sets(model, planted(model, load_task("antonym")), budgets=BUDGETS,
                           selectors=["greedy"], config=replace(CFG, greedy_stop=True))
    m = sel.meta
    return {"valid_target": m["valid_target"], "valid_acc_by_step": m["valid_acc_by_step"],
            "stop": m["stop"], "sets": {str(k): v for k, v in sel.sets.items()}}


def _pins(backend: str) -> dict:
    pins = json.loads(PIN.read_text())
    if backend not in pins or backend not in pins.get("greedy_stop", {}):
        pytest.fail(f"no pin for backend {backend!r}: regenerate with the code before the change")
    return pins


def test_frontier_table_is_pinned(backend):
    pins = _pins(backend)
    got = json.loads(json.dumps(pinned_table(backend)))
    want = pins[backend]
    assert got["k_star"] == want["k_star"]
    for g, w in zip(got["rows"], want["rows"], strict=True):
        assert g == w, (g, w)


def test_greedy_stopping_rule_is_pinned(backend):
    got = json.loads(json.dumps(pinned_greedy_stop(backend)))
    assert got == _pins(backend)["greedy_stop"][backend]


if __name__ == "__main__":  # writes the pin (run with the code the pin is to hold)
    import sys

    from sitelens.models import has_hooked_transformer

    backends = ["hooked", "bridge"] if has_hooked_transformer() else ["bridge"]
    pins = {b: pinned_table(b) for b in backends}
    pins["greedy_stop"] = {b: pinned_greedy_stop(b) for b in backends}
    PIN.write_text(json.dumps(pins, indent=1) + "\n")
    sys.stdout.write(f"wrote {PIN}\n")
