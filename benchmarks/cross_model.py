"""Cross-model transfer (issue 21, part 5): task vectors extracted from Gemma-3-270M (d_model 640, 18
layers) and applied to SmolLM2-135M (576, 30 layers) through a linear map between their residual
streams; and the two models' α maps compared by relative depth.

    python benchmarks/cross_model.py --threads 1             # resumable; the same command continues
    python benchmarks/cross_model.py --report                # cross_model.md from the CSVs only
    python benchmarks/cross_model.py --only sst2,antonym     # some evaluation tasks now, the rest later
    python benchmarks/cross_model.py --tiny --out /tmp/xm    # smoke test on two tiny random models

**Unlabeled texts** (:func:`unlabeled_texts`): inputs only, of tasks not used for evaluation — the
FV tasks outside the evaluation sample (and not ``ag_news`` / ``sentiment``, which share sources
with ``cls/agnews`` and ``cls/sst2``), ``--texts-per-task`` (24) train inputs each, and the
``cls/`` datasets not evaluated (dbpedia, rte, cb, mr, cr, subj), ``--texts-per-cls`` (80) train
inputs each; cut at a word boundary to at most 200 characters; any text equal (case and spacing
aside) to an input of an evaluation task, in any split, is dropped. Each is read as the
zero-shot prompt ``"Q: {x}\\nA:"``, so its last token is the position where every vector here
acts. **Held out by source**: every fifth of those FV tasks (sorted by name) and ``cls/cr`` are
used only for the held-out R²; the rest fit the maps.

**The maps** (:mod:`sitelens.pipelines.transfer`): an affine ridge map per pair of residual points (penalty
chosen on 20% of the fitting texts), ``results/cross_model_r2.csv``: held-out R² for every
(Gemma point, SmolLM2 point) pair, with the relative-depth pairs marked; and, per evaluation task,
the R² of the relative-depth maps on that task's 50 ten-shot prompts
(``results/cross_model_r2_tasks.csv``).

**Accuracy** on SmolLM2 (test split capped at the first ``--limit`` = 50 items; ``cls/``: sst2,
trec, agnews; FV: an 8-task sample, the first eight of the committed baselines grid): zero-shot;
its own TV, LTV, SITE (the :mod:`sitelens.baselines` defaults, seed 0); Gemma's vectors carried
across —

- ``tv-transfer``: Gemma's TV state at its chosen layer ℓ, mapped (``A s + b``) to the SmolLM2
  point at the same relative depth; ``tv-transfer-valid``: Gemma's TV state of every layer mapped
  the same way, the SmolLM2 layer chosen on SmolLM2's validation items (as TV chooses its own);
  ``tv-transfer-shuffled``: ``tv-transfer`` through a map fitted on shuffled text pairs (control);
- ``ltv-transfer``: Gemma's LTV map ``W`` carried as ``W' = A W B``, ``c = A W b_B``
  (:func:`sitelens.pipelines.transfer.transfer_linear`) at the same relative depth;
- ``site-transfer``: Gemma's SITE embedding carried layer by layer (each SmolLM2 block gets the
  α = 1 write of the Gemma block at its relative depth, mapped and solved into per-head z through
  SmolLM2's ``W_O``: :func:`sitelens.pipelines.transfer.transfer_embedding`), α then fitted on SmolLM2 (SITE's
  stage 2 with that embedding: α is per head of the model it runs in);
  ``site-transfer-own-alpha``: the carried embedding through SmolLM2's own α (no fit);
  ``site-transfer-shuffled``: as ``site-transfer`` through maps fitted on shuffled text pairs.

and, for reference, Gemma's own zero-shot, TV, LTV and SITE on Gemma. Accuracy: exact match and
first-token accuracy; on ``cls/`` also the label-ranking accuracies and chance
(:mod:`sitelens.eval.labels`). ``results/cross_model.csv`` (a row per task × model × method, keyed on
every setting, LTV rows also on ``sitelens.baselines.ltv.LTV_NUMERICS``),
``results/cross_model_items.csv`` (per item), ``results/cross_model_alpha_depth.csv`` (α mass
per relative-depth decile, both models, from the committed α maps and from this run's SITE fits),
``results/cross_model.md``. Fits and captured states are cached under ``runs/cross_model/``
(keyed; not committed), so a killed run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sitelens.baselines.ltv import LTV_NUMERICS
from sitelens.pipelines.experiment import REPO, RESULTS, md_table, parser, pct
from sitelens.pipelines.store import ObjectCache, ResultsStore

SRC, DST = "gemma-3-270m", "smollm2-135m-instruct"
FV_TASKS = ("antonym", "country-capital", "present-past", "english-french", "singular-plural",
            "capitalize_first_letter", "person-occupation", "choose_first_of_3")
CLS_TASKS = ("sst2", "trec", "agnews")
CLS_TEXT_SOURCES = ("dbpedia", "rte", "cb", "mr", "cr", "subj")
CLS_HELDOUT = ("cr",)
FV_EXCLUDED = ("ag_news", "sentiment")  # the sources of cls/agnews and cls/sst2
DST_METHODS = ("zero-shot", "tv", "ltv", "site", "tv-transfer", "tv-transfer-valid",
               "tv-transfer-shuffled", "ltv-transfer", "site-transfer", "site-transfer-own-alpha",
               "site-transfer-shuffled")
SRC_METHODS = ("zero-shot", "tv", "ltv", "site")
COLUMNS = [
    "model", "fingerprint", "source_model", "task", "collection", "task_hash", "method", "settings",
    "numerics_version", "ltv_source", "key",
    "n", "first_token_acc", "exact_match", "label_acc_first", "label_acc_full",
    "label_acc_full_norm", "chance", "layer_src", "layer_dst", "map_r2_heldout", "map_r2_task",
    "tv_rel_err", "fit_seconds", "seconds_per_item", "error",
]
ITEM_COLUMNS = ["key", "model", "task", "method", "item", "correct", "label_correct"]
R2_TASK_COLUMNS = ["key", "task", "collection", "src_index", "dst_index", "r2_task", "r2_heldout"]
R2_COLUMNS = ["src_index", "dst_index", "src_depth", "dst_depth", "relative_depth_pair", "rho",
              "r2_valid", "r2_heldout", "r2_train", "n_fit", "n_heldout", "texts_hash"]


def parse_args(argv=None):
    p = parser(__doc__, limit=50)
    p.add_argument("--fv-tasks", default=",".join(FV_TASKS))
    p.add_argument("--cls-tasks", default=",".join(CLS_TASKS))
    p.add_argument("--only", default="",
                   help="run only these of the evaluation tasks (comma-separated names), in this "
                        "order; the unlabeled texts still exclude every evaluation task's inputs, "
                        "so a partial run keeps the keys, maps and caches of the full one")
    p.add_argument("--texts-per-task", type=int, default=24)
    p.add_argument("--texts-per-cls", type=int, default=80)
    p.add_argument("--tiny", action="store_true", help="two tiny random models, small sizes (smoke test)")
    p.add_argument("--cache", default=str(REPO / "runs" / "cross_model"))
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# texts


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _cut(text: str, n: int = 200) -> str:
    """``text`` cut at the last space before ``n`` characters (whole when shorter)."""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    cut = text[:n]
    return cut[: cut.rfind(" ")] if " " in cut else cut


def unlabeled_texts(args, eval_tasks) -> tuple[list[str], list[str], dict]:
    """(fit prompts, held-out prompts, provenance) — see the module docstring."""
    from sitelens.tasks import load_task, zero_shot_prompt

    banned = {_norm(ex.input) for t in eval_tasks for s in ("train", "valid", "test") for ex in t.split(s)}
    eval_names = {t.name for t in eval_tasks}
    fv_pool = sorted(p.name for p in (args.data_root / "fv").iterdir() if (p / "train.json").exists()
                     and p.name not in eval_names and p.name not in FV_EXCLUDED)
    held_fv = set(fv_pool[4::5])
    sources = [("fv", n, args.texts_per_task, n in held_fv) for n in fv_pool]
    sources += [("cls", n, args.texts_per_cls, n in CLS_HELDOUT) for n in CLS_TEXT_SOURCES]
    fit, held, prov = [], [], {"fit_sources": [], "heldout_sources": []}
    for coll, name, k, is_held in sources:
        train = load_task(args.data_root / coll / name, dedupe=True).train
        inputs = list(dict.fromkeys(_cut(ex.input) for ex in train))
        inputs = [x for x in inputs if x and _norm(x) not in banned]
        picked = random.Random(f"{coll}/{name}").sample(inputs, min(k, len(inputs)))
        (held if is_held else fit).extend(zero_shot_prompt(x) for x in picked)
        prov["heldout_sources" if is_held else "fit_sources"].append(f"{coll}/{name}")
    prov["texts_hash"] = hashlib.sha256(json.dumps([fit, held]).encode()).hexdigest()[:12]
    return fit, held, prov


# ----------------------------------------------------------------------------------------------
# the run


class Run:
    """Everything one invocation needs: models, texts, states, maps, caches, output files."""

    def __init__(self, args):
        import torch

        from sitelens.models import fingerprint, load_model, tiny_model
        from sitelens.provenance import NUMERICS_VERSION
        from sitelens.tasks import load_task

        torch.set_num_threads(args.threads)
        self.args, self.out = args, Path(args.out)
        self.cache = ObjectCache(Path(args.cache) / ("tiny" if args.tiny else "full"))
        if args.tiny:
            self.src = tiny_model(n_layers=3, n_heads=4, d_head=10, post_norm=True, seed=0, n_ctx=2048,
                                  backend="hooked")  # byte tokens: cls prompts run long
            self.dst = tiny_model(n_layers=2, n_heads=3, d_head=8, seed=1, n_ctx=2048, backend="hooked")
        else:
            self.src, self.dst = load_model(SRC), load_model(DST)
        self.tasks = [("fv", load_task(args.data_root / "fv" / n)) for n in args.fv_tasks.split(",") if n]
        self.tasks += [("cls", load_task(args.data_root / "cls" / n)) for n in args.cls_tasks.split(",") if n]
        self.fit_texts, self.held_texts, self.prov = unlabeled_texts(args, [t for _, t in self.tasks])
        if args.tiny:
            self.fit_texts, self.held_texts = self.fit_texts[:120], self.held_texts[:40]
        self.sizes = (dict(n_prompts=4, n_shots=2, n_valid=8, n_queries=8, n_examples=16)
                      if args.tiny else dict(n_prompts=50, n_shots=10, n_valid=64, n_queries=256,
                                             n_examples=400))
        self.fp = {"src": fingerprint(self.src), "dst": fingerprint(self.dst)}
        from sitelens.baselines import LTV, SITE, TV
        from sitelens.provenance import canonical

        self.base = {"src": self.fp["src"], "dst": self.fp["dst"], "texts": self.prov["texts_hash"],
                     "defaults": canonical([TV(), LTV(), SITE()]),
                     "numerics_version": NUMERICS_VERSION, "sizes": self.sizes, "limit": args.limit,
                     "seed": 0}

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    # -- states and maps -----------------------------------------------------------------------

    def text_states(self):
        from sitelens.pipelines.transfer import resid_states

        out = {}
        for side, model in (("src", self.src), ("dst", self.dst)):
            for part, texts in (("fit", self.fit_texts), ("held", self.held_texts)):
                params = {"fp": self.fp[side], "texts": texts}
                out[side, part] = self.cache.get(f"states_{side}_{part}", params,
                                                 lambda m=model, t=texts: resid_states(m, t))
        self.log(f"text states: fit {len(self.fit_texts)}, held out {len(self.held_texts)}")
        return out

    def maps(self):
        """The R² grid (every pair) and the maps the transfers use (fitted on demand)."""
        import torch

        from sitelens.pipelines.transfer import fit_ridge_map, map_grid

        S = self.text_states()
        self.S = S
        Ls, Ld = self.src.cfg.n_layers, self.dst.cfg.n_layers
        grid = self.cache.get("r2_grid", {"base": self.base},
                              lambda: map_grid(S["src", "fit"], S["dst", "fit"], S["src", "held"],
                                               S["dst", "held"]))
        from sitelens.pipelines.transfer import corresponding_index

        grid = grid.assign(src_depth=grid.src_index / Ls, dst_depth=grid.dst_index / Ld,
                           relative_depth_pair=[corresponding_index(j, Ld, Ls) == i for i, j in
                                                zip(grid.src_index, grid.dst_index)],
                           n_fit=len(self.fit_texts), n_heldout=len(self.held_texts),
                           texts_hash=self.prov["texts_hash"])
        from sitelens.io import atomic_write_csv

        atomic_write_csv(self.out / "cross_model_r2.csv", grid[R2_COLUMNS])
        self._maps: dict = {}
        perm = torch.randperm(len(self.fit_texts), generator=torch.Generator().manual_seed(0))
        self._perm = perm

        def get(i: int, j: int, *, reverse: bool = False, shuffled: bool = False):
            key = (i, j, reverse, shuffled)
            if key not in self._maps:
                X, Y = S["src", "fit"][:, i], S["dst", "fit"][:, j]
                Xh, Yh = S["src", "held"][:, i], S["dst", "held"][:, j]
                if reverse:
                    X, Y, Xh, Yh = Y, X, Yh, Xh
                if shuffled:
                    Y = Y[perm]
                m = fit_ridge_map(X, Y, X_heldout=Xh, Y_heldout=Yh)
                m.src_index, m.dst_index = (j, i) if reverse else (i, j)
                self._maps[key] = m
            return self._maps[key]

        self.map = get
        self.log("maps ready")

    # -- fits ------------------------------------------------------------------------------------

    def states(self, side: str, task):
        from sitelens.pipelines.transfer import task_states
        from sitelens.provenance import task_hash

        model = self.src if side == "src" else self.dst
        params = {"fp": self.fp[side], "task": task_hash(task), "n": self.sizes["n_prompts"],
                  "k": self.sizes["n_shots"]}
        return self.cache.get(f"task_states_{side}_{task.name}", params, lambda: task_states(
            model, task, n_prompts=self.sizes["n_prompts"], n_shots=self.sizes["n_shots"], seed=0))

    def ltv(self, side: str, task):
        """LTV fitted with its defaults; cached under its numerics version."""
        from sitelens.baselines import LTV
        from sitelens.provenance import canonical, task_hash

        model = self.src if side == "src" else self.dst
        method = LTV(n_queries=8, n_shots=2) if self.args.tiny else LTV()
        params = {"fp": self.fp[side], "task": task_hash(task), "method": canonical(method),
                  "source": LTV_NUMERICS}

        def compute():
            f = method.fit(model, task, seed=0)
            return {"state": {k: v for k, v in f.state.items() if k in ("W", "layer")},
                    "n_params": f.n_params, "fit_seconds": f.fit_seconds}

        return self.cache.get(f"ltv_{side}_{task.name}", params, compute)

    def site_alpha(self, side: str, task, embedding, tag: str):
        """SITE's stage 2 (defaults, seed 0) on ``embedding``; cached by the embedding's bytes."""
        from sitelens.provenance import task_hash
        from sitelens.site import FitConfig, fit_site

        model = self.src if side == "src" else self.dst
        cfg = FitConfig(n_examples=self.sizes["n_examples"], n_valid=self.sizes["n_valid"], seed=0)
        params = {"fp": self.fp[side], "task": task_hash(task), "cfg": repr(cfg),
                  "emb": hashlib.sha256(embedding.numpy().tobytes()).hexdigest()[:16]}

        def compute():
            t0 = time.perf_counter()
            ad = fit_site(model, task, config=cfg, embedding=embedding)
            return {"alpha": ad.alpha, "fit_seconds": time.perf_counter() - t0}

        return self.cache.get(f"alpha_{side}_{tag}_{task.name}", params, compute)

    # -- transfers -------------------------------------------------------------------------------

    def carried_embedding(self, task, embedding, shuffled: bool):
        from sitelens.pipelines.transfer import corresponding_layer, transfer_embedding

        Ls, Ld = self.src.cfg.n_layers, self.dst.cfg.n_layers
        maps = {}
        for ld in range(Ld):
            ls = corresponding_layer(ld, Ld, Ls)
            maps[ld] = (ls, self.map(ls + 1, ld + 1, shuffled=shuffled))  # the state after the block
        t, table = transfer_embedding(self.src, self.dst, embedding, maps)
        return t, table

    # -- one task --------------------------------------------------------------------------------

    def run_task(self, coll: str, task) -> None:
        import torch

        from sitelens.baselines import Fitted
        from sitelens.baselines.base import HookIntervention, last_token_hook
        from sitelens.baselines.ltv import ltv_intervention
        from sitelens.baselines.tv import tv_intervention
        from sitelens.models import act_name
        from sitelens.pipelines.transfer import corresponding_index, r2_score, transfer_linear, tv_fitted
        from sitelens.site import site_mix

        Ls, Ld = self.src.cfg.n_layers, self.dst.cfg.n_layers
        todo = [("src", m) for m in SRC_METHODS] + [("dst", m) for m in DST_METHODS]
        todo = [(side, m) for side, m in todo if self.row_key(side, coll, task, m) not in self.done]
        if not todo:
            return
        self.log(f"{task.name}: {len(todo)} cells")
        st = {side: self.states(side, task) for side in ("src", "dst")}
        need = {m for _, m in todo}
        own: dict = {}
        for side in ("src", "dst"):
            model = self.src if side == "src" else self.dst
            if (side, "tv") in todo or (side == "src" and need & {"tv-transfer", "tv-transfer-shuffled"}):
                own[side, "tv"] = tv_fitted(model, task, st[side]["tv"], n_valid=self.sizes["n_valid"])
            if (side, "ltv") in todo or (side == "src" and "ltv-transfer" in need):
                own[side, "ltv"] = self.ltv(side, task)
            if (side, "site") in todo or (side == "dst" and "site-transfer-own-alpha" in need):
                own[side, "site"] = self.site_alpha(side, task, st[side]["embedding"], "own")
        for side, method in todo:
            model = self.src if side == "src" else self.dst
            extra: dict = {}
            t0 = time.perf_counter()
            fit_s = 0.0
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
                ld = corresponding_index(ls, Ls, Ld)
                m = self.map(ls, ld, shuffled=method.endswith("shuffled"))
                carried = m.state(st["src"]["tv"][ls].double()).float()
                own_dst = st["dst"]["tv"][ld] if ld < Ld else None
                mu = self.S["dst", "fit"][:, ld].mean(0)
                rel = (float((carried - own_dst).norm() / (own_dst - mu).norm()) if own_dst is not None
                       else float("nan"))
                fitted = Fitted(method, intervention=tv_intervention(carried.to(model.cfg.device), ld))
                extra = {"layer_src": ls, "layer_dst": ld, "map_r2_heldout": m.r2_heldout,
                         "map_r2_task": r2_score(st["dst"]["resid"][:, ld],
                                                 m.state(st["src"]["resid"][:, ls].double())),
                         "tv_rel_err": rel}
            elif method == "tv-transfer-valid":
                carried = torch.stack([
                    self.map(corresponding_index(ld, Ld, Ls), ld).state(
                        st["src"]["tv"][min(corresponding_index(ld, Ld, Ls), Ls - 1)].double()).float()
                    for ld in range(Ld)])  # [n_layers_dst, d_dst]
                fitted = tv_fitted(model, task, carried, n_valid=self.sizes["n_valid"], name=method)
                ld = fitted.state["layer"]
                extra = {"layer_src": corresponding_index(ld, Ld, Ls), "layer_dst": ld,
                         "map_r2_heldout": self.map(corresponding_index(ld, Ld, Ls), ld).r2_heldout}
            elif method == "ltv-transfer":
                ltv = own["src", "ltv"]
                ls = ltv["state"]["layer"]  # resid_post of block ls: residual point ls + 1
                jd = corresponding_index(ls + 1, Ls, Ld)
                fwd, back = self.map(ls + 1, jd), self.map(ls + 1, jd, reverse=True)
                Wd, c = transfer_linear(ltv["state"]["W"].cpu(), fwd, back)
                Wd, c = Wd.to(model.cfg.device), c.to(model.cfg.device)
                name = act_name("resid_post", jd - 1)

                def build(m, seq_len, Wd=Wd, c=c, name=name):
                    return [(name, last_token_hook(lambda h: h + h @ Wd.to(h.dtype).T + c.to(h.dtype),
                                                   seq_len))]

                fitted = Fitted(method, intervention=HookIntervention(build))
                extra = {"layer_src": ls, "layer_dst": jd - 1, "map_r2_heldout": fwd.r2_heldout}
            elif method in ("site-transfer", "site-transfer-shuffled", "site-transfer-own-alpha"):
                shuffled = method.endswith("shuffled")
                t, table = self.carried_embedding(task, st["src"]["embedding"], shuffled)
                if method == "site-transfer-own-alpha":
                    alpha = own["dst", "site"]["alpha"]
                else:
                    a = self.site_alpha("dst", task, t, "shuffled" if shuffled else "carried")
                    alpha, fit_s = a["alpha"], a["fit_seconds"]
                fitted = Fitted(method, intervention=site_mix(alpha, t))
                extra = {"map_r2_heldout": float(np.mean([self.map(r.src_layer + 1, r.dst_layer + 1,
                                                                   shuffled=shuffled).r2_heldout
                                                          for r in table.itertuples()]))}
            else:
                raise ValueError(method)
            self.score(side, coll, task, method, fitted, fit_s, extra, t0)

    def row_key(self, side, coll, task, method) -> str:
        from sitelens.provenance import settings_hash, task_hash

        s = {**self.base, "side": side, "task": task.name, "task_hash": task_hash(task),
             "method": method, "ltv": LTV_NUMERICS if "ltv" in method else ""}
        return settings_hash(s, n=16)

    def score(self, side, coll, task, method, fitted, fit_s, extra, t0) -> None:
        from sitelens.eval.labels import label_set
        from sitelens.models import model_name
        from sitelens.pipelines.bench import score_fitted

        model = self.src if side == "src" else self.dst
        items = task.test[: self.args.limit]
        labels = label_set(task)
        res = score_fitted(model, task, items, fitted, labels=None)
        label_ok = self.label_correct(model, task, items, fitted, labels)
        key = self.row_key(side, coll, task, method)
        row = {"model": model_name(model), "fingerprint": self.fp[side],
               "source_model": model_name(self.src) if "transfer" in method else model_name(model),
               "task": task.name, "collection": coll, "task_hash": "", "method": method,
               "settings": json.dumps(self.base, sort_keys=True), "numerics_version":
               self.base["numerics_version"], "ltv_source": LTV_NUMERICS if "ltv" in method else "",
               "key": key, "fit_seconds": fit_s, **extra,
               **{k: res[k] for k in ("n", "first_token_acc", "exact_match", "seconds_per_item")},
               **label_ok[1]}
        from sitelens.provenance import task_hash

        row["task_hash"] = task_hash(task)
        irows = [{"key": key, "model": row["model"], "task": task.name, "method": method, "item": i,
                  "correct": int(c), "label_correct": "" if lc is None else int(lc)}
                 for i, (c, lc) in enumerate(zip(res["correct"], label_ok[0]))]
        ResultsStore(self.out / "cross_model_items.csv", ITEM_COLUMNS).append(irows)
        ResultsStore(self.out / "cross_model.csv", COLUMNS).append([row])
        self.done.add(key)
        self.log(f"  {row['model']} {task.name} {method}: em {row['exact_match']:.3f} "
                 f"label {row['label_acc_full']} ({time.perf_counter() - t0:.0f} s)")

    def label_correct(self, model, task, items, fitted, labels):
        """Per item, whether the full-label ranking picks the target (None without labels), and
        the label metrics of :data:`sitelens.pipelines.bench.LABEL_METRICS` (as ``sitelens bench`` computes
        them: :func:`sitelens.pipelines.bench.label_metrics`, from the same ranks)."""
        from sitelens.eval.evaluate import rank_labels
        from sitelens.eval.labels import nan_mean
        from sitelens.pipelines.bench import LABEL_METRICS

        if labels is None:
            return [None] * len(items), dict.fromkeys(LABEL_METRICS, float("nan"))
        cols = rank_labels(model, items, fitted.prompts(items), labels, intervention=fitted.intervention)
        metrics = {"label_acc_first": nan_mean(c["label_rank_first"] for c in cols),
                   "label_acc_full": nan_mean(c["label_rank_full"] for c in cols),
                   "label_acc_full_norm": nan_mean(c["label_rank_full_norm"] for c in cols),
                   "chance": nan_mean(c["chance"] for c in cols)}
        return [c["label_rank_full"] for c in cols], metrics

    def go(self) -> None:
        tasks = self.tasks
        if self.args.only:  # checked before any state is computed
            by_name = {t.name: (coll, t) for coll, t in self.tasks}
            only = [n for n in self.args.only.split(",") if n]
            unknown = [n for n in only if n not in by_name]
            if unknown:
                from sitelens.errors import UsageError

                raise UsageError(f"--only names {unknown}, which are not evaluation tasks "
                                 f"({', '.join(by_name)}); add them to --fv-tasks / --cls-tasks.")
            tasks = [by_name[n] for n in only]
        self.done = ResultsStore(self.out / "cross_model.csv", COLUMNS).keys()
        if self.args.dry_run:  # the cells' keys need no states: list what would run, run none
            sides = (("src", SRC_METHODS), ("dst", DST_METHODS))
            cells = [(t, side, m) for _, t in tasks for side, ms in sides for m in ms]
            todo = [c for c in cells if self.row_key(c[1], None, c[0], c[2]) not in self.done]
            print(f"cross_model: {len(cells)} cell(s), {len(cells) - len(todo)} done, {len(todo)} to run")
            for t, side, m in todo:
                print(f"  would run {t.name}/{side}/{m}")
            return
        self.maps()
        from sitelens.io import atomic_write_json

        atomic_write_json(self.out / "cross_model_texts.json", self.prov)
        for coll, task in tasks:
            self.run_task(coll, task)
            self.task_r2(coll, task)

    def task_r2(self, coll, task) -> None:
        """R² of the relative-depth maps on the task's own ten-shot prompts (both models read the
        same 50 prompts)."""
        from sitelens.pipelines.transfer import corresponding_index, r2_score

        path = self.out / "cross_model_r2_tasks.csv"
        key = f"{task.name}:{self.prov['texts_hash']}:{self.fp['src']}:{self.fp['dst']}"
        store = ResultsStore(path, R2_TASK_COLUMNS)
        if key in store:
            return
        st = {side: self.states(side, task) for side in ("src", "dst")}
        Ls, Ld = self.src.cfg.n_layers, self.dst.cfg.n_layers
        rows = []
        for jd in range(Ld + 1):
            i = corresponding_index(jd, Ld, Ls)
            m = self.map(i, jd)
            rows.append({"key": key, "task": task.name, "collection": coll, "src_index": i,
                         "dst_index": jd, "r2_task": r2_score(st["dst"]["resid"][:, jd],
                                                              m.state(st["src"]["resid"][:, i].double())),
                         "r2_heldout": m.r2_heldout})
        store.append(rows)


# ----------------------------------------------------------------------------------------------
# α by relative depth


def alpha_sources(args) -> dict[str, pd.DataFrame]:
    """α maps of both models (task, layer, head, alpha + model, n_layers): the committed ones
    (``results/heads/*/*/scores.csv`` lens ``alpha``: λ = 0, mean over 5 seeds, 8 tasks;
    ``figures/*/alpha_facets.csv``: λ = 5, 14 tasks) and this run's own SITE fits (λ = 0, seed 0)."""
    import torch

    n_layers = {SRC: 18, DST: 30}
    out = {}
    frames = []
    for model in (SRC, DST):
        for f in sorted((RESULTS / "heads" / model).glob("*/scores.csv")):
            d = pd.read_csv(f)
            d = d[d.lens == "alpha"][["task", "layer", "head", "score"]].rename(columns={"score": "alpha"})
            frames.append(d.assign(model=model))
    if frames:
        out["heads (λ = 0, 5 seeds)"] = pd.concat(frames)
    frames = []
    for model in (SRC, DST):
        f = REPO / "figures" / model / "alpha_facets.csv"
        if f.exists():
            frames.append(pd.read_csv(f)[["task", "layer", "head", "alpha"]].assign(model=model))
    if frames:
        out["figures (λ = 5)"] = pd.concat(frames)
    frames = []
    root = Path(args.cache) / "full"
    for side, model in (("src", SRC), ("dst", DST)):
        for f in sorted(root.glob(f"alpha_{side}_own_*.pt")):
            a = torch.load(f, weights_only=False)["alpha"]  # [n_layers, n_heads]
            task = re.sub(r"_[0-9a-f]{12}$", "", f.stem.removeprefix(f"alpha_{side}_own_"))
            L, H = a.shape
            frames.append(pd.DataFrame({"task": task, "layer": np.repeat(np.arange(L), H),
                                        "head": np.tile(np.arange(H), L), "alpha": a.flatten().numpy(),
                                        "model": model}))
    if frames:
        out["this run (λ = 0, seed 0)"] = pd.concat(frames)
    return {k: v.assign(n_layers=v.model.map(n_layers)) for k, v in out.items()}


def centre_of_mass(args) -> pd.DataFrame:
    """Per source, task and model: the α-weighted mean relative depth of the blocks
    (``(layer + 0.5) / n_layers``), over the tasks both models have in that source."""
    rows = []
    for source, df in alpha_sources(args).items():
        common = set(df[df.model == SRC].task) & set(df[df.model == DST].task)
        d = df[df.task.isin(common)].assign(depth=lambda x: (x.layer + 0.5) / x.n_layers)
        for (task, model), g in d.groupby(["task", "model"]):
            rows.append({"source": source, "task": task, "model": model,
                         "centre_of_mass": float((g.alpha * g.depth).sum() / g.alpha.sum())})
    return pd.DataFrame(rows)


def alpha_depth(args) -> pd.DataFrame:
    """α mass per relative-depth decile (:func:`sitelens.atlas.data.depth_profile`), per source
    and model, over the tasks of that source that both models have."""
    from sitelens.atlas.data import AtlasData, depth_profile

    rows = []
    for source, df in alpha_sources(args).items():
        common = set(df[df.model == SRC].task) & set(df[df.model == DST].task)
        for model, g in df[df.task.isin(common)].groupby("model"):
            data = AtlasData(model=model, n_layers=int(g.n_layers.iloc[0]), n_heads=int(g["head"].max() + 1),
                             alpha=g[["task", "layer", "head", "alpha"]], similarity=pd.DataFrame(),
                             transfer=pd.DataFrame(), tokens=pd.DataFrame(), lenses=pd.DataFrame())
            prof = depth_profile(data)
            a = g.assign(depth=(g.layer + 0.5) / g.n_layers)
            com = (a.groupby("task").apply(lambda t: float((t.alpha * t.depth).sum() / t.alpha.sum()),
                                           include_groups=False))
            L = data.n_layers
            share = np.bincount(np.minimum(((np.arange(L) + 0.5) / L * 10).astype(int), 9), minlength=10) / L
            for r in prof.itertuples():
                rows.append({"source": source, "model": model, "n_tasks": len(common), "bin": r.bin,
                             "depth_low": r.depth_low, "mass": r.mass, "layer_share": share[r.bin],
                             "enrichment": r.mass / share[r.bin] if share[r.bin] else float("nan"),
                             "mean_alpha": r.mean_alpha, "centre_of_mass": float(com.mean())})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# report



def report(args) -> str:
    from sitelens.eval.metrics import bootstrap_ci
    from sitelens.io import atomic_write_csv, atomic_write_text

    out = Path(args.out)
    lines = ["# Cross-model transfer: Gemma-3-270M → SmolLM2-135M", "",
             "Made by `python benchmarks/cross_model.py --threads 1` (resumable) on the shared 2-core "
             "CPU; the module docstring has every definition. One seed (0) for every fit; test split "
             f"capped at the first {args.limit} items per task.", ""]
    r2 = out / "cross_model_r2.csv"
    if r2.exists():
        g = pd.read_csv(r2)
        diag = g[g.relative_depth_pair].sort_values("dst_index")
        fin = g[np.isfinite(g.r2_heldout)]
        best = fin.loc[fin.groupby("dst_index")["r2_heldout"].idxmax()].set_index("dst_index")
        lines += ["## The map: held-out R² per layer pair", "",
                  f"Affine ridge maps from Gemma's residual point i to SmolLM2's point j (point = "
                  f"state after i blocks; last-token states of {int(g.n_fit.iloc[0])} fitting and "
                  f"{int(g.n_heldout.iloc[0])} held-out unlabeled texts, held out by source: "
                  "`cross_model_texts.json`). Below: SmolLM2 point j, the Gemma point at the same "
                  "relative depth and its held-out R², and the best Gemma point for j. Point 0 is the "
                  "last token's embedding (the same `:` for every text): R² undefined there.", "",
                  "| SmolLM2 point (depth) | Gemma point | held-out R² | ridge ρ | best Gemma point "
                  "| its R² |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in diag.itertuples():
            b = best.loc[r.dst_index] if r.dst_index in best.index else None
            lines.append(f"| {r.dst_index} ({r.dst_depth:.2f}) | {r.src_index} | {r.r2_heldout:.3f} | "
                         f"{r.rho:g} | {'' if b is None else int(b.src_index)} | "
                         f"{'' if b is None else f'{b.r2_heldout:.3f}'} |")
        lines.append("")
    rt = out / "cross_model_r2_tasks.csv"
    if rt.exists():
        t = pd.read_csv(rt)
        piv = t.pivot_table(index="dst_index", columns="task", values="r2_task")
        sel = piv.loc[[j for j in piv.index if j in (5, 10, 15, 20, 25, 30)]]
        lines += ["R² of the same relative-depth maps on each evaluation task's 50 ten-shot prompts "
                  "(the states TV averages; R² around that task's own mean, so it measures how well "
                  "the within-task variation is carried):", "",
                  md_table(sel.round(2).reset_index().rename(columns={"dst_index": "SmolLM2 point"})), ""]
    res = out / "cross_model.csv"
    if res.exists():
        df = pd.read_csv(res, dtype={"error": str, "ltv_source": str}, keep_default_na=False,
                         na_values=[""]).drop_duplicates(["model", "task", "method"], keep="last")
        items = pd.read_csv(out / "cross_model_items.csv")
        ltv = sorted(set(df.ltv_source.dropna()) - {""})
        lines += ["## Accuracy", "",
                  "Exact match (FV) and full-label ranking accuracy (`cls/`), %, mean over tasks, "
                  "95% bootstrap CI over the pooled test items of those tasks. "
                  f"LTV version: {', '.join(f'`{v}`' for v in ltv) or '–'} (sha256 of "
                  "`sitelens/baselines/ltv.py` @ the last commit touching it).", ""]
        rows = []
        for (coll, metric, col) in (("fv", "exact match", "correct"),
                                    ("cls", "label acc (full)", "label_correct"),
                                    ("cls", "exact match", "correct")):
            d = df[df.collection == coll]
            if not len(d):
                continue
            for (model, method), g in d.groupby(["model", "method"], sort=False):
                keys = set(g.key)
                v = items[items.key.isin(keys)][col].astype(float).to_numpy()
                lo, hi = bootstrap_ci(v, n_boot=1000, seed=0)
                rows.append({"collection": coll, "metric": metric, "model": model, "method": method,
                             "tasks": len(g), "mean": pct(float(np.nanmean(v)) if v.size else np.nan),
                             "95% CI": f"{pct(lo)}–{pct(hi)}",
                             "chance": pct(g.chance.astype(float).mean()) if coll == "cls" else "–"})
        order = {m: i for i, m in enumerate([*DST_METHODS])}
        tab = pd.DataFrame(rows)
        if len(tab):
            tab = tab.assign(o=tab.method.map(order), m=tab.model != DST).sort_values(
                ["collection", "metric", "m", "o"]).drop(columns=["o", "m"])
            lines += [md_table(tab), ""]
        per = df.assign(acc=pd.to_numeric(pd.Series(np.where(
            df.collection == "cls", df.label_acc_full, df.exact_match), index=df.index), errors="coerce"))
        piv = per.pivot_table(index=["model", "method"], columns="task", values="acc")
        lines += ["Per task (exact match for FV, full-label accuracy for cls, %):", "",
                  md_table((100 * piv).round(0).reset_index().fillna("–")), ""]
        tr = df[df.method.str.contains("transfer")][["task", "method", "layer_src", "layer_dst",
                                                     "map_r2_heldout", "map_r2_task", "tv_rel_err"]]
        if len(tr):
            lines += ["Where each transfer acted (Gemma layer → SmolLM2 layer), the held-out R² of "
                      "the map used (mean over layers for SITE), its R² on the task's ten-shot "
                      "states (TV) and the carried TV state's distance from SmolLM2's own TV state "
                      "(relative to the distance of SmolLM2's mean unlabeled state: 0 = the same "
                      "state, 1 = as far as the mean):", "", md_table(tr.round(3).fillna("–")), ""]
        err = df[df.error.fillna("") != ""]
        if len(err):
            lines += [f"{len(err)} cell(s) failed: " + "; ".join(f"{r.task}/{r.method}: {r.error}"
                                                                 for r in err.itertuples()), ""]
    ad, com = alpha_depth(args), centre_of_mass(args)
    if len(ad):
        atomic_write_csv(out / "cross_model_alpha_depth.csv", ad)
        lines += ["## α maps by relative depth", "",
                  "Share of the total α in each relative-depth decile (a block's depth = (layer + 0.5) "
                  "/ n_layers; `sitelens.atlas.data.depth_profile`, mean over the tasks both models "
                  "have in that source) and the same divided by the decile's share of the blocks "
                  "(enrichment: 1 = as much α as a uniform map puts there; with 18 and 30 blocks a "
                  "decile holds 1 or 2 Gemma blocks but always 3 SmolLM2 blocks, so the raw shares "
                  "are not comparable decile by decile); the Pearson correlation of the two models' "
                  "enrichment profiles; and the α-weighted mean depth (centre of mass, mean over "
                  "tasks; 0.5 for a uniform map).", ""]
        for source, g in ad.groupby("source", sort=False):
            a = g[g.model == SRC].set_index("bin")
            b = g[g.model == DST].set_index("bin")
            if a.empty or b.empty:
                continue
            r = float(np.corrcoef(a.enrichment, b.enrichment)[0, 1])
            tab = pd.DataFrame({"decile": [f"{x:.1f}–{x + 0.1:.1f}" for x in a.depth_low],
                                "Gemma α share": a.mass.round(3).to_numpy(),
                                "Gemma enrichment": a.enrichment.round(2).to_numpy(),
                                "SmolLM2 α share": b.mass.round(3).to_numpy(),
                                "SmolLM2 enrichment": b.enrichment.round(2).to_numpy()})
            c = com[com.source == source].pivot(index="task", columns="model", values="centre_of_mass")
            diff = (c[DST] - c[SRC]).to_numpy(float)
            lo, hi = bootstrap_ci(diff, n_boot=1000, seed=0)
            lines += [f"### {source}: {int(a.n_tasks.iloc[0])} tasks; enrichment correlation r = "
                      f"{r:.2f}; centre of mass {a.centre_of_mass.iloc[0]:.3f} (Gemma) vs "
                      f"{b.centre_of_mass.iloc[0]:.3f} (SmolLM2), SmolLM2 − Gemma per task "
                      f"{diff.mean():+.3f} (95% CI over tasks {lo:+.3f} to {hi:+.3f})", "",
                      md_table(tab), ""]
    text = "\n".join(lines)
    atomic_write_text(out / "cross_model.md", text)
    return text


def main(argv=None) -> None:
    args = parse_args(argv)
    if not args.report:
        from sitelens.errors import SitelensError

        try:
            Run(args).go()
        except SitelensError as e:  # bad input: the message, exit status 2, nothing written
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    if not args.dry_run:
        print(report(args))


if __name__ == "__main__":
    main()
