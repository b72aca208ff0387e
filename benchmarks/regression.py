"""In-context regression: MSE of zero-shot, ICL, TV, LTV, ltv-valid and SITE (and the model-free
``train-mean`` and ``ols-k``) on seeded linear and ReLU regression tasks (setup: docs/benchmarks.md).

    python benchmarks/regression.py --seeds 0 --threads 1  # resumable -> regression{,_items}.csv, .md
    python benchmarks/regression.py --tiny --out /tmp/reg  # smoke test on a tiny random model
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from sitelens.baselines import ICL, LTV, SITE, TV, Fitted, LTVValid, ZeroShot
from sitelens.baselines.ltv import LTV_NUMERICS
from sitelens.errors import SitelensError
from sitelens.eval.evaluation import run_method
from sitelens.eval.metrics import correlation
from sitelens.models import fingerprint, model_name
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, main, md_table
from sitelens.pipelines.store import row_key
from sitelens.pipelines.transfer import task_states, tv_fitted
from sitelens.provenance import NUMERICS_VERSION, canonical, task_hash
from sitelens.site import FitConfig, fit_site
from sitelens.stats import bootstrap_ci
from sitelens.tasks import DEFAULT_TEMPLATE
from sitelens.tasks.regression import (
    reference_predictions,
    regression_mse,
    regression_task,
    squared_errors,
    train_mean,
)
from sitelens.testing import tiny_model

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
METHODS = ("zero-shot", "icl", "tv", "ltv", "ltv-valid", "site")
REFERENCES = ("train-mean", "ols-k")
COLUMNS = [
    "model", "fingerprint", "task", "task_hash", "kind", "dim", "seed", "method", "method_params",
    "n_shots", "limit", "template", "numerics_version", "ltv_source", "key",
    "n", "mse", "mse_lo", "mse_hi", "n_unparsed", "fallback", "first_token_acc", "fit_seconds",
    "seconds_per_item", "error",
]
ITEM_COLUMNS = ["key", "model", "task", "method", "item", "target", "prediction", "value", "sq_err"]


def make_task(args, kind: str, seed: int):
    sizes = dict(n_train=40, n_valid=8, n_test=8) if args.tiny else dict(n_train=256, n_valid=64, n_test=128)
    return regression_task(kind, dim=args.dim, seed=seed, **sizes)


def make_method(args, name: str):
    t = args.tiny  # small fits on the tiny model
    return {"zero-shot": ZeroShot(), "icl": ICL(n_shots=args.n_shots),
            "tv": TV(n_prompts=4, n_shots=2, n_valid=4) if t else TV(),
            "ltv": LTV(n_queries=8, n_shots=2) if t else LTV(),
            "ltv-valid": LTVValid(n_queries=8, n_shots=2) if t else LTVValid(),
            "site": SITE(n_prompts=4, n_shots=2, config=FitConfig(n_examples=16, n_valid=4)) if t
            else SITE()}[name]


def settings(args, model, task, kind, seed, method_name, method_params) -> dict:
    """Everything that made a row, and its key; LTV rows carry LTV's declared numerics version."""
    s = {
        "model": model_name(model) if model is not None else "-",
        "fingerprint": fingerprint(model) if model is not None else "-",
        "task": task.name, "task_hash": task_hash(task), "kind": kind, "dim": args.dim, "seed": seed,
        "method": method_name, "method_params": method_params, "n_shots": args.n_shots,
        "limit": args.limit, "template": json.dumps(DEFAULT_TEMPLATE.to_dict(), sort_keys=True),
        "numerics_version": NUMERICS_VERSION,
        "ltv_source": LTV_NUMERICS if method_name.startswith("ltv") else "",
    }
    return dict(s, key=row_key(s))


def score_rows(base: dict, task, items, predictions, first_ok, fallback, *, fit_seconds=0.0,
               seconds_per_item=0.0):
    targets = [ex.output for ex in items]
    score = regression_mse(predictions, targets, fallback=fallback)
    values, err = squared_errors(predictions, targets, fallback)
    assert math.isclose(float(err.mean()), score.mse, rel_tol=1e-9, abs_tol=1e-12)
    lo, hi = bootstrap_ci(err, n_boot=1000, seed=0)
    row = dict(base, n=score.n, mse=score.mse, mse_lo=lo, mse_hi=hi, n_unparsed=score.n_unparsed,
               fallback=fallback, first_token_acc=float(np.mean(first_ok)) if first_ok is not None else "",
               fit_seconds=fit_seconds, seconds_per_item=seconds_per_item, error="")
    items_rows = [{"key": base["key"], "model": base["model"], "task": task.name,
                   "method": base["method"], "item": i, "target": t, "prediction": p,
                   "value": "" if v is None else v, "sq_err": e}
                  for i, (t, p, v, e) in enumerate(zip(targets, predictions, values, err))]
    return row, items_rows


def fit_method(model, task, method, seed: int, shared: dict):
    """``method.fit``; TV and SITE share one stage-1 capture (:func:`sitelens.pipelines.transfer.task_states`,
    the very prompts and tensors of their own fits), kept in ``shared`` with its seconds, which
    count in both fits' ``fit_seconds``."""
    if not isinstance(method, (TV, SITE)) or (isinstance(method, TV) and method.layers is not None):
        return method.fit(model, task, seed=seed)
    sizes = (method.n_prompts, method.n_shots)
    if shared.get("sizes") != sizes:
        t0 = time.perf_counter()
        shared.update(sizes=sizes, states=task_states(model, task, n_prompts=sizes[0], n_shots=sizes[1],
                                                      seed=seed), seconds=time.perf_counter() - t0)
    st = shared["states"]
    if isinstance(method, TV):
        return tv_fitted(model, task, st["tv"], n_valid=method.n_valid, name=method.name)
    ad = fit_site(model, task, n_prompts=method.n_prompts, n_shots=method.n_shots,
                  config=replace(method.config, seed=seed), embedding=st["embedding"])
    L, H, _ = ad.embedding.shape
    return Fitted(method.name, intervention=ad.mix(), n_params=L * H, state={"adapter": ad})


def run_method_cell(model, task, method, items, base, shared):
    t0 = time.perf_counter()
    try:
        fitted = fit_method(model, task, method, base["seed"], shared)
        fit_seconds = time.perf_counter() - t0 + (shared.get("seconds", 0.0)
                                                  if base["method"] in ("tv", "site") else 0.0)
        df = run_method(model, task, items, method.name, prompts=fitted.prompts(items, DEFAULT_TEMPLATE),
                        intervention=fitted.intervention, template=DEFAULT_TEMPLATE, labels=None)
    except SitelensError as e:
        return dict(base, error=f"{type(e).__name__}: {e}", fit_seconds=time.perf_counter() - t0), []
    return score_rows(base, task, items, df["prediction"].tolist(), df["first_token_correct"].to_numpy(),
                      train_mean(task), fit_seconds=fit_seconds,
                      seconds_per_item=float(df["seconds_per_item"].iloc[0]))


class Regression(Experiment):
    name = "regression"
    title = "In-context regression: MSE of zero-shot, ICL, TV, LTV and SITE"
    columns = COLUMNS
    models = MODELS
    limit = 100

    def add_arguments(self, p) -> None:
        p.add_argument("--kinds", default="linear,relu")
        p.add_argument("--seeds", default="0,1", help="more seeds append cells")
        p.add_argument("--methods", default=",".join(METHODS))
        p.add_argument("--dim", type=int, default=2)
        p.add_argument("--n-shots", type=int, default=10)
        p.add_argument("--tiny", action="store_true", help="tiny random model, small sizes (smoke test)")

    def model(self, name: str):
        return tiny_model(seed=0) if self.args.tiny else cached_model(name)

    def cells(self, args):
        self._shared: dict = {}
        for seed in [int(x) for x in args.seeds.split(",") if x]:  # seed-major: every task and model early
            for kind in [k for k in args.kinds.split(",") if k]:
                task = make_task(args, kind, seed)
                for ref in REFERENCES:
                    base = settings(args, None, task, kind, seed, ref, "{}")
                    yield Job(base["key"], f"{task.name}/{ref}", dict(base=base, kind=kind, seed=seed))
                for name in args.models:
                    model = self.model(name)
                    for mname in [m for m in args.methods.split(",") if m]:
                        params = json.dumps(canonical(make_method(args, mname)), sort_keys=True,
                                            separators=(",", ":"))
                        base = settings(args, model, task, kind, seed, mname, params)
                        yield Job(base["key"], f"{base['model']}/{task.name}/{mname}",
                                  dict(base=base, kind=kind, seed=seed, name=name))

    def run(self, job: Job) -> dict:
        args, base = self.args, job["base"]
        task = make_task(args, job["kind"], job["seed"])
        items = task.test[: args.limit]
        if base["model"] == "-":
            preds = reference_predictions(task, items, base["method"], args.n_shots, job["seed"])
            row, irows = score_rows(base, task, items, preds, None, train_mean(task))
        else:
            shared = self.__dict__.setdefault("_shared", {}).setdefault((job["name"], task.name), {})
            row, irows = run_method_cell(self.model(job["name"]), task, make_method(args, base["method"]),
                                         items, base, shared)
        if irows:
            self.store("regression_items", ITEM_COLUMNS, key=None).append(irows)
        return row

    def read(self) -> pd.DataFrame:
        return self.store().read(dtype={"error": str}, keep_default_na=False, na_values=[""])

    def report(self, df: pd.DataFrame) -> str:
        # one row per (model, task, method): the last one written (a rerun under new settings appends)
        df = df.drop_duplicates(["model", "task", "method"], keep="last")
        return report(self.args, df, pd.read_csv(self.out / "regression_items.csv"))


def pooled(items: pd.DataFrame, keys: list[str]) -> dict:
    """MSE of the items of ``keys`` pooled, its bootstrap CI, the median squared error and the
    mean over tasks of the Pearson r of parsed answers (unparsed left out) and targets."""
    sel = items[items["key"].isin(keys)]
    err = sel["sq_err"].to_numpy(float)
    lo, hi = bootstrap_ci(err, n_boot=1000, seed=0)
    rs = [correlation(g["value"], g["target"]) for _, g in sel.dropna(subset=["value"]).groupby("key")]
    rs = [r for r in rs if np.isfinite(r)]
    return {"mse": float(err.mean()) if err.size else float("nan"), "lo": lo, "hi": hi, "n": err.size,
            "median": float(np.median(err)) if err.size else float("nan"),
            "r": float(np.mean(rs)) if rs else float("nan")}


def report(args, df: pd.DataFrame, items: pd.DataFrame) -> str:
    ok = df[df["error"].fillna("") == ""]
    models = [m for m in MODELS if m in set(ok.model)] + sorted(set(ok.model) - set(MODELS) - {"-"})
    ltv = sorted(set(ok.loc[ok.method.str.startswith("ltv"), "ltv_source"].dropna()))
    seeds, ltv = ", ".join(map(str, sorted(set(ok.seed)))), ", ".join(f"`{v}`" for v in ltv) or "–"
    lines = [f"`regression_task(kind, dim={args.dim}, seed)`, seeds {seeds}; the first {args.limit} test "
             f"items per task; {args.n_shots}-shot ICL; LTV version {ltv}; "
             "tasks, methods and columns: docs/benchmarks.md; each task's MSE: `regression.csv`.", ""]
    for kind in [k for k in ("linear", "relu") if k in set(ok.kind)]:
        rows = []
        for model in ["-", *models]:
            for m in REFERENCES if model == "-" else METHODS:
                g = ok[(ok.kind == kind) & (ok.model == model) & (ok.method == m)]
                if not len(g):
                    continue
                p, ref = pooled(items, g["key"].tolist()), model == "-"
                rows.append({
                    "model": "(no model)" if ref else model, "method": m, "tasks": len(g),
                    "MSE (95% CI)": f"{p['mse']:.3f} ({p['lo']:.3f}–{p['hi']:.3f})",
                    "median SE": f"{p['median']:.3f}", "r(answer, f(x))": f"{p['r']:.2f}",
                    "unparsed": "–" if ref else f"{int(g.n_unparsed.sum())} / {int(g.n.sum())}",
                    "first-token acc": "–" if ref else f"{g.first_token_acc.astype(float).mean():.2f}",
                    "fit s": "–" if ref else f"{g.fit_seconds.astype(float).mean():.0f}"})
        lines += [f"## {kind} regression (dim {args.dim})", "", md_table(pd.DataFrame(rows)), ""]
    failed = df[df["error"].fillna("") != ""]
    if len(failed):
        lines += [f"{len(failed)} cell(s) failed: " + "; ".join(
            f"{r.model}/{r.task}/{r.method}: {r.error}" for r in failed.itertuples()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main(Regression()))
