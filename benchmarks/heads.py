"""Which heads matter: every lens on both bundled models, exact vs fast, α's schedule, agreement.

    python benchmarks/heads.py --models smollm2-135m-instruct --threads 1     # one model per process
    python benchmarks/heads.py --models gemma-3-270m --threads 1
    python benchmarks/heads.py --report                                       # tables + figure only
    python benchmarks/heads.py --tiny --out /tmp/heads                        # smoke test

Per (model, task) unit, written atomically to ``results/heads/{model}/{task}/`` and skipped on a
rerun when its ``meta.json`` has the same settings hash:

- ``scores.csv`` (:class:`sitelens.lenses.HeadScores`): ``alpha`` (SITE α, mean and 95%
  t-interval over ``--seeds`` fits with the default protocol, ``FitConfig()``: 50 steps of batch 8,
  best validation α), ``alpha-official`` (``--official-seeds`` fits with the paper code's schedule,
  ``FitConfig.official()``: 400 steps of batch 1, final α; on the first ``--official-tasks``
  tasks only, to bound the cost), and with the first default fit's
  embedding: ``alpha-grad``, ``atp``, ``atp-star``, ``effect`` (exact), ``ablation-mean``,
  ``ablation-zero``, ``dla``;
- ``stability.csv``: Spearman and top-10 Jaccard of every pair of seeds, per schedule;
- ``intra.csv``: intra-task patching at λ = 0 (:func:`sitelens.patching.intra_task`, k = 10,
  first-token accuracy on the first ``--limit`` test items, bootstrap CIs over items): per
  schedule and fit seed the top-10 / bottom-10 / random-10 α heads (3 random draws) and the
  full α; per lens the top-10 and bottom-10 heads of that lens's map, injected with α = 1.

The report (``--report``, also run at the end) writes ``results/heads_exact_vs_fast.{csv,md}``,
``results/heads_schedule.{csv,md}``, ``results/heads_agreement.{csv,md}`` and
``results/heads_lens_agreement.{png,html}`` and per-model figures under ``figures/`` (see
:mod:`heads_report`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
TASKS = ("antonym", "country_capital", "present_past", "english_french", "english_spanish",
         "first_letter", "capitalize_first_letter", "choose_first_of_3")  # figures' INTRA_TASKS
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
LENS_TOPK = ("alpha", "alpha-official", "alpha-grad", "atp", "atp-star", "effect",
             "ablation-mean", "ablation-zero", "dla")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", type=int, default=5, help="default-protocol fits per task")
    p.add_argument("--official-seeds", type=int, default=3, help="official-protocol fits per task")
    p.add_argument("--official-tasks", type=int, default=4,
                   help="official-protocol fits on the first N tasks only (the schedule experiment)")
    p.add_argument("--limit", type=int, default=40, help="test items of intra-task patching")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report", action="store_true", help="only (re)write the report")
    p.add_argument("--tiny", action="store_true", help="tiny random model, tiny sizes, k = 3 (smoke test)")
    p.add_argument("--out", default=str(HERE / "results"))
    return p.parse_args(argv)


def official_seeds(args, task) -> int:
    """Official-protocol fits of ``task``: ``--official-seeds`` on the first ``--official-tasks``
    tasks, none on the others."""
    names = [t for t in args.tasks.split(",") if t]
    return args.official_seeds if task.name in names[: args.official_tasks] else 0


def settings(args, model, task) -> dict:
    from sitelens import FitConfig
    from sitelens.lenses import AblationConfig, AttributionConfig
    from sitelens.models import fingerprint
    from sitelens.provenance import NUMERICS_VERSION, task_hash

    att, abl = configs(args)
    return {
        "model": args.model_name, "fingerprint": fingerprint(model), "task": task.name,
        "task_hash": task_hash(task), "seeds": args.seeds, "official_seeds": official_seeds(args, task),
        "limit": args.limit, "k": args.k, "fit": asdict(fit_config(args)),
        "official": asdict(fit_config(args, official=True)), "attribution": asdict(att),
        "ablation": asdict(abl), "numerics_version": NUMERICS_VERSION, "tiny": args.tiny,
        "_types": [type(c).__name__ for c in (FitConfig(), AttributionConfig(), AblationConfig())],
    }


def fit_config(args, official: bool = False):
    from sitelens import FitConfig

    small = {"n_examples": 16, "n_valid": 8} if args.tiny else {}
    if official:
        return FitConfig.official(**({"n_examples": 16, "eval_every": 8, "n_valid": 8}
                                     if args.tiny else {}))
    return FitConfig(**small)


def configs(args):
    from sitelens.lenses import AblationConfig, AttributionConfig

    if args.tiny:
        return (AttributionConfig(n_prompts=4, n_shots=2, n_mean_prompts=4, n_boot=100,
                                  n_alpha_items=8),
                AblationConfig(n_prompts=4, n_shots=2, n_boot=100))
    return AttributionConfig(), AblationConfig()


def run_unit(args, model, task, path: Path) -> None:
    from sitelens.io import atomic_write_dir, atomic_write_json
    from sitelens.lenses import (
        HeadScores,
        alpha_gradient,
        alpha_over_seeds,
        attribution_patching,
        direct_logit_attribution,
        exact_effects,
        head_ablation,
    )
    from sitelens.patching import intra_task
    from sitelens.provenance import settings_hash
    from sitelens.site import SiteAdapter

    st = settings(args, model, task)
    key = settings_hash(st)
    meta_path = path / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()).get("settings_hash") == key:
        print(f"  {task.name}: done (settings {key})", flush=True)
        return
    att, abl = configs(args)
    n_prompts, n_shots = att.n_mean_prompts, att.n_shots
    t0 = time.perf_counter()
    runs = {"default": alpha_over_seeds(model, task, range(args.seeds), fit_config(args),
                                        n_prompts=n_prompts, n_shots=n_shots, k=args.k)}
    if official_seeds(args, task):
        runs["official"] = alpha_over_seeds(model, task, range(official_seeds(args, task)),
                                            fit_config(args, official=True), n_prompts=n_prompts,
                                            n_shots=n_shots, k=args.k, lens="alpha-official")
    ad0 = runs["default"].adapters[0]
    emb = ad0.embedding
    parts = [r.scores for r in runs.values()] + [
             alpha_gradient(model, task, emb, att),
             attribution_patching(model, task, emb, att),
             attribution_patching(model, task, emb, att, grad_drop=True),
             exact_effects(model, task, emb, att),
             head_ablation(model, task, abl, reference="mean"),
             head_ablation(model, task, abl, reference="zero"),
             direct_logit_attribution(model, task, ad0, limit=64 if not args.tiny else 8,
                                      n_boot=att.n_boot)]
    scores = HeadScores.concat(parts)
    print(f"  {task.name}: lenses {time.perf_counter() - t0:.0f} s", flush=True)

    stab = pd.concat([r.stability.assign(schedule=s) for s, r in runs.items()], ignore_index=True)
    intra = []
    for sched, run in runs.items():
        for seed, ad in enumerate(run.adapters):
            df = intra_task(model, task, ad, ks=[args.k], n_random_seeds=3, limit=args.limit,
                            reverse=False, seed=0)
            intra.append(df.assign(kind="alpha_fit", schedule=sched, fit_seed=seed, lens="alpha"))
    for lens in [x for x in LENS_TOPK if x in scores.lenses]:
        m = scores.map(lens)  # [n_layers, n_heads]
        m = torch.nan_to_num(m, nan=float("-inf"))
        ad = SiteAdapter(alpha=m, embedding=emb, meta=ad0.meta)
        df = intra_task(model, task, ad, ks=[args.k], n_random_seeds=0, limit=args.limit,
                        reverse=False, references=False, seed=0)
        intra.append(df.assign(kind="lens_topk", schedule="", fit_seed=pd.NA, lens=lens))
    intra = pd.concat(intra, ignore_index=True)
    seconds = time.perf_counter() - t0

    def fill(tmp: Path) -> None:
        scores.to_csv(tmp / "scores.csv")
        stab.to_csv(tmp / "stability.csv", index=False)
        intra.to_csv(tmp / "intra.csv", index=False)
        atomic_write_json(tmp / "meta.json", {
            "settings_hash": key, "settings": st, "seconds": seconds,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "best_steps": {s: [a.meta["best_step"] for a in r.adapters] for s, r in runs.items()},
        })

    if path.exists():  # stale settings: keep the old unit beside, never overwrite it
        path.rename(path.with_name(f"{path.name}.stale-{int(time.time())}"))
    atomic_write_dir(path, fill)
    print(f"  {task.name}: {seconds:.0f} s", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tiny:
        args.k = 3
    out = Path(args.out)
    if not args.report:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        torch.set_num_threads(args.threads)
        import sitelens as sl

        models = ["tiny-random"] if args.tiny else [m for m in args.models.split(",") if m]
        tasks = [t for t in args.tasks.split(",") if t][: 2 if args.tiny else None]
        for name in models:
            model = sl.load_model(name)
            args.model_name = sl.models.model_name(model)
            print(f"{args.model_name}: {len(tasks)} tasks", flush=True)
            for t in tasks:
                task = sl.load_task(t)
                run_unit(args, model, task, out / "heads" / args.model_name / task.name)
    sys.path.insert(0, str(HERE))
    from heads_report import write_report

    write_report(out, figures=(out.parent.parent / "figures") if not args.tiny else out, k=args.k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
