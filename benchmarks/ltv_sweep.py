"""LTV's robustness to its choices: the block ℓ, the ridge λ, the number of queries N and of
demonstrations k, on classification tasks (``../shared/datasets/cls``), with diagnostics of why.

    python benchmarks/ltv_sweep.py --models smollm2-135m-instruct --tasks sst2,agnews,trec \\
        --limit 100 --threads 1          # appends to results/ltv_sweep.csv, writes ltv_sweep.md
    python benchmarks/ltv_sweep.py --report   # the markdown from the CSV alone

The map is :mod:`sitelens.baselines.ltv`'s: ``X``/``Y`` come from :func:`~sitelens.baselines.ltv.ltv_data`
with the method's own seeds, so the cell (final block, λ = 5, N = 256, k = 10, variant ``ltv``) is
exactly ``LTV()`` and the cell at the block chosen on valid is exactly ``LTV(layer="sweep")``.
N < 256 takes the first N of those 256 queries (not a fresh draw of N). The grid, one knob at a
time around those defaults:

- ``layer``: every block, variants ``ltv`` (the method: ``h ← h + W h``), ``ltv+b`` (a ridge with
  an intercept: ``h ← h + W (h − x̄) + ȳ``, ``W`` fitted on centred ``X``, ``Y``) and ``shift``
  (``h ← h + ȳ``, the mean demonstration effect alone: ``ltv+b`` as λ → ∞); the valid-split
  first-token accuracy of ``ltv`` at each block (the sweep's choice) is recorded beside the test
  metrics;
- ``lam``: λ ∈ {0.05 … 5e5} (8 decades) at the final block and at the block chosen on valid,
  ``ltv`` and ``ltv+b``;
- ``lam_rel``: the same two blocks and variants with λ in units of the data, λ = r · tr(XᵀX)/d
  for r in :class:`~sitelens.baselines.LTVValid`'s grid (10⁻³ … 10). A raw-λ grid covers
  different regimes on different models (Gemma's residual stream is far larger than SmolLM2's,
  so 5e5 is still under 1% of its mean eigenvalue); this one is comparable across models. The
  row's ``lam`` is the absolute λ (rounded to 6 significant digits, which is also what is fitted)
  and ``rel_lam`` the multiple r;
- ``n``: N ∈ {16, 32, 64, 128, 256}; ``k``: k ∈ {1, 2, 5, 10} (the same queries, k-shot
  demonstrations), both at the two blocks, ``ltv``;
- ``full``: the default block and the block chosen on valid, every variant, scored in full;
- ``ref``: zero-shot and 10-shot ICL (in full).

Scoring. An LTV-style intervention acts at the last prompt token only (prefill), so the answer
position's distribution is a one-position forward pass over a frozen prefix KV cache of the
zero-shot test prompts (:class:`sitelens.site.training.LastTokenSet`, as the layer choice of TV and
``LTV(layer="sweep")``): per cell, ``first_token_acc`` (argmax = the gold answer's first token),
``label_acc_first`` (the label whose first token has the highest logit is the gold one) and dNTP
against the same 10-shot ICL reference as ``sitelens bench``
(:func:`sitelens.pipelines.bench.reference_logits`),
on the first ``--limit`` test items. The ``full`` grid scores the default and the chosen block
(every variant) with :func:`sitelens.pipelines.bench.score_fitted` instead, the bench's whole code path:
greedy generation (exact match), full-label and length-normalized ranking with the chance level;
its first-token numbers must agree with the cheap path's (checked on each run). Diagnostics per
cell: ``rel_lam`` = λ / (tr XᵀX / d) (λ in units of the mean eigenvalue of the queries' Gram
matrix), ``r2_train`` (the fit on its own queries) and ``r2_test`` (the same map predicting
``Y`` of the test items, whose ``h_icl`` uses the ICL reference's demonstrations: how far the
map's prediction of the demonstration effect generalizes), and ``norm_ratio`` = mean ‖predicted
shift‖ / mean ‖true shift‖ on the test items.

Resumable: each cell is keyed on everything that made it (model fingerprint, task hash, grid,
variant, block, λ, N, k, seed, limit, numerics version) and appended under a lock as soon as it is
scored; a rerun skips the keys already in the CSV. The captured hidden states are cached under
``runs/ltv_sweep_cache/`` (ignored by git), keyed the same way.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import sitelens as sl
from sitelens.baselines import LTVValid, get_method
from sitelens.baselines.base import Fitted, HookIntervention, last_token_hook, select_layer
from sitelens.baselines.ltv import SWEEP_N_VALID, ltv_data, ltv_intervention, ridge_closed_form
from sitelens.eval.labels import continuation_ids, label_set
from sitelens.eval.metrics import dntp_per_item
from sitelens.io import atomic_write_text
from sitelens.models import act_name, fingerprint, model_name
from sitelens.pipelines.bench import reference_logits, score_fitted
from sitelens.pipelines.experiment import DATA_ROOT, md_table, pct
from sitelens.pipelines.store import ObjectCache, ResultsStore
from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash
from sitelens.site import capture_last
from sitelens.site.training import LastTokenSet, valid_items
from sitelens.tasks import few_shot_prompts, load_task, zero_shot_prompt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
CACHE = ROOT / "runs" / "ltv_sweep_cache"
DATA = DATA_ROOT / "cls"

LAM, N_QUERIES, N_SHOTS, SEED = 5.0, 256, 10, 0  # LTV()'s defaults, bench seed 0
LAMS = (0.05, 0.5, 5.0, 50.0, 500.0, 5e3, 5e4, 5e5)
NS = (16, 32, 64, 128, 256)
KS = (1, 2, 5, 10)
SETTINGS = ["model", "fingerprint", "task", "task_hash", "grid", "variant", "layer", "lam",
            "n_queries", "n_shots", "seed", "limit", "numerics_version"]
METRICS = ["n", "first_token_acc", "exact_match", "label_acc_first", "label_acc_full",
           "label_acc_full_norm", "chance", "dntp", "valid_acc", "rel_lam", "r2_train", "r2_test",
           "norm_ratio", "final_block", "chosen_block", "seconds"]
COLUMNS = [*SETTINGS, "key", *METRICS]


# ----------------------------------------------------------------------------------------------
# the results file


def read_rows(path: Path) -> pd.DataFrame:
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=COLUMNS)
    return pd.read_csv(path, dtype={"key": str, "task": str, "model": str})


def cached(name: str, make):
    """A keyed tensor cache under ``runs/ltv_sweep_cache`` (the name holds the model, its weights'
    fingerprint, the task hash and the sizes)."""
    return ObjectCache(CACHE).get(name, {}, make)


def train_states(model, task, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """LTV's own X, Y at every block (N_QUERIES queries, k shots, the method's seeds)."""
    tag = f"{model_name(model)}-{fingerprint(model)[:12]}-{task.name}-{task_hash(task)}"
    return cached(f"{tag}-train-k{k}-n{N_QUERIES}-s{SEED}", lambda: ltv_data(
        model, task, range(model.cfg.n_layers), n_queries=N_QUERIES, n_shots=k, seed=SEED))


def test_states(model, task, items) -> tuple[torch.Tensor, torch.Tensor]:
    """X, Y of the test items: zero-shot vs the ICL reference's 10-shot prompts (seed 0)."""
    tag = f"{model_name(model)}-{fingerprint(model)[:12]}-{task.name}-{task_hash(task)}"

    def make():
        names = [act_name("resid_post", ell) for ell in range(model.cfg.n_layers)]
        hz = capture_last(model, [zero_shot_prompt(ex.input) for ex in items], names)
        hi = capture_last(model, few_shot_prompts(task, items, N_SHOTS, seed=SEED), names)
        X = torch.stack([hz[n] for n in names], 1)  # [n, n_layers, d_model]
        return X, torch.stack([hi[n] for n in names], 1) - X  # [n, n_layers, d_model]

    return cached(f"{tag}-test-n{len(items)}-s{SEED}", make)


# ----------------------------------------------------------------------------------------------
# the variants


def fit_variant(X, Y, lam: float, variant: str):
    """``(W, x̄, ȳ)`` with ``shift = W (h − x̄) + ȳ`` (ltv: x̄ = ȳ = 0)."""
    d = X.shape[1]
    if variant == "ltv":
        return ridge_closed_form(X, Y, lam), torch.zeros(d), torch.zeros(d)
    xm, ym = X.mean(0), Y.mean(0)  # [d_model]
    if variant == "shift":
        return torch.zeros(d, d), xm, ym
    return ridge_closed_form(X - xm, Y - ym, lam), xm, ym  # ltv+b


def predict(W, xm, ym, X):
    return (X - xm) @ W.T + ym  # [n, d_model]


def intervention(W, xm, ym, layer: int, variant: str) -> HookIntervention:
    if variant == "ltv":
        return ltv_intervention(W, layer)
    name = act_name("resid_post", layer)

    def build(model, seq_len):
        dev = model.cfg.device
        Wd, xd, yd = W.to(dev), xm.to(dev), ym.to(dev)
        return [(name, last_token_hook(
            lambda h: h + (h - xd.to(h.dtype)) @ Wd.to(h.dtype).T + yd.to(h.dtype), seq_len))]

    return HookIntervention(build)


def r2(Y, P) -> float:
    """1 − ‖Y − P‖² / ‖Y − Ȳ‖² (the share of the shift's variance the prediction explains)."""
    return float(1 - ((Y - P) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum())


# ----------------------------------------------------------------------------------------------
# the sweep


class FirstTokens:
    """The zero-shot test prompts as a frozen prefix cache, their gold first tokens and the label
    set's first tokens: the answer-position metrics of a last-token intervention in one
    one-position pass."""

    def __init__(self, model, items, labels):
        self.model, self.data = model, LastTokenSet.build(model, items)
        self.labels = labels
        if labels is not None and labels.options is None:
            starts = [c[0] for c in continuation_ids(model, labels.labels)]
            self.label_first = torch.tensor(starts) if len(set(starts)) == len(starts) else None
            self.gold = torch.tensor([labels.labels.index(ex.output) for ex in items])
        else:
            self.label_first = None

    def score(self, hooks, reference) -> dict:
        with torch.no_grad():
            logits = self.data.logits(self.model, hooks).cpu()  # [n, d_vocab]
        out = {"n": len(self.data),
               "first_token_acc": float((logits.argmax(-1) == self.data.answers.cpu()).float().mean()),
               "dntp": float(dntp_per_item(reference, logits).mean())}
        if self.label_first is not None:
            pick = logits[:, self.label_first].argmax(-1)  # [n]
            out["label_acc_first"] = float((pick == self.gold).float().mean())
            out["chance"] = 1 / len(self.labels.labels)
        return out


class Sweep:
    def __init__(self, model, task, limit: int, out: Path):
        self.model, self.task, self.limit, self.out = model, task, limit, out
        self.items = task.test[:limit]
        self.done = set(read_rows(out)["key"].astype(str))
        self.base = {"model": model_name(model), "fingerprint": fingerprint(model),
                     "task": task.name, "task_hash": task_hash(task), "seed": SEED,
                     "limit": limit, "numerics_version": NUMERICS_VERSION}
        self.L = model.cfg.n_layers
        self.labels = label_set(task)
        self._ref = self._cheap = None

    @property
    def ref(self):
        if self._ref is None:
            self._ref = reference_logits(self.model, self.task, self.items, n_shots=N_SHOTS,
                                         seed=SEED)
        return self._ref

    @property
    def cheap(self) -> FirstTokens:
        if self._cheap is None:
            self._cheap = FirstTokens(self.model, self.items, self.labels)
        return self._cheap

    def cell(self, grid, variant, layer, lam, n, k, fitted_fn, extra_fn=lambda: {}):
        settings = dict(self.base, grid=grid, variant=variant, layer=layer, lam=lam, n_queries=n,
                        n_shots=k)
        key = settings_hash({c: settings[c] for c in SETTINGS}, n=16)
        if key in self.done:
            return
        t0 = time.perf_counter()
        fitted = fitted_fn()
        reference = self.ref
        if grid in ("full", "ref"):
            res = score_fitted(self.model, self.task, self.items, fitted, reference=reference,
                               labels=self.labels)
            res = {m: res[m] for m in METRICS if m in res}
            if grid == "full":  # the cheap path must agree with the bench's
                cheap = self.cheap.score(fitted.hooks(self.model, None), reference)
                for m in ("first_token_acc", "label_acc_first"):
                    if m in cheap and abs(cheap[m] - res[m]) > 0.011:  # one item in 100
                        raise AssertionError(f"{m}: cheap {cheap[m]} vs full {res[m]}")
        else:
            res = self.cheap.score(fitted.hooks(self.model, None), reference)
        row = dict(settings, key=key, **res, **extra_fn(), final_block=self.L - 1,
                   seconds=round(time.perf_counter() - t0, 2))
        ResultsStore(self.out, COLUMNS).append([row])
        self.done.add(key)
        print(f"{self.task.name} {grid} {variant} ℓ={layer} λ={lam:g} N={n} k={k}: "
              f"first {res['first_token_acc']:.2f} label {res.get('label_acc_first', float('nan')):.2f} "
              f"dNTP {res['dntp']:.2f} ({row['seconds']} s)", flush=True)

    def map_cell(self, grid, variant, layer, lam, n, k, X, Y, Xt, Yt, valid_acc=float("nan"),
                 chosen=None, rel=None):
        Xl, Yl = X[:n, layer], Y[:n, layer]  # [n, d_model]
        scale = float((Xl ** 2).sum() / Xl.shape[1])  # tr XᵀX / d
        if rel is not None:  # λ in units of the data; rounded so the key survives a re-capture
            lam = float(f"{rel * scale:.6g}")
        W, xm, ym = fit_variant(Xl, Yl, lam, variant)

        def extra():
            P = predict(W, xm, ym, Xt[:, layer])
            return {"valid_acc": valid_acc, "rel_lam": lam / scale,
                    "r2_train": r2(Yl, predict(W, xm, ym, Xl)), "r2_test": r2(Yt[:, layer], P),
                    "norm_ratio": float(P.norm(dim=-1).mean() / Yt[:, layer].norm(dim=-1).mean()),
                    "chosen_block": chosen}

        self.cell(grid, variant, layer, lam, n, k,
                  lambda: Fitted("ltv", intervention=intervention(W, xm, ym, layer, variant)),
                  extra)

    def run(self, grids=("ref", "layer", "full", "lam", "lam_rel", "n", "k")):
        model, task, L = self.model, self.task, self.L
        if "ref" in grids:
            for name in ("zero-shot", "icl"):
                self.cell("ref", name, -1, float("nan"), 0, N_SHOTS if name == "icl" else 0,
                          lambda name=name: get_method(name).fit(model, task, seed=SEED))
        X, Y = train_states(model, task, N_SHOTS)
        Xt, Yt = test_states(model, task, self.items)
        Ws = {ell: ridge_closed_form(X[:, ell], Y[:, ell], LAM).to(model.cfg.device)
              for ell in range(L)}
        chosen, table = select_layer(model, valid_items(task, SWEEP_N_VALID),
                                     lambda ell: ltv_intervention(Ws[ell], ell)(model, None),
                                     list(range(L)))
        vacc = {r["layer"]: r["valid_acc"] for r in table}
        print(f"{task.name}: block chosen on valid = {chosen} (final {L - 1})", flush=True)
        blocks = sorted({L - 1, chosen})
        if "layer" in grids:
            for ell in range(L):
                for variant in ("ltv", "ltv+b", "shift"):
                    self.map_cell("layer", variant, ell, LAM, N_QUERIES, N_SHOTS, X, Y, Xt, Yt,
                                  valid_acc=vacc[ell] if variant == "ltv" else float("nan"),
                                  chosen=chosen)
        if "full" in grids:
            for ell in blocks:
                for variant in ("ltv", "ltv+b", "shift"):
                    self.map_cell("full", variant, ell, LAM, N_QUERIES, N_SHOTS, X, Y, Xt, Yt,
                                  valid_acc=vacc[ell] if variant == "ltv" else float("nan"),
                                  chosen=chosen)
        for ell in blocks:
            if "lam" in grids:
                for lam in LAMS:
                    for variant in ("ltv", "ltv+b"):
                        self.map_cell("lam", variant, ell, lam, N_QUERIES, N_SHOTS, X, Y, Xt, Yt,
                                      chosen=chosen)
            if "lam_rel" in grids:
                for rel in LTVValid.rel_lams:
                    for variant in ("ltv", "ltv+b"):
                        self.map_cell("lam_rel", variant, ell, None, N_QUERIES, N_SHOTS, X, Y,
                                      Xt, Yt, chosen=chosen, rel=rel)
            if "n" in grids:
                for n in NS:
                    for variant in ("ltv", "ltv+b"):
                        self.map_cell("n", variant, ell, LAM, n, N_SHOTS, X, Y, Xt, Yt,
                                      chosen=chosen)
        if "k" in grids:
            for k in KS:
                Xk, Yk = (X, Y) if k == N_SHOTS else train_states(model, task, k)
                for ell in blocks:
                    for variant in ("ltv", "ltv+b"):
                        self.map_cell("k", variant, ell, LAM, N_QUERIES, k, Xk, Yk, Xt, Yt,
                                      chosen=chosen)


# ----------------------------------------------------------------------------------------------
# report



def _f(x, digits: int = 2) -> str:
    return "–" if pd.isna(x) else f"{x:.{digits}f}"


def _layer_table(lay: pd.DataFrame, chosen: int) -> str:
    rows = []
    for ell, g in lay.groupby("layer"):
        v = g.set_index("variant")

        def get(variant, col, v=v):
            return v[col].get(variant, float("nan"))

        rows.append({
            "block": f"**{ell}**" if ell == chosen else str(ell),
            "valid first (ltv)": pct(get("ltv", "valid_acc")),
            **{f"label {x}": pct(get(x, "label_acc_first")) for x in ("ltv", "ltv+b", "shift")},
            **{f"dNTP {x}": _f(get(x, "dntp")) for x in ("ltv", "ltv+b", "shift")},
            "R² test ltv": _f(get("ltv", "r2_test")), "R² test ltv+b": _f(get("ltv+b", "r2_test")),
        })
    return md_table(pd.DataFrame(rows))


def _knob_table(s: pd.DataFrame, knob: str, label: str) -> str:
    rows = []
    for (ell, variant, v), r in s.groupby(["layer", "variant", knob]):
        r = r.iloc[0]
        rows.append({"block": ell, "variant": variant, label: f"{v:g}",
                     "λ / (tr XᵀX/d)": f"{r.rel_lam:.2g}", "label": pct(r.label_acc_first),
                     "first": pct(r.first_token_acc), "dNTP": _f(r.dntp),
                     "R² train": _f(r.r2_train), "R² test": _f(r.r2_test),
                     "‖pred‖/‖true‖": _f(r.norm_ratio)})
    return md_table(pd.DataFrame(rows))


def _full_table(t: pd.DataFrame) -> str:
    rows = []
    for r in t[t["grid"].isin(["ref", "full"])].itertuples():
        rows.append({"cell": r.variant if r.grid == "ref" else f"{r.variant} @ block {r.layer}",
                     "label (full)": pct(r.label_acc_full), "label (first)": pct(r.label_acc_first),
                     "label (norm)": pct(r.label_acc_full_norm), "first": pct(r.first_token_acc),
                     "EM": pct(r.exact_match), "dNTP": _f(r.dntp), "chance": pct(r.chance)})
    return md_table(pd.DataFrame(rows))


def report(df: pd.DataFrame) -> str:
    lines = [
        "# LTV sweep: block, λ, N, k on cls tasks", "",
        "`python benchmarks/ltv_sweep.py` (see its docstring; test items capped at the first "
        "`--limit` of each task, per section). Accuracies in %. "
        "`label` = first-token label ranking (the label whose first token has the highest "
        "logit), `first` = first-token accuracy, dNTP = KL(P_icl ‖ P_method) at the answer "
        "position against the 10-shot ICL reference; the `full` rows add the bench's whole "
        "scoring (full-label and length-normalized ranking, exact match `EM` of the greedy "
        "generation). `ltv` is the method (h ← h + W h), `ltv+b` the same ridge with an "
        "intercept (h ← h + W (h − x̄) + ȳ), `shift` the mean demonstration effect alone "
        "(h ← h + ȳ). R² test: the share of the test items' demonstration effect "
        "(h_icl − h_zs, same demonstrations as the reference) that the map predicts.", "",
    ]
    for (model, limit), g in df.groupby(["model", "limit"], sort=False):
        lines += [f"## {model}, first {int(limit)} test items", ""]
        for task, t in g.groupby("task", sort=False):
            lines += [f"### {task}", "", _full_table(t), ""]
            lay = t[t["grid"] == "layer"]
            if len(lay):
                chosen = int(lay["chosen_block"].dropna().iloc[0])
                lines += [f"Block sweep (λ = {LAM:g}, N = {N_QUERIES}, k = {N_SHOTS}; bold: the "
                          f"block chosen on valid; final block {int(lay['final_block'].iloc[0])}):",
                          "", _layer_table(lay, chosen), ""]
            for grid, knob, label, title in (
                    ("lam", "lam", "λ", "λ sweep (raw units, LTV's own grid)"),
                    ("lam_rel", "lam", "λ", "λ sweep in units of the data (λ = r · tr XᵀX/d, "
                     "r over `ltv-valid`'s grid)"),
                    ("n", "n_queries", "N", "N sweep"), ("k", "n_shots", "k", "k sweep")):
                s = t[t["grid"] == grid]
                if len(s):
                    lines += [f"{title}:", "", _knob_table(s, knob, label), ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="smollm2-135m-instruct")
    ap.add_argument("--tasks", default="sst2,agnews,trec")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "ltv_sweep.csv"))
    ap.add_argument("--report", action="store_true", help="only rewrite the markdown")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.report:
        torch.set_num_threads(args.threads)
        for name in args.models.split(","):
            model = sl.load_model(name)
            for t in args.tasks.split(","):
                Sweep(model, load_task(Path(args.data) / t), args.limit, out).run()
                atomic_write_text(out.with_suffix(".md"), report(read_rows(out)))
            del model
    md = report(read_rows(out))
    atomic_write_text(out.with_suffix(".md"), md)
    print(md, file=sys.stderr if not args.report else sys.stdout)


if __name__ == "__main__":
    main()
