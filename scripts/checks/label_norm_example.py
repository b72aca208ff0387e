"""The worked example of docs/tasks.md ("Why ``label_acc_full_norm`` can fall below chance").

    python scripts/checks/label_norm_example.py   # benchmarks/results/label_norm_example.{json,md}

60 country -> continent pairs (below; ``task_from_pairs`` splits them with seed 0), zero-shot on
SmolLM2-135M-Instruct with ``label_metrics=True``: the summary's label accuracies and chance, how
many test items the per-token mean (``full_norm``) ranks a multi-token label first, each label's
token count, and the label scores of the prompt ``Q: Spain\\nA:`` (summed and per-token). About a
minute on one CPU thread from the processed-weight cache.
"""

from __future__ import annotations

import argparse
import json

import torch

import sitelens as sl
from sitelens.eval.evaluation import evaluate, summarize
from sitelens.eval.labels import continuation_ids, label_set, score_labels
from sitelens.io import atomic_write_text
from sitelens.models import fingerprint
from sitelens.pipelines.experiment import RESULTS, md_table
from sitelens.provenance import NUMERICS_VERSION, task_hash
from sitelens.tasks import DEFAULT_TEMPLATE, task_from_pairs, zero_shot_prompt

CONTINENTS = {
    "Europe": "France Germany Spain Italy Poland Norway Greece Portugal Sweden Austria",
    "Asia": "Japan China India Thailand Vietnam Nepal Mongolia Laos Cambodia Pakistan",
    "Africa": "Kenya Nigeria Ghana Egypt Morocco Ethiopia Uganda Senegal Mali Angola",
    "North America": "Canada Mexico Cuba Jamaica Honduras Panama Guatemala Haiti Belize Nicaragua",
    "South America": "Brazil Argentina Chile Peru Colombia Bolivia Uruguay Paraguay Ecuador Venezuela",
    "Oceania": "Australia Fiji Samoa Tonga Vanuatu Kiribati Palau Tuvalu Nauru New_Zealand",
}
PAIRS = [(c.replace("_", " "), cont) for cont, cs in CONTINENTS.items() for c in cs.split()]
PROBE = "Spain"


def compute(model_name: str) -> dict:
    model = sl.load_model(model_name)
    task = task_from_pairs("country_continent", PAIRS)
    labels = label_set(task).labels
    n_tokens = {lab: len(ids) for lab, ids in zip(labels, continuation_ids(model, labels))}
    summary = summarize(evaluate(model, task, methods=["zero-shot"], label_metrics=True)).iloc[0]
    prompts = [zero_shot_prompt(ex.input, DEFAULT_TEMPLATE) for ex in task.test]
    scores = score_labels(model, [*prompts, zero_shot_prompt(PROBE, DEFAULT_TEMPLATE)],
                          [labels] * (len(prompts) + 1))
    *test_scores, probe = scores
    norm_picks = [s.predict("full_norm") for s in test_scores]
    return {
        "command": "python scripts/checks/label_norm_example.py",
        "model": model_name, "fingerprint": fingerprint(model), "task_hash": task_hash(task),
        "numerics_version": NUMERICS_VERSION, "torch": torch.__version__,
        "n_pairs": len(PAIRS), "n_test": len(task.test), "label_tokens": n_tokens,
        "summary": {k: float(summary[k]) for k in
                    ("exact_match", "label_acc_first", "label_acc_full", "label_acc_full_norm", "chance")},
        "full_norm_picks_multi_token": sum(n_tokens[p] > 1 for p in norm_picks),
        "gold_multi_token": sum(n_tokens[ex.output] > 1 for ex in task.test),
        "probe": {"input": PROBE, "in_test": PROBE in {ex.input for ex in task.test},
                  "scores": {lab: {"full": f, "full_norm": f / n, "n_tokens": n} for lab, f, n in
                             zip(probe.labels, probe.full.tolist(), probe.n_tokens.tolist())}},
    }


def report(r: dict) -> str:
    import pandas as pd

    probe = pd.DataFrame([{"label": lab, **v} for lab, v in r["probe"]["scores"].items()]).round(2)
    summ = pd.DataFrame([r["summary"]]).round(3)
    return "\n".join([
        "# Why `label_acc_full_norm` can fall below chance: the worked example", "",
        f"Made by `{r['command']}` (see its docstring); the numbers are in `label_norm_example.json`.", "",
        f"{r['model']}, zero-shot, {r['n_pairs']} country → continent pairs, {r['n_test']} test items. "
        f"The per-token mean ranked a multi-token label first on {r['full_norm_picks_multi_token']} of "
        f"them; {r['gold_multi_token']} have a multi-token gold label.", "",
        md_table(summ), "", f"Label scores of `Q: {r['probe']['input']}\\nA:` (log-probs):", "",
        md_table(probe), "",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    r = compute(args.model)
    atomic_write_text(RESULTS / "label_norm_example.json", json.dumps(r, indent=1) + "\n")
    atomic_write_text(RESULTS / "label_norm_example.md", report(r))
    print(report(r))


if __name__ == "__main__":
    main()
