"""LTV's robustness to its choices: the block ℓ, the ridge λ, the number of queries N and of
demonstrations k, on classification tasks (``{data-root}/cls``), with diagnostics of why.

    python benchmarks/ltv_sweep.py --models smollm2-135m-instruct --tasks sst2 --limit 50 --threads 1
    python benchmarks/ltv_sweep.py --report   # the markdown from the CSV alone

The grid (``layer``, ``lam``, ``lam_rel``, ``n``, ``k``, ``full``, ``ref``; variants ``ltv``,
``ltv+b``, ``shift``), the cheap first-token scoring and the diagnostics: docs/benchmarks.md,
"ltv_sweep.py". Resumable: a row is keyed on everything that made it (model fingerprint, task hash,
grid, variant, block, λ, N, k, seed, limit, numerics version); states are cached under
``runs/ltv_sweep_cache/``.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import torch

from sitelens.baselines import LTVValid, get_method
from sitelens.baselines.base import Fitted, select_layer
from sitelens.baselines.ltv import (
    SWEEP_N_VALID,
    affine_intervention,
    ltv_data,
    ltv_intervention,
    ridge_closed_form,
)
from sitelens.baselines.ltv_variants import FirstTokens, fit_variant, predict, r2
from sitelens.eval.labels import label_set
from sitelens.eval.scoring import reference_logits
from sitelens.models import act_name, fingerprint, model_name
from sitelens.pipelines.bench import score_fitted
from sitelens.pipelines.experiment import REPO, Experiment, Job, main, md_table, pct
from sitelens.pipelines.store import ObjectCache, row_key
from sitelens.provenance import NUMERICS_VERSION, task_hash
from sitelens.site import capture_last
from sitelens.site.training import valid_items
from sitelens.tasks import few_shot_prompts, load_task, zero_shot_prompt

CACHE = ObjectCache(REPO / "runs" / "ltv_sweep_cache")
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


class Sweep:
    """One model and task: its settings, and (computed once, on demand) the reference logits, the
    first-token scorer and LTV's states with the block chosen on valid."""

    def __init__(self, model, task, limit: int):
        self.model, self.task, self.items, self.L = model, task, task.test[:limit], model.cfg.n_layers
        self.base = {"model": model_name(model), "fingerprint": fingerprint(model), "task": task.name,
                     "task_hash": task_hash(task), "seed": SEED, "limit": limit,
                     "numerics_version": NUMERICS_VERSION}
        self.tag = f"{model_name(model)}-{fingerprint(model)[:12]}-{task.name}-{task_hash(task)}"
        self.labels = label_set(task)
        self._ref = self._cheap = self._states = None

    @property
    def ref(self):
        if self._ref is None:
            self._ref = reference_logits(self.model, self.task, self.items, n_shots=N_SHOTS, seed=SEED)
        return self._ref

    @property
    def cheap(self) -> FirstTokens:
        if self._cheap is None:
            self._cheap = FirstTokens(self.model, self.items, self.labels)
        return self._cheap

    def train_states(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """LTV's own X, Y at every block (N_QUERIES queries, k shots, the method's seeds)."""
        return CACHE.get(f"{self.tag}-train-k{k}-n{N_QUERIES}-s{SEED}", {}, lambda: ltv_data(
            self.model, self.task, range(self.L), n_queries=N_QUERIES, n_shots=k, seed=SEED))

    def test_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """X, Y of the test items: zero-shot vs the ICL reference's 10-shot prompts (seed 0)."""
        def make():
            names = [act_name("resid_post", ell) for ell in range(self.L)]
            hz = capture_last(self.model, [zero_shot_prompt(ex.input) for ex in self.items], names)
            hi = capture_last(self.model, few_shot_prompts(self.task, self.items, N_SHOTS, seed=SEED), names)
            X = torch.stack([hz[n] for n in names], 1)  # [n, n_layers, d_model]
            return X, torch.stack([hi[n] for n in names], 1) - X  # [n, n_layers, d_model]

        return CACHE.get(f"{self.tag}-test-n{len(self.items)}-s{SEED}", {}, make)

    def states(self) -> dict:
        """X, Y (k = 10), the test items' Xt, Yt, the block chosen on valid and each block's valid
        accuracy (``LTV(layer="sweep")``'s choice)."""
        if self._states is None:
            X, Y = self.train_states(N_SHOTS)
            Ws = {ell: ridge_closed_form(X[:, ell], Y[:, ell], LAM).to(self.model.cfg.device)
                  for ell in range(self.L)}
            chosen, table = select_layer(self.model, valid_items(self.task, SWEEP_N_VALID),
                                         lambda ell: ltv_intervention(Ws[ell], ell)(self.model, None),
                                         list(range(self.L)))
            print(f"{self.task.name}: block chosen on valid = {chosen} (final {self.L - 1})", flush=True)
            self._states = dict(X=X, Y=Y, test=self.test_states(), chosen=chosen,
                                vacc={r["layer"]: r["valid_acc"] for r in table})
        return self._states

    def choices(self, recorded: pd.DataFrame, dry_run: bool):
        """(the block chosen on valid, rel -> λ per block) from the recorded rows of these settings,
        else from the states (``None`` in a dry run)."""
        b = self.base
        same = [recorded[c] == b[c] for c in ("fingerprint", "task_hash", "limit", "numerics_version")]
        rec = recorded[same[0] & same[1] & same[2] & same[3]]
        chosen = rec.chosen_block.dropna()
        if len(chosen):
            rel = rec[rec.grid == "lam_rel"]

            def lam(ell, r):
                hit = rel[(rel.layer == ell) & np.isclose(rel.rel_lam.astype(float), r, rtol=1e-4)]
                return float(hit.lam.iloc[0]) if len(hit) else self.rel_lam(ell, r)

            return int(chosen.iloc[0]), lam
        if dry_run:
            return None, None
        return self.states()["chosen"], self.rel_lam

    def rel_lam(self, ell: int, rel: float) -> float:
        """λ = rel · tr XᵀX / d at block ``ell``, rounded so the key survives a re-capture."""
        Xl = self.states()["X"][:N_QUERIES, ell]
        return float(f"{rel * float((Xl ** 2).sum() / Xl.shape[1]):.6g}")


class LTVSweep(Experiment):
    name, title = "ltv_sweep", "LTV sweep: block, λ, N, k on cls tasks"
    columns = COLUMNS
    models = ("smollm2-135m-instruct",)
    tasks = ("sst2", "agnews", "trec")
    limit = 100

    def add_arguments(self, p) -> None:
        p.add_argument("--grids", default="ref,layer,full,lam,lam_rel,n,k", help="comma-separated")

    def read(self) -> pd.DataFrame:
        return self.store().read(dtype={"key": str, "task": str, "model": str})

    def cells(self, args):
        from sitelens.pipelines.executors import cached_model

        grids, recorded = args.grids.split(","), self.read()
        self.sweeps: dict = {}
        for name in args.models:
            for t in args.tasks:
                sw = Sweep(cached_model(name), load_task(args.data_root / "cls" / t), args.limit)
                self.sweeps[name, t] = sw

                def job(grid, variant, layer, lam, n, k, sw=sw, at=(name, t), **extra):
                    s = dict(sw.base, grid=grid, variant=variant, layer=layer, lam=lam, n_queries=n,
                             n_shots=k)
                    return Job(row_key({c: s[c] for c in SETTINGS}),
                               f"{'/'.join(at)} {grid} {variant} ℓ={layer} λ={lam:g} N={n} k={k}",
                               dict(sweep=at, settings=s, **extra))

                if "ref" in grids:
                    for m in ("zero-shot", "icl"):
                        yield job("ref", m, -1, float("nan"), 0, N_SHOTS if m == "icl" else 0)
                chosen, lam_of = sw.choices(recorded, args.dry_run)
                if chosen is None:
                    print(f"  {name}/{t}: the cells after the block choice are listed once its states "
                          "are captured", flush=True)
                    continue
                blocks, L = sorted({sw.L - 1, chosen}), sw.L
                for grid, ells in (("layer", range(L)), ("full", blocks)):
                    if grid in grids:
                        for ell in ells:
                            for v in ("ltv", "ltv+b", "shift"):
                                yield job(grid, v, ell, LAM, N_QUERIES, N_SHOTS, chosen=chosen)
                for ell in blocks:
                    for grid, vals in (("lam", LAMS), ("lam_rel", LTVValid.rel_lams), ("n", NS)):
                        if grid in grids:
                            for x in vals:
                                for v in ("ltv", "ltv+b"):
                                    lam = {"lam": x, "lam_rel": lam_of(ell, x) if grid == "lam_rel" else 0,
                                           "n": LAM}[grid]
                                    yield job(grid, v, ell, lam, x if grid == "n" else N_QUERIES, N_SHOTS,
                                              chosen=chosen)
                if "k" in grids:
                    for k in KS:
                        for ell in blocks:
                            for v in ("ltv", "ltv+b"):
                                yield job("k", v, ell, LAM, N_QUERIES, k, chosen=chosen)

    def run(self, job: Job) -> dict:
        sw, s = self.sweeps[job["sweep"]], job["settings"]
        grid, variant, ell = s["grid"], s["variant"], s["layer"]
        t0, extra = time.perf_counter(), {}
        if grid == "ref":
            fitted = get_method(variant).fit(sw.model, sw.task, seed=SEED)
        else:
            st = sw.states()
            X, Y = (st["X"], st["Y"]) if s["n_shots"] == N_SHOTS else sw.train_states(s["n_shots"])
            Xl, Yl = X[:s["n_queries"], ell], Y[:s["n_queries"], ell]  # [n, d_model]
            W, xm, ym = fit_variant(Xl, Yl, s["lam"], variant)
            Xt, Yt = (x[:, ell] for x in st["test"])
            P = predict(W, xm, ym, Xt)
            full_ltv = grid in ("layer", "full") and variant == "ltv"
            extra = {"valid_acc": st["vacc"][ell] if full_ltv else math.nan,
                     "rel_lam": s["lam"] / float((Xl ** 2).sum() / Xl.shape[1]),
                     "r2_train": r2(Yl, predict(W, xm, ym, Xl)), "r2_test": r2(Yt, P),
                     "norm_ratio": float(P.norm(dim=-1).mean() / Yt.norm(dim=-1).mean()),
                     "chosen_block": job["chosen"]}
            fitted = Fitted("ltv", intervention=ltv_intervention(W, ell) if variant == "ltv"
                            else affine_intervention(W, ell, x_mean=xm, bias=ym))
        if grid in ("full", "ref"):
            res = score_fitted(sw.model, sw.task, sw.items, fitted, reference=sw.ref, labels=sw.labels)
            res = {m: res[m] for m in METRICS if m in res}
            if grid == "full":  # the cheap path must agree with the bench's
                cheap = sw.cheap.score(fitted.hooks(sw.model, None), sw.ref)
                for m in ("first_token_acc", "label_acc_first"):
                    if m in cheap and abs(cheap[m] - res[m]) > 0.011:  # one item in 100
                        raise AssertionError(f"{m}: cheap {cheap[m]} vs full {res[m]}")
        else:
            res = sw.cheap.score(fitted.hooks(sw.model, None), sw.ref)
        print(f"  {job.label}: first {res['first_token_acc']:.2f} label "
              f"{res.get('label_acc_first', math.nan):.2f} dNTP {res['dntp']:.2f}", flush=True)
        return dict(s, key=job.key, **res, **extra, final_block=sw.L - 1,
                    seconds=round(time.perf_counter() - t0, 2))

    def report(self, df: pd.DataFrame) -> str:
        def f(x) -> str:
            return "–" if pd.isna(x) else f"{x:.2f}"

        def knob(r, col, label) -> dict:
            return {"block": r.layer, "variant": r.variant, label: f"{getattr(r, col):g}",
                    "λ / (tr XᵀX/d)": f"{r.rel_lam:.2g}", "label": pct(r.label_acc_first),
                    "first": pct(r.first_token_acc), "dNTP": f(r.dntp), "R² train": f(r.r2_train),
                    "R² test": f(r.r2_test), "‖pred‖/‖true‖": f(r.norm_ratio)}

        def full(r) -> dict:
            return {"cell": r.variant if r.grid == "ref" else f"{r.variant} @ block {r.layer}",
                    "label (full)": pct(r.label_acc_full), "label (first)": pct(r.label_acc_first),
                    "label (norm)": pct(r.label_acc_full_norm), "first": pct(r.first_token_acc),
                    "EM": pct(r.exact_match), "dNTP": f(r.dntp), "chance": pct(r.chance)}

        def block(ell, g, chosen) -> dict:
            v = g.set_index("variant")

            def get(variant, col):
                return v[col].get(variant, float("nan"))

            return {"block": f"**{ell}**" if ell == chosen else str(ell),
                    "valid first (ltv)": pct(get("ltv", "valid_acc")),
                    **{f"label {x}": pct(get(x, "label_acc_first")) for x in ("ltv", "ltv+b", "shift")},
                    **{f"dNTP {x}": f(get(x, "dntp")) for x in ("ltv", "ltv+b", "shift")},
                    "R² test ltv": f(get("ltv", "r2_test")), "R² test ltv+b": f(get("ltv+b", "r2_test"))}

        lines = ["Accuracies in %; `label`: first-token label ranking, `first`: first-token accuracy, dNTP "
                 "against the 10-shot ICL reference; `full` rows are scored by the bench in full. Grids and "
                 "diagnostics: docs/benchmarks.md, \"ltv_sweep.py\"; findings: docs/results.md.", ""]
        knobs = (("lam", "lam", "λ", "λ sweep (raw units)"),
                 ("lam_rel", "lam", "λ", "λ sweep in units of the data (λ = r · tr XᵀX/d)"),
                 ("n", "n_queries", "N", "N sweep"), ("k", "n_shots", "k", "k sweep"))
        for (model, limit), g in df.groupby(["model", "limit"], sort=False):
            lines += [f"## {model}, first {int(limit)} test items", ""]
            for task, t in g.groupby("task", sort=False):
                ref = t[t["grid"].isin(["ref", "full"])]
                lines += [f"### {task}", "", md_table(pd.DataFrame([full(r) for r in ref.itertuples()])), ""]
                if len(lay := t[t["grid"] == "layer"]):
                    chosen = int(lay["chosen_block"].dropna().iloc[0])
                    lines += [f"Block sweep (λ = {LAM:g}, N = {N_QUERIES}, k = {N_SHOTS}; bold: chosen on "
                              f"valid; final block {int(lay['final_block'].iloc[0])}):", "",
                              md_table(pd.DataFrame([block(e, b, chosen) for e, b in lay.groupby("layer")])),
                              ""]
                for grid, col, label, title in knobs:
                    if len(s := t[t["grid"] == grid]):
                        rows = [knob(r.iloc[0], col, label) for _, r in s.groupby(["layer", "variant", col])]
                        lines += [f"{title}:", "", md_table(pd.DataFrame(rows)), ""]
        return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(LTVSweep()))
