"""Cross-model transfer: task vectors extracted from Gemma-3-270M (d_model 640, 18 layers) applied to
SmolLM2-135M (576, 30 layers) through a linear map between their residual streams; and the two
models' α maps compared by relative depth.

    python benchmarks/cross_model.py --threads 1             # resumable; the same command continues
    python benchmarks/cross_model.py --report                # cross_model.md from the CSVs only
    python benchmarks/cross_model.py --only sst2,antonym     # some evaluation tasks now, the rest later
    python benchmarks/cross_model.py --tiny --out /tmp/xm    # smoke test on two tiny random models
Definitions: docs/benchmarks.md, "cross_model.py". Fits and states are cached (keyed) under runs/cross_model/.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sitelens.baselines.ltv import LTV_NUMERICS
from sitelens.pipelines.experiment import REPO, RESULTS, Experiment, Job, main, md_table, pct
from sitelens.pipelines.store import ObjectCache

SRC, DST = "gemma-3-270m", "smollm2-135m-instruct"
FV_TASKS = ("antonym", "country-capital", "present-past", "english-french", "singular-plural",
            "capitalize_first_letter", "person-occupation", "choose_first_of_3")
CLS_TASKS = ("sst2", "trec", "agnews")
DST_METHODS = ("zero-shot", "tv", "ltv", "site", "tv-transfer", "tv-transfer-valid", "tv-transfer-shuffled",
               "ltv-transfer", "site-transfer", "site-transfer-own-alpha", "site-transfer-shuffled")
SRC_METHODS = ("zero-shot", "tv", "ltv", "site")
COLUMNS = [
    "model", "fingerprint", "source_model", "task", "collection", "task_hash", "method", "settings",
    "numerics_version", "ltv_source", "key", "n", "first_token_acc", "exact_match", "label_acc_first",
    "label_acc_full", "label_acc_full_norm", "chance", "layer_src", "layer_dst", "map_r2_heldout",
    "map_r2_task", "tv_rel_err", "fit_seconds", "seconds_per_item", "error"]
ITEM_COLUMNS = ["key", "model", "task", "method", "item", "correct", "label_correct"]
R2_TASK_COLUMNS = ["key", "task", "collection", "src_index", "dst_index", "r2_task", "r2_heldout"]
R2_COLUMNS = ["src_index", "dst_index", "src_depth", "dst_depth", "relative_depth_pair", "rho", "r2_valid",
              "r2_heldout", "r2_train", "n_fit", "n_heldout", "texts_hash"]


class CrossModel(Experiment):
    name, title = "cross_model", "Cross-model transfer: Gemma-3-270M → SmolLM2-135M"
    columns = COLUMNS
    limit = 50

    def add_arguments(self, p) -> None:
        p.add_argument("--fv-tasks", default=",".join(FV_TASKS))
        p.add_argument("--cls-tasks", default=",".join(CLS_TASKS))
        p.add_argument("--only", default="", help="run only these evaluation tasks, in this order (the "
                       "texts still exclude every evaluation task's inputs, so the keys stay the full run's)")
        p.add_argument("--texts-per-task", type=int, default=24)
        p.add_argument("--texts-per-cls", type=int, default=80)
        p.add_argument("--tiny", action="store_true", help="two tiny random models, small sizes (smoke test)")
        p.add_argument("--cache", default=str(REPO / "runs" / "cross_model"))

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    def setup(self, args) -> None:
        """The models, tasks, unlabeled texts and the settings every key holds."""
        from sitelens.baselines import LTV, SITE, TV
        from sitelens.models import fingerprint, load_model
        from sitelens.pipelines.transfer import unlabeled_texts
        from sitelens.provenance import NUMERICS_VERSION, canonical
        from sitelens.tasks import load_task
        from sitelens.testing import tiny_model

        self.cache = ObjectCache(Path(args.cache) / ("tiny" if args.tiny else "full"))
        if args.tiny:  # byte tokens: cls prompts run long
            kw = dict(n_ctx=2048, backend="hooked")
            self.m = {"src": tiny_model(n_layers=3, n_heads=4, d_head=10, post_norm=True, seed=0, **kw),
                      "dst": tiny_model(n_layers=2, n_heads=3, d_head=8, seed=1, **kw)}
        else:
            self.m = {"src": load_model(SRC), "dst": load_model(DST)}
        self.src, self.dst = self.m["src"], self.m["dst"]
        self.tasks = [(c, load_task(args.data_root / c / n)) for c, names in (("fv", args.fv_tasks),
                                                                            ("cls", args.cls_tasks))
                      for n in names.split(",") if n]
        self.fit_texts, self.held_texts, self.prov = unlabeled_texts(
            args.data_root, [t for _, t in self.tasks], texts_per_task=args.texts_per_task,
            texts_per_cls=args.texts_per_cls)
        if args.tiny:
            self.fit_texts, self.held_texts = self.fit_texts[:120], self.held_texts[:40]
        self.sizes = (dict(n_prompts=4, n_shots=2, n_valid=8, n_queries=8, n_examples=16) if args.tiny
                      else dict(n_prompts=50, n_shots=10, n_valid=64, n_queries=256, n_examples=400))
        self.fp = {side: fingerprint(m) for side, m in self.m.items()}
        self.base = {"src": self.fp["src"], "dst": self.fp["dst"], "texts": self.prov["texts_hash"],
                     "defaults": canonical([TV(), LTV(), SITE()]),
                     "numerics_version": NUMERICS_VERSION, "sizes": self.sizes, "limit": args.limit,
                     "seed": 0}

    def cells(self, args):
        self.setup(args)
        by_name = {t.name: (coll, t) for coll, t in self.tasks}
        only = [n for n in args.only.split(",") if n]
        if unknown := [n for n in only if n not in by_name]:
            from sitelens.errors import UsageError

            raise UsageError(f"--only names {unknown}, which are not evaluation tasks "
                             f"({', '.join(by_name)}); add them to --fv-tasks / --cls-tasks.")
        for coll, task in [by_name[n] for n in only] if only else self.tasks:
            for side, methods in (("src", SRC_METHODS), ("dst", DST_METHODS)):
                for m in methods:
                    yield Job(self.row_key(side, task, m), f"{task.name}/{side}/{m}",
                              dict(coll=coll, task=task, side=side, method=m))

    def batch(self, todo):
        """One job per task: its cells share the task's captured states and fits."""
        tasks: dict = {}
        for j in todo:
            tasks.setdefault(j["task"].name, []).append(j)
        return [Job(n, n, dict(coll=js[0]["coll"], task=js[0]["task"],
                               todo=[(j["side"], j["method"]) for j in js])) for n, js in tasks.items()]

    def run(self, job: Job) -> list:
        if not hasattr(self, "map"):
            self.maps()
            from sitelens.io import atomic_write_json

            atomic_write_json(self.out / "cross_model_texts.json", self.prov)
        self.run_task(job["coll"], job["task"], job["todo"])
        self.task_r2(job["coll"], job["task"])
        return []  # score() appends each cell's rows as it finishes

    # -- states, maps, fits ----------------------------------------------------------------------

    def maps(self):
        """The R² grid (every pair) and the maps the transfers use (fitted on demand)."""
        from sitelens.io import atomic_write_csv
        from sitelens.pipelines.transfer import MapBank, corresponding_index, map_grid, resid_states

        S = self.S = {(side, part): self.cache.get(f"states_{side}_{part}", {"fp": self.fp[side], "texts": t},
                                                   lambda m=model, t=t: resid_states(m, t))
                      for side, model in self.m.items()
                      for part, t in (("fit", self.fit_texts), ("held", self.held_texts))}
        Ls, Ld = self.src.cfg.n_layers, self.dst.cfg.n_layers
        grid = self.cache.get("r2_grid", {"base": self.base},
                              lambda: map_grid(S["src", "fit"], S["dst", "fit"], S["src", "held"],
                                               S["dst", "held"]))
        grid = grid.assign(src_depth=grid.src_index / Ls, dst_depth=grid.dst_index / Ld,
                           relative_depth_pair=[corresponding_index(j, Ld, Ls) == i for i, j in
                                                zip(grid.src_index, grid.dst_index)],
                           n_fit=len(self.fit_texts), n_heldout=len(self.held_texts),
                           texts_hash=self.prov["texts_hash"])
        atomic_write_csv(self.out / "cross_model_r2.csv", grid[R2_COLUMNS])
        self.map = MapBank(S["src", "fit"], S["dst", "fit"], S["src", "held"], S["dst", "held"], seed=0)
        self.log(f"maps ready (fit {len(self.fit_texts)}, held out {len(self.held_texts)} texts)")

    def states(self, side: str, task):
        from sitelens.pipelines.transfer import task_states
        from sitelens.provenance import task_hash

        n, k = self.sizes["n_prompts"], self.sizes["n_shots"]
        params = {"fp": self.fp[side], "task": task_hash(task), "n": n, "k": k}
        return self.cache.get(f"task_states_{side}_{task.name}", params,
                              lambda: task_states(self.m[side], task, n_prompts=n, n_shots=k, seed=0))

    def ltv(self, side: str, task):
        """LTV fitted with its defaults; cached under its numerics version."""
        from sitelens.baselines import LTV
        from sitelens.provenance import canonical, task_hash

        method = LTV(n_queries=8, n_shots=2) if self.args.tiny else LTV()
        params = {"fp": self.fp[side], "task": task_hash(task), "method": canonical(method),
                  "source": LTV_NUMERICS}

        def compute():
            f = method.fit(self.m[side], task, seed=0)
            return {"state": {k: v for k, v in f.state.items() if k in ("W", "layer")},
                    "n_params": f.n_params, "fit_seconds": f.fit_seconds}

        return self.cache.get(f"ltv_{side}_{task.name}", params, compute)

    def site_alpha(self, side: str, task, embedding, tag: str):
        """SITE's stage 2 (defaults, seed 0) on ``embedding``; cached by the embedding's bytes."""
        from sitelens.provenance import task_hash
        from sitelens.site import FitConfig, fit_site

        cfg = FitConfig(n_examples=self.sizes["n_examples"], n_valid=self.sizes["n_valid"], seed=0)
        params = {"fp": self.fp[side], "task": task_hash(task), "cfg": repr(cfg),
                  "emb": hashlib.sha256(embedding.numpy().tobytes()).hexdigest()[:16]}

        def compute():
            t0 = time.perf_counter()
            ad = fit_site(self.m[side], task, config=cfg, embedding=embedding)
            return {"alpha": ad.alpha, "fit_seconds": time.perf_counter() - t0}

        return self.cache.get(f"alpha_{side}_{tag}_{task.name}", params, compute)

    # -- one task --------------------------------------------------------------------------------

    def run_task(self, coll: str, task, todo: list) -> None:
        from sitelens.baselines import Fitted
        from sitelens.baselines.ltv import ltv_intervention
        from sitelens.pipelines import transfer as tr
        from sitelens.site import site_mix

        self.log(f"{task.name}: {len(todo)} cells")
        st = {side: self.states(side, task) for side in ("src", "dst")}
        need, own = {m for _, m in todo}, {}
        for side, model in self.m.items():
            if (side, "tv") in todo or (side == "src" and need & {"tv-transfer", "tv-transfer-shuffled"}):
                own[side, "tv"] = tr.tv_fitted(model, task, st[side]["tv"], n_valid=self.sizes["n_valid"])
            if (side, "ltv") in todo or (side == "src" and "ltv-transfer" in need):
                own[side, "ltv"] = self.ltv(side, task)
            if (side, "site") in todo or (side == "dst" and "site-transfer-own-alpha" in need):
                own[side, "site"] = self.site_alpha(side, task, st[side]["embedding"], "own")
        for side, method in todo:
            model, extra, t0, fit_s = self.m[side], {}, time.perf_counter(), 0.0
            shuffled = method.endswith("shuffled")
            if method == "zero-shot":
                fitted = Fitted("zero-shot")
            elif method == "tv":
                fitted, fit_s = own[side, "tv"], float("nan")
                extra = {"layer_dst": fitted.state["layer"]}
            elif method == "ltv":
                ltv = own[side, "ltv"]
                fitted = Fitted("ltv", intervention=ltv_intervention(ltv["state"]["W"].to(model.cfg.device),
                                                                     ltv["state"]["layer"]))
                fit_s, extra = ltv["fit_seconds"], {"layer_dst": ltv["state"]["layer"]}
            elif method == "site":
                a = own[side, "site"]
                fitted = Fitted("site", intervention=site_mix(a["alpha"], st[side]["embedding"]))
                fit_s = a["fit_seconds"]
            elif method in ("tv-transfer", "tv-transfer-shuffled"):
                ls = own["src", "tv"].state["layer"]
                fitted, extra = tr.tv_transfer(self.map, st["src"], st["dst"], ls, model.cfg.device,
                                               method=method, shuffled=shuffled)
            elif method == "tv-transfer-valid":
                fitted, extra = tr.tv_transfer_valid(model, task, self.map, st["src"],
                                                     n_valid=self.sizes["n_valid"])
            elif method == "ltv-transfer":
                ltv = own["src", "ltv"]["state"]
                fitted, extra = tr.ltv_transfer(self.map, ltv["W"].cpu(), ltv["layer"])
            elif method.startswith("site-transfer"):
                # each SmolLM2 block gets the α = 1 write of the Gemma block at its relative depth
                t, _, r2 = tr.site_transfer_embedding(self.src, self.dst, self.map, st["src"]["embedding"],
                                                      shuffled=shuffled)
                if method == "site-transfer-own-alpha":
                    alpha = own["dst", "site"]["alpha"]
                else:
                    a = self.site_alpha("dst", task, t, "shuffled" if shuffled else "carried")
                    alpha, fit_s = a["alpha"], a["fit_seconds"]
                fitted, extra = Fitted(method, intervention=site_mix(alpha, t)), {"map_r2_heldout": r2}
            else:
                raise ValueError(method)
            self.score(side, coll, task, method, fitted, fit_s, extra, t0)

    def row_key(self, side, task, method) -> str:
        from sitelens.provenance import settings_hash, task_hash

        s = {**self.base, "side": side, "task": task.name, "task_hash": task_hash(task),
             "method": method, "ltv": LTV_NUMERICS if "ltv" in method else ""}
        return settings_hash(s, n=16)

    def score(self, side, coll, task, method, fitted, fit_s, extra, t0) -> None:
        from sitelens.eval.labels import label_metrics_of, label_set
        from sitelens.eval.scoring import rank_labels
        from sitelens.models import model_name
        from sitelens.pipelines.bench import score_fitted
        from sitelens.provenance import task_hash

        model, items, labels = self.m[side], task.test[: self.args.limit], label_set(task)
        res = score_fitted(model, task, items, fitted, labels=None)
        cols = None if labels is None else rank_labels(model, items, fitted.prompts(items), labels,
                                                       intervention=fitted.intervention)
        label_ok = [c["label_rank_full"] for c in cols] if cols else [None] * len(items)
        key = self.row_key(side, task, method)
        row = {"model": model_name(model), "fingerprint": self.fp[side],
               "source_model": model_name(self.src) if "transfer" in method else model_name(model),
               "task": task.name, "collection": coll, "task_hash": task_hash(task), "method": method,
               "settings": json.dumps(self.base, sort_keys=True), "numerics_version":
               self.base["numerics_version"], "ltv_source": LTV_NUMERICS if "ltv" in method else "",
               "key": key, "fit_seconds": fit_s, **extra,
               **{k: res[k] for k in ("n", "first_token_acc", "exact_match", "seconds_per_item")},
               **label_metrics_of(cols)}
        self.store("cross_model_items", ITEM_COLUMNS).append([
            {"key": key, "model": row["model"], "task": task.name, "method": method, "item": i,
             "correct": int(c), "label_correct": "" if lc is None else int(lc)}
            for i, (c, lc) in enumerate(zip(res["correct"], label_ok))])
        self.store().append([row])
        self.log(f"  {row['model']} {task.name} {method}: em {row['exact_match']:.3f} "
                 f"label {row['label_acc_full']} ({time.perf_counter() - t0:.0f} s)")

    def task_r2(self, coll, task) -> None:
        """R² of the relative-depth maps on the task's own ten-shot prompts."""
        from sitelens.pipelines.transfer import corresponding_index, r2_score

        key = f"{task.name}:{self.prov['texts_hash']}:{self.fp['src']}:{self.fp['dst']}"
        store = self.store("cross_model_r2_tasks", R2_TASK_COLUMNS)
        if key in store:
            return
        st = {side: self.states(side, task) for side in ("src", "dst")}
        Ls, Ld = self.src.cfg.n_layers, self.dst.cfg.n_layers
        rows = []
        for jd in range(Ld + 1):
            i, m = corresponding_index(jd, Ld, Ls), self.map(corresponding_index(jd, Ld, Ls), jd)
            r2 = r2_score(st["dst"]["resid"][:, jd], m.state(st["src"]["resid"][:, i].double()))
            rows.append({"key": key, "task": task.name, "collection": coll, "src_index": i, "dst_index": jd,
                         "r2_task": r2, "r2_heldout": m.r2_heldout})
        store.append(rows)

    def read(self) -> pd.DataFrame:
        return self.store().read(dtype={"error": str, "ltv_source": str}, keep_default_na=False,
                                 na_values=[""])

    def report(self, df: pd.DataFrame) -> str:
        return report(self.args, df)


def alpha_depth(args) -> pd.DataFrame:
    """α mass per relative-depth decile (:func:`sitelens.atlas.data.depth_profile`) of both models, per
    source, over the tasks both have there: the committed α maps (``results/heads/*/*/scores.csv``,
    λ = 0, 5 seeds; ``figures/*/alpha_facets.csv``, λ = 5) and this run's SITE fits (λ = 0, the
    cache); with enrichment and centre of mass (:func:`sitelens.atlas.data.depth_enrichment`)."""
    import torch

    from sitelens.atlas.data import AtlasData, depth_enrichment

    cols = ["task", "layer", "head", "alpha"]
    heads = [pd.read_csv(f).rename(columns={"score": "alpha"}).query("lens == 'alpha'")[cols].assign(model=m)
             for m in (SRC, DST) for f in sorted((RESULTS / "heads" / m).glob("*/scores.csv"))]
    figs = [pd.read_csv(f)[cols].assign(model=m) for m in (SRC, DST)
            for f in [REPO / "figures" / m / "alpha_facets.csv"] if f.exists()]
    own = []
    for side, model in (("src", SRC), ("dst", DST)):
        for f in sorted((Path(args.cache) / "full").glob(f"alpha_{side}_own_*.pt")):
            a = torch.load(f, weights_only=False)["alpha"]  # [n_layers, n_heads]
            L, H = a.shape
            task = re.sub(r"_[0-9a-f]{12}$", "", f.stem.removeprefix(f"alpha_{side}_own_"))
            own.append(pd.DataFrame({"task": task,
                                     "layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L),
                                     "alpha": a.flatten().numpy(), "model": model}))
    rows = []
    for source, frames in (("heads (λ = 0, 5 seeds)", heads), ("figures (λ = 5)", figs),
                           ("this run (λ = 0, seed 0)", own)):
        if not frames:
            continue
        df = pd.concat(frames).assign(n_layers=lambda d: d.model.map({SRC: 18, DST: 30}))
        df = df[df.task.isin(set(df[df.model == SRC].task) & set(df[df.model == DST].task))]
        for model, g in df.groupby("model"):
            L = int(g.n_layers.iloc[0])
            data = AtlasData(model=model, n_layers=L, n_heads=int(g["head"].max() + 1),
                             alpha=g[["task", "layer", "head", "alpha"]], similarity=pd.DataFrame(),
                             transfer=pd.DataFrame(), tokens=pd.DataFrame(), lenses=pd.DataFrame())
            rows += [{"source": source, "model": model, "n_tasks": df.task.nunique(), **r}
                     for r in depth_enrichment(data).to_dict("records")]
    return pd.DataFrame(rows)


# the transfers against zero-shot (does anything carry?) and against their shuffled-map controls
# (does the fitted map carry more than a map that keeps no pairing?)
PAIRED = (("tv-transfer", "zero-shot"), ("tv-transfer-valid", "zero-shot"), ("ltv-transfer", "zero-shot"),
          ("site-transfer", "zero-shot"), ("site-transfer-own-alpha", "zero-shot"),
          ("tv-transfer", "tv-transfer-shuffled"), ("tv-transfer-valid", "tv-transfer-shuffled"),
          ("site-transfer", "site-transfer-shuffled"))


def paired_items(df: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """Per collection and metric, each pair of :data:`PAIRED` on SmolLM2's items: A − B over the
    pooled (task, item) pairs both scored (:func:`sitelens.stats.paired_difference`, 95% bootstrap
    interval over items), the exact McNemar test and its Holm adjustment over the report's
    comparisons."""
    from sitelens.stats import holm, mcnemar_exact, paired_difference

    rows = []
    for coll, metric, col in (("fv", "exact match", "correct"), ("cls", "label acc (full)", "label_correct")):
        d = df[(df.collection == coll) & (df.model == DST)]
        it = items[items.key.isin(set(d.key))].merge(d[["key", "method"]].drop_duplicates("key"), on="key",
                                                     suffixes=("_item", ""))
        wide = it.pivot_table(index=["task", "item"], columns="method", values=col, aggfunc="first")
        for a, b in PAIRED:
            if a not in wide or b not in wide:
                continue
            both = wide[[a, b]].dropna()
            r = paired_difference(both[a].to_numpy(float), both[b].to_numpy(float), over="items")
            mc = mcnemar_exact(both[a].to_numpy(bool), both[b].to_numpy(bool))
            rows.append({"collection": coll, "metric": metric, "a": a, "b": b, "diff": r.diff,
                         "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n, "over": r.over,
                         "only_a": mc.only_a, "only_b": mc.only_b, "p_mcnemar": mc.p_value})
    out = pd.DataFrame(rows)
    if len(out):
        out["p_holm"] = holm(out.p_mcnemar.to_numpy())
    return out


def report(args, df: pd.DataFrame) -> str:
    from sitelens.io import atomic_write_csv
    from sitelens.stats import bootstrap_ci

    out = Path(args.out)
    lines = [f"One seed (0) for every fit; the first {args.limit} test items per task. Definitions: "
             "docs/benchmarks.md, \"cross_model.py\"; findings: docs/results.md.", ""]
    if (r2 := out / "cross_model_r2.csv").exists():
        g = pd.read_csv(r2)
        fin = g[np.isfinite(g.r2_heldout)]
        best = fin.loc[fin.groupby("dst_index")["r2_heldout"].idxmax()].set_index("dst_index")
        tab = [{"SmolLM2 point (depth)": f"{r.dst_index} ({r.dst_depth:.2f})", "Gemma point": r.src_index,
                "held-out R²": f"{r.r2_heldout:.3f}", "ridge ρ": f"{r.rho:g}",
                "best Gemma point": int(best.src_index[r.dst_index]) if r.dst_index in best.index else "",
                "its R²": f"{best.r2_heldout[r.dst_index]:.3f}" if r.dst_index in best.index else ""}
               for r in g[g.relative_depth_pair].sort_values("dst_index").itertuples()]
        lines += ["## The map: held-out R² per layer pair", "",
                  f"{int(g.n_fit.iloc[0])} fitting and {int(g.n_heldout.iloc[0])} held-out texts; point i = "
                  "the state after i blocks; the Gemma point at SmolLM2's relative depth, and the best one.",
                  "", md_table(pd.DataFrame(tab)), ""]
    if (rt := out / "cross_model_r2_tasks.csv").exists():
        piv = pd.read_csv(rt).pivot_table(index="dst_index", columns="task", values="r2_task")
        sel = piv.loc[[j for j in piv.index if j in (5, 10, 15, 20, 25, 30)]]
        lines += ["R² of the same maps on each task's 50 ten-shot prompts (around the task's own mean):", "",
                  md_table(sel.round(2).reset_index().rename(columns={"dst_index": "SmolLM2 point"})), ""]
    if len(df):
        df = df.drop_duplicates(["model", "task", "method"], keep="last")
        items = pd.read_csv(out / "cross_model_items.csv")
        ltv = sorted(set(df.ltv_source.dropna()) - {""})
        lines += ["## Accuracy", "", "%, mean and 95% bootstrap CI over the pooled items of all tasks; LTV "
                  f"version {', '.join(f'`{v}`' for v in ltv) or '–'}.", ""]
        rows = []
        for (coll, metric, col) in (("fv", "exact match", "correct"),
                                    ("cls", "label acc (full)", "label_correct"),
                                    ("cls", "exact match", "correct")):
            for (model, method), g in df[df.collection == coll].groupby(["model", "method"], sort=False):
                v = items[items.key.isin(set(g.key))][col].astype(float).to_numpy()
                lo, hi = bootstrap_ci(v, n_boot=1000, seed=0)
                rows.append({"collection": coll, "metric": metric, "model": model, "method": method,
                             "tasks": len(g), "mean": pct(float(np.nanmean(v)) if v.size else np.nan),
                             "95% CI": f"{pct(lo)}–{pct(hi)}",
                             "chance": pct(g.chance.astype(float).mean()) if coll == "cls" else "–"})
        if rows:
            tab = pd.DataFrame(rows)
            tab = tab.assign(o=tab.method.map({m: i for i, m in enumerate(DST_METHODS)}), m=tab.model != DST)
            tab = tab.sort_values(["collection", "metric", "m", "o"]).drop(columns=["o", "m"])
            lines += [md_table(tab), ""]
        paired = paired_items(df, items)
        if len(paired):
            atomic_write_csv(out / "cross_model_paired.csv", paired)
            show = paired.assign(**{"A − B": paired.a + " − " + paired.b,
                                    "diff": (100 * paired["diff"]).round(1),
                                    "95% CI (items)": [f"[{100 * lo:.1f}, {100 * hi:.1f}]"
                                                       for lo, hi in zip(paired.ci_low, paired.ci_high)],
                                    "p (McNemar)": paired.p_mcnemar.map(lambda p: f"{p:.3g}"),
                                    "p (Holm)": paired.p_holm.map(lambda p: f"{p:.3g}")})
            lines += ["Paired on SmolLM2's items (`cross_model_paired.csv`): A − B in points over the pooled "
                      "(task, item) pairs, its 95% bootstrap interval over items, n, the items only A / "
                      f"only B got right, the exact McNemar p and Holm's adjustment over these {len(paired)} "
                      "comparisons:", "",
                      md_table(show[["collection", "metric", "A − B", "diff", "95% CI (items)", "n", "only_a",
                                     "only_b", "p (McNemar)", "p (Holm)"]]), ""]
        per = df.assign(acc=pd.to_numeric(pd.Series(np.where(
            df.collection == "cls", df.label_acc_full, df.exact_match), index=df.index), errors="coerce"))
        piv = per.pivot_table(index=["model", "method"], columns="task", values="acc")
        lines += ["Per task (exact match for FV, full-label accuracy for cls, %):", "",
                  md_table((100 * piv).round(0).reset_index().fillna("–")), ""]
        tr = df[df.method.str.contains("transfer")][["task", "method", "layer_src", "layer_dst",
                                                     "map_r2_heldout", "map_r2_task", "tv_rel_err"]]
        if len(tr):
            lines += ["Where each transfer acted and its map's R² (`tv_rel_err`: distance of the carried TV "
                      "state from SmolLM2's own, relative to SmolLM2's mean state's):", "",
                      md_table(tr.round(3).fillna("–")), ""]
        if len(err := df[df.error.fillna("") != ""]):
            lines += [f"{len(err)} cell(s) failed: " + "; ".join(f"{r.task}/{r.method}: {r.error}"
                                                                 for r in err.itertuples()), ""]
    ad, path = alpha_depth(args), out / "cross_model_alpha_depth.csv"
    if path.exists():  # a source whose inputs are gone (this run's fits: the cache) keeps its rows
        old = pd.read_csv(path, float_precision="round_trip")
        ad = pd.concat([ad, old[~old.source.isin(set(ad.source) if len(ad) else set())]], ignore_index=True)
    if len(ad):
        atomic_write_csv(path, ad)
        lines += ["## α maps by relative depth", "", "Share of the total α per relative-depth decile and "
                  "its enrichment (share / the decile's share of the blocks; 1 = uniform).", ""]
        for source, g in ad.groupby("source", sort=False):
            a, b = g[g.model == SRC].set_index("bin"), g[g.model == DST].set_index("bin")
            if a.empty or b.empty:
                continue
            r = float(np.corrcoef(a.enrichment, b.enrichment)[0, 1])
            ca, cb = a.centre_of_mass.iloc[0], b.centre_of_mass.iloc[0]
            tab = pd.DataFrame({"decile": [f"{x:.1f}–{x + 0.1:.1f}" for x in a.depth_low],
                                "Gemma α share": a.mass.round(3).to_numpy(),
                                "Gemma enrichment": a.enrichment.round(2).to_numpy(),
                                "SmolLM2 α share": b.mass.round(3).to_numpy(),
                                "SmolLM2 enrichment": b.enrichment.round(2).to_numpy()})
            lines += [f"### {source}: {int(a.n_tasks.iloc[0])} tasks; enrichment correlation r = {r:.2f}; "
                      f"centre of mass {ca:.3f} (Gemma) vs {cb:.3f} (SmolLM2), {cb - ca:+.3f}", "",
                      md_table(tab), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main(CrossModel()))
