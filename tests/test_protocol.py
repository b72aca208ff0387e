"""The official (paper-code) protocol: stage 2, generation, scoring, digit formatting, CLI.

The reference is the public SITE code, github.com/SNU-DRL/Soft_Injection (``utils.py``:
``optimize_head_selection``, ``validate_head_selection``; ``eval.py``; ``models.py``;
``preprocess.py``). The stage-2 test re-implements its loop here in plain PyTorch with hooks.
"""

import importlib
import json
import math
import random
from dataclasses import asdict, replace

import pytest
import torch
import torch.nn.functional as F

from sitelens.cli import main as cli_main
from sitelens.eval.evaluation import evaluate
from sitelens.eval.generation import greedy_generate
from sitelens.eval.scoring import Protocol, exact_match, get_protocol, official_exact_match
from sitelens.models import encode, z_hook_name
from sitelens.provenance import canonical
from sitelens.site import FitConfig, OfficialFitConfig, SiteAdapter, fit_alpha, fit_site
from sitelens.tasks import (
    DEFAULT_TEMPLATE,
    Example,
    Task,
    Template,
    answer_token_id,
    few_shot_prompts,
)

ev = importlib.import_module("sitelens.eval.evaluation")  # the module of evaluate()
generation = importlib.import_module("sitelens.eval.generation")
BARE = replace(DEFAULT_TEMPLATE, bare_digits=True)


def _task(name: str = "mixed") -> Task:
    """Short items (the tiny models' tokenizer has one token per byte), half with all-digit
    answers. The valid split has 120 items: the last 20 must not be used (first 100 only). All
    inputs of a split have the same length, so a batch of its prompts needs no padding."""
    rng = random.Random(1)
    words = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op"]

    def item(i):
        out = str(rng.randrange(10, 99)) if i % 2 else rng.choice(words)
        return Example(f"k{i}", out)

    train = [item(i) for i in range(10, 50)]
    valid = [item(100 + i) for i in range(120)]
    test = [item(300 + i) for i in range(10)]
    return Task(name, train, valid, test)


# ----------------------------------------------------------------------------------------------
# stage 2 against a hand-written loop of the reference code


def _reference_fit(model, task, embedding, *, steps=400, every=50, n_valid=100, lr=0.2, seed=0):
    """The reference's ``optimize_head_selection`` as plain PyTorch + hooks: each step one item
    drawn i.i.d. (``random.sample(range(n), 1)``), the full zero-shot prompt run with
    z ← (1 − α)·z + α·t at its last token in every layer, cross-entropy of the first answer token
    (no space before an all-digit answer), Adam; after every ``every``-th step the mean loss over
    the first ``n_valid`` valid items (the reference runs them one at a time; here one unpadded
    batch, whose mean cross-entropy is the same mean); ``val_loss < best_val_loss`` with
    ``best_val_loss`` never updated, so the α of the last check is kept."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    rng = random.Random(seed)
    logit = torch.zeros(L, H, requires_grad=True)
    opt = torch.optim.Adam([logit], lr=lr)

    def loss_on(items: list[Example], alpha) -> torch.Tensor:
        enc = encode(model, [f"Q: {ex.input}\nA:" for ex in items])
        assert bool(enc.attention_mask.all())  # equal lengths: no padding
        answers = [model.tokenizer(("" if ex.output.isdigit() else " ") + ex.output,
                                   add_special_tokens=False)["input_ids"][0] for ex in items]

        def mix(layer):
            def fn(z, hook=None):  # z: [batch, pos, n_heads, d_head]
                a = alpha[layer][:, None].to(z.dtype)  # [n_heads, 1]
                last = (1 - a) * z[:, -1] + a * embedding[layer]  # [batch, n_heads, d_head]
                return torch.cat([z[:, :-1], last[:, None]], dim=1)
            return fn

        hooks = [(z_hook_name(model, layer), mix(layer)) for layer in range(L)]
        with model.hooks(fwd_hooks=hooks):
            logits = model(enc.tokens)  # [batch, pos, d_vocab]
        return F.cross_entropy(logits[:, -1].float(), torch.tensor(answers))

    best_val_loss, kept, history = math.inf, None, []
    for step in range(steps):
        opt.zero_grad()
        ex = task.train[rng.sample(range(len(task.train)), 1)[0]]
        loss = loss_on([ex], torch.sigmoid(logit))
        loss.backward()
        opt.step()
        if step % every == every - 1:
            with torch.no_grad():
                val = loss_on(task.valid[:n_valid], torch.sigmoid(logit)).item()
            history.append((step + 1, val))
            if val < best_val_loss:  # the reference never updates best_val_loss
                kept = logit.detach().clone()
    if kept is None:
        kept = logit.detach().clone()
    return torch.sigmoid(kept), history


def test_official_fit_matches_reference_loop(tiny):
    task = _task()
    g = torch.Generator().manual_seed(0)
    c = tiny.cfg
    emb = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g)  # [n_layers, n_heads, d_head]
    res = fit_alpha(tiny, task, emb, FitConfig.official())
    ref_alpha, ref_history = _reference_fit(tiny, task, emb)
    # same draws, same checks, the final α kept
    assert res.best_step == 400
    checks = [(h["step"], h["valid_loss"]) for h in res.history if not math.isnan(h["valid_loss"])]
    assert [s for s, _ in checks] == [50, 100, 150, 200, 250, 300, 350, 400]
    assert [s for s, _ in ref_history] == [s for s, _ in checks]
    assert len(res.history) == 400  # one record per step, no check before training
    # Tolerance: on a HookedTransformer fit_alpha runs the last token on a KV cache of the
    # left-padded prefix (padding masked) where the reference runs the whole unpadded prompt, so
    # each loss and gradient differs by float32 rounding (~1e-7 relative); Adam's step is
    # ~lr·m/√v, so 400 steps at lr 0.2 carry those differences into α: measured max |Δα| 1.2e-7
    # (MHA) and 3.5e-6 (GQA), validation losses within 1e-7 relative. (On a TransformerBridge both
    # run full passes and agree exactly.) atol 1e-4 on α leaves a ~30× margin and is still far
    # below what one different draw, check or kept α changes (≥ 1e-2 here).
    torch.testing.assert_close(res.alpha, ref_alpha, atol=1e-4, rtol=0)
    for (_, v), (_, r) in zip(checks, ref_history, strict=True):
        assert v == pytest.approx(r, rel=1e-4)


def test_official_keeps_alpha_of_last_check(tiny_mha):
    """The reference's quirk beyond 400/50: the α of the last check (not the final step) is kept,
    and with no check at all the final α."""
    task = _task()
    c = tiny_mha.cfg
    emb = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=torch.Generator().manual_seed(0))
    res = fit_alpha(tiny_mha, task, emb, FitConfig.official(n_examples=12, eval_every=5))
    assert res.best_step == 10
    ref_alpha, _ = _reference_fit(tiny_mha, task, emb, steps=12, every=5)
    torch.testing.assert_close(res.alpha, ref_alpha, atol=1e-5, rtol=0)
    res = fit_alpha(tiny_mha, task, emb, FitConfig.official(n_examples=3))
    assert res.best_step == 3 and all(math.isnan(h["valid_loss"]) for h in res.history)
    ref_alpha, _ = _reference_fit(tiny_mha, task, emb, steps=3)
    torch.testing.assert_close(res.alpha, ref_alpha, atol=1e-5, rtol=0)


def test_official_config_and_default_unchanged():
    off = FitConfig.official()
    assert isinstance(off, OfficialFitConfig) and isinstance(off, FitConfig)
    assert (off.batch_size, off.n_examples, off.steps, off.eval_every, off.n_valid, off.lr) == (
        1, 400, 400, 50, 100, 0.2)
    assert off.protocol == "official" and FitConfig().protocol == "default"
    # the default config's settings (and so its settings hashes and adapter metadata) are
    # unchanged: the schedule options added later are left out at their defaults
    before = ["lr", "init", "n_examples", "batch_size", "sparsity", "eval_every", "n_valid", "seed"]
    assert list(FitConfig().settings()) == before
    assert list(canonical(FitConfig())) == ["__type__", *before]
    assert list(asdict(FitConfig())) == [*before, "patience", "lr_rule"]
    assert canonical(FitConfig())["__type__"] == "FitConfig"
    assert canonical(off)["__type__"] == "OfficialFitConfig"
    assert replace(off, seed=3).protocol == "official"


def test_fit_site_official_meta_and_round_trip(tiny_mha, tmp_path):
    task = _task()
    cfg = FitConfig.official(n_examples=10, eval_every=5)
    ad = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=cfg)
    m = ad.meta
    assert m["protocol"] == "official" and m["best_step"] == 10
    assert m["template"]["bare_digits"] is True and ad.template.bare_digits
    assert [h["step"] for h in m["valid_history"]] == [5, 10]
    assert m["final_valid_loss"] == m["valid_history"][-1]["valid_loss"]
    loaded = SiteAdapter.load(ad.save(tmp_path / "ad"))
    assert loaded.meta["protocol"] == "official" and loaded.template == ad.template
    default = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=FitConfig(n_examples=16))
    assert "protocol" not in default.meta and "bare_digits" not in default.meta["template"]


# ----------------------------------------------------------------------------------------------
# scoring


@pytest.mark.parametrize(
    "prediction, target, task, ok",
    [
        ("Dollar", "Dollar (USD)", "country-currency", True),  # target cut at "("
        ("Euro (EUR) and more", "Euro", "country-currency", True),  # prediction cut at "("
        ("Saint Louis", "St. Louis", "x", True),  # St. -> Saint in the target
        ("St. Paul", "Saint Paul", "x", True),  # and in the prediction
        ("HOT", "hot", "antonym", True),  # lowercased
        ("hot", "Hot", "capitalize_first_letter", False),  # except capitalize ...
        ("HOT", "hot", "lowercase_first_letter", False),  # ... and lowercase tasks
        ("abc", "ABC", "uppercase", True),  # uppercase is not exempt in the reference
        ("Paris, France", "Paris", "x", True),  # prefix match
        ("Par", "Paris", "x", False),
        ("\n Paris \nLondon", "Paris", "x", True),  # stripped, then the first line
        ("cold\nhot", "hot", "x", False),  # only the first line
        ("anything", "(none)", "x", True),  # an empty target after the cut counts
    ],
)
def test_official_exact_match(prediction, target, task, ok):
    assert official_exact_match(prediction, target, task) is ok


def test_default_exact_match_differs():
    assert exact_match("Dollar", "Dollar (USD)") is False
    assert exact_match("abc", "ABC", case_sensitive=True) is False
    assert exact_match("Saint Louis", "St. Louis") is False


def test_get_protocol():
    assert get_protocol(None) == get_protocol("default") == Protocol()
    off = get_protocol("official")
    assert (off.max_new_tokens, off.min_new_tokens, off.stop_at_newline, off.bare_digits) == (
        20, 1, False, True)
    assert get_protocol(off) is off
    with pytest.raises(ValueError, match="Unknown protocol"):
        get_protocol("paper")


# ----------------------------------------------------------------------------------------------
# generation: at least 1 and at most 20 new tokens, no stop at a newline, text ends at EOS


def _scripted(monkeypatch, model, script):
    """Replace the model's next-token logits: at decode step s row r prefers ``script[r][s]``
    (a token id, or a list of ids from most to least preferred)."""
    calls = []
    V = model.cfg.d_vocab

    def fake_kv_forward(model, tokens, attention_mask, cache, last_only=False):
        s = len(calls)
        calls.append(tokens.shape)
        logits = torch.zeros(tokens.shape[0], 1, V)  # [batch, 1, d_vocab]
        for r in range(tokens.shape[0]):
            prefs = script[r][min(s, len(script[r]) - 1)]
            for rank, t in enumerate(prefs if isinstance(prefs, list) else [prefs]):
                logits[r, -1, t] = 10.0 - rank
        return logits

    monkeypatch.setattr(generation, "kv_forward", fake_kv_forward)
    return calls


def _ids(model, text):
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_generation_min_max_newline(tiny_mha, monkeypatch):
    tok = tiny_mha.tokenizer
    eos, nl = tok.eos_token_id, _ids(tiny_mha, "\n")[0]
    x, y = _ids(tiny_mha, "x")[0], _ids(tiny_mha, "y")[0]
    enc = encode(tiny_mha, ["Q: a\nA:"])
    # EOS preferred first: the default stops at once, min_new_tokens=1 takes the runner-up
    calls = _scripted(monkeypatch, tiny_mha, [[[eos, x], nl, y]])
    gen, first = greedy_generate(tiny_mha, enc, max_new_tokens=20)
    assert gen[0].tolist() == [eos]
    calls.clear()
    gen, first = greedy_generate(tiny_mha, enc, max_new_tokens=20, min_new_tokens=1,
                                 stop_at_newline=False)
    assert gen[0].tolist() == [x, nl] + [y] * 18  # 20 tokens: a newline does not stop it
    assert int(first.argmax()) == eos  # the first-step logits are not masked
    calls.clear()
    # with a newline stop (default protocol) it ends at the newline
    gen, _ = greedy_generate(tiny_mha, enc, max_new_tokens=20, min_new_tokens=1)
    assert gen[0].tolist() == [x, nl]


def test_official_run_cuts_at_eos_and_scores_first_line(tiny_mha, monkeypatch):
    tok = tiny_mha.tokenizer
    eos, nl = tok.eos_token_id, _ids(tiny_mha, "\n")[0]
    h, o, t = (_ids(tiny_mha, c)[0] for c in "hot")
    task = Task("antonym", [Example(f"w{i}", "cold") for i in range(12)], [], [
        Example("c1", "hot"), Example("c2", "hot (adj.)")])  # equal lengths: batch order kept
    # row 0: "hot" then EOS then junk; row 1: "hot\nhot..." for 30 steps (cut at 20)
    script = [[[eos, h], o, t, eos, h], [h, o, t, nl]]
    calls = _scripted(monkeypatch, tiny_mha, script)
    df = evaluate(tiny_mha, task, methods=["zero-shot"], protocol="official", batch_size=2)
    assert len(calls) == 20  # max 20 new tokens (the junk after row 0's EOS keeps the batch going)
    assert df.prediction.tolist() == ["hot", "hot"]
    assert df.correct.tolist() == [True, True]  # row 1's target is cut at "("
    calls.clear()
    df = evaluate(tiny_mha, task, methods=["zero-shot"], protocol="default", batch_size=2)
    # default: EOS first for row 0 (it keeps receiving tokens until row 1 stops at its newline, and
    # they are decoded: "ot"); "(adj.)" stays in row 1's target
    assert df.prediction.tolist() == ["ot", "hot"] and df.correct.tolist() == [False, False]
    assert len(calls) == 4


# ----------------------------------------------------------------------------------------------
# answer formatting: no space before an all-digit answer


def test_bare_digit_template():
    assert BARE.format_shot(Example("a", "12")) == "Q: a\nA:12\n\n"
    assert BARE.format_shot(Example("a", "b")) == "Q: a\nA: b\n\n"
    for y in ("3.5", "-3", "12a", "1 2"):  # not str.isdigit(): the space stays
        assert BARE.format_shot(Example("a", y)) == f"Q: a\nA: {y}\n\n"
    assert DEFAULT_TEMPLATE.format_shot(Example("a", "12")) == "Q: a\nA: 12\n\n"
    assert BARE.prefix_for("12") == "" and BARE.prefix_for("b") == " "
    assert DEFAULT_TEMPLATE.prefix_for("12") == " "
    assert DEFAULT_TEMPLATE.to_dict() == {"shot": "Q: {x}\nA: {y}\n\n", "query": "Q: {x}\nA:",
                                          "answer_prefix": " "}
    assert BARE.to_dict()["bare_digits"] is True and Template(**BARE.to_dict()) == BARE


def test_bare_digit_prompts_and_answer_tokens(tiny_mha):
    task = _task()
    prompts = few_shot_prompts(task, task.test[:3], 4, seed=0, template=BARE)
    for p in prompts:
        for shot in p.split("\n\n")[:-1]:
            answer = shot.split("\nA:")[1]
            assert answer.startswith(" ") != answer.isdigit()
    sp = _ids(tiny_mha, " ")[0]
    assert answer_token_id(tiny_mha, "42", BARE) == _ids(tiny_mha, "4")[0]
    # the default: " 42" splits into ' ', '4', '2', the space ends the prompt and '4' is scored
    assert answer_token_id(tiny_mha, "42") == _ids(tiny_mha, "4")[0]
    assert answer_token_id(tiny_mha, "ab", BARE) == sp  # official: the reference's first token


def test_official_first_token_uses_bare_digits(tiny_mha, monkeypatch):
    four = _ids(tiny_mha, "4")[0]
    task = Task("nums", [Example(f"w{i}", "7") for i in range(12)], [], [Example("a", "42")])
    script = [[four, _ids(tiny_mha, "2")[0], tiny_mha.tokenizer.eos_token_id]]
    calls = _scripted(monkeypatch, tiny_mha, script)
    off = evaluate(tiny_mha, task, methods=["zero-shot"], protocol="official")
    assert off.first_token_correct.tolist() == [True] and off.correct.tolist() == [True]
    calls.clear()
    dflt = evaluate(tiny_mha, task, methods=["zero-shot"])
    # the default's prompt ends with the answer's space, so '4' is scored there too (it used to
    # expect the space itself: a digit answer was scored on its whitespace)
    assert dflt.first_token_correct.tolist() == [True] and dflt.correct.tolist() == [True]


def test_evaluate_takes_the_adapters_protocol(tiny_mha, monkeypatch):
    task = _task()
    ad = fit_site(tiny_mha, task, n_prompts=4, n_shots=2, config=FitConfig.official(n_examples=4))
    seen = []
    real = ev.run_method

    def spy(*a, protocol=None, template=None, **k):
        seen.append((get_protocol(protocol).name, template.bare_digits))
        return real(*a, protocol=protocol, template=template, **k)

    monkeypatch.setattr(ev, "run_method", spy)
    evaluate(tiny_mha, task, methods=["site"], adapter=ad, limit=2)
    evaluate(tiny_mha, task, methods=["site"], adapter=ad, limit=2, protocol="default")
    evaluate(tiny_mha, task, methods=["zero-shot"], limit=2)
    assert seen == [("official", True), ("default", False), ("default", False)]


# ----------------------------------------------------------------------------------------------
# command line


def test_cli_protocol_official(tmp_path, capsys):
    out = tmp_path / "ad"
    base = ["--model", "tiny-random", "--task", "antonym", "--n-prompts", "4", "--n-shots", "2"]
    assert cli_main(["fit", *base, "--out", str(out), "--protocol", "official", "--n-examples",
                     "60"]) == 0
    meta = json.loads((out / "adapter.json").read_text())
    assert meta["protocol"] == "official" and meta["best_step"] == 50  # the last check's α
    hp = meta["hyperparameters"]
    assert (hp["batch_size"], hp["n_examples"], hp["eval_every"], hp["n_valid"]) == (1, 60, 50, 100)
    assert meta["template"]["bare_digits"] is True
    capsys.readouterr()
    ev_args = ["eval", "--model", "tiny-random", "--task", "antonym", "--adapter", str(out),
               "--methods", "zero-shot,site", "--limit", "2", "--json"]
    assert cli_main(ev_args) == 0
    assert set(json.loads(capsys.readouterr().out.strip().splitlines()[-1])) == {"zero-shot", "site"}
    assert cli_main([*ev_args, "--protocol", "default"]) == 0
    capsys.readouterr()
    # an explicit --batch-size wins; the default protocol keeps batch 8 and no marker
    out2 = tmp_path / "ad2"
    assert cli_main(["fit", *base, "--out", str(out2), "--protocol", "official", "--batch-size", "2",
                     "--n-examples", "8"]) == 0
    meta2 = json.loads((out2 / "adapter.json").read_text())
    assert meta2["hyperparameters"]["batch_size"] == 2 and meta2["protocol"] == "official"
    out3 = tmp_path / "ad3"
    assert cli_main(["fit", *base, "--out", str(out3), "--n-examples", "16"]) == 0
    meta3 = json.loads((out3 / "adapter.json").read_text())
    assert meta3["hyperparameters"]["batch_size"] == 8 and "protocol" not in meta3
    assert type(meta3["hyperparameters"]["batch_size"]) is int
