"""What ``ltv-valid`` chose on the regression tasks, and why (issue 21, part 4).

    python scripts/checks/ltv_valid_choice.py --threads 1   # benchmarks/results/ltv_valid_choice.{csv,md}

``LTVValid`` picks λ (and the block, when it sweeps) by first-token accuracy on the first 64
valid items, then the lower loss. On ``benchmarks/regression.py``'s tasks the first answer token
is only the sign of the number, so the candidates can tie on accuracy and the choice falls to the
tie-break. This script refits ``LTVValid()`` exactly as ``regression.py`` does (same task, seed 0,
defaults) and writes every candidate's valid accuracy and loss, marking the one kept. One row per
(model, task, candidate), keyed on the weight fingerprint, task hash, seed, ``LTVValid``'s settings
and the numerics version; a rerun skips the keys already in the CSV and appends the rest
(~5 min per model × task on one thread), and the md is rewritten from the whole CSV.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

import sitelens as sl
from sitelens.baselines import LTVValid
from sitelens.io import atomic_write_text
from sitelens.models import fingerprint, model_name
from sitelens.pipelines.experiment import RESULTS, md_table
from sitelens.pipelines.store import ResultsStore
from sitelens.provenance import NUMERICS_VERSION, settings_hash, task_hash
from sitelens.tasks.regression import regression_task

SIZES = dict(n_train=256, n_valid=64, n_test=128)  # regression.py's splits
FIELDS = ["model", "fingerprint", "task", "task_hash", "seed", "method", "numerics_version", "key",
          "layer", "rel_lam", "lam", "valid_first_token_acc", "valid_loss", "kept"]


def choices(model, task, seed: int, key: str, method: LTVValid) -> list[dict]:
    fitted = method.fit(model, task, seed=seed)
    kept = (fitted.meta["rel_lam"], fitted.state["layer"])
    return [{"model": model_name(model), "fingerprint": fingerprint(model), "task": task.name,
             "task_hash": task_hash(task), "seed": seed, "method": repr(method),
             "numerics_version": NUMERICS_VERSION, "key": key, "layer": r["layer"],
             "rel_lam": r["rel_lam"], "lam": r["lam"], "valid_first_token_acc": r["valid_acc"],
             "valid_loss": r["valid_loss"], "kept": (r["rel_lam"], r["layer"]) == kept}
            for r in fitted.meta["lam_table"]]


def report(df: pd.DataFrame) -> str:
    lines = ["# What `ltv-valid` chose on the regression tasks", "",
             "`python scripts/checks/ltv_valid_choice.py` (see its docstring). Every candidate "
             "`LTVValid()` scored on the first 64 valid items: first-token accuracy (for these "
             "answers, the sign token) and loss; **kept** is the one the method used.", ""]
    for (model, task), g in df.groupby(["model", "task"], sort=False):
        t = g.assign(valid_first_token_acc=(100 * g.valid_first_token_acc).round(1),
                     valid_loss=g.valid_loss.round(4), lam=g.lam.map(lambda x: f"{x:.3g}"),
                     kept=g.kept.map(lambda k: "**kept**" if k else ""))
        n_acc = t.valid_first_token_acc.nunique()
        lines += [f"## {model}, {task}", "",
                  f"{len(t)} candidates, {n_acc} distinct valid accuracies.", "",
                  md_table(t[["layer", "rel_lam", "lam", "valid_first_token_acc", "valid_loss",
                              "kept"]]), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    ap.add_argument("--kinds", default="linear,relu")
    ap.add_argument("--dim", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "ltv_valid_choice.csv"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out, method = Path(args.out), LTVValid()
    store = ResultsStore(out, FIELDS)
    done = store.keys()
    for name in args.models.split(","):
        model = sl.load_model(name)
        for kind in args.kinds.split(","):
            task = regression_task(kind, dim=args.dim, seed=args.seed, **SIZES)
            key = settings_hash({"fingerprint": fingerprint(model), "task_hash": task_hash(task),
                                 "seed": args.seed, "method": repr(method),
                                 "numerics_version": NUMERICS_VERSION}, n=16)
            if key not in done:
                store.append(choices(model, task, args.seed, key, method))
            print(f"{name} {kind}: done", file=sys.stderr, flush=True)
        del model
    df = pd.read_csv(out)
    atomic_write_text(out.with_suffix(".md"), report(df))
    print(report(df))


if __name__ == "__main__":
    main()
