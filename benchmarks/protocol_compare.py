"""The default protocol vs the official (paper-code) protocol, fit + eval, on FV tasks.

For each task and each protocol, SITE is fitted under that protocol and zero-shot, 10-shot ICL and
SITE are evaluated under it on the first ``--limit`` test items (default 50). The SITE adapter is
also scored under the *other* protocol's generation and scoring (``cross`` rows), which separates
the effect of the fit (stage 2, digit formatting) from the effect of the scoring.

- default: 400 training examples in batches of 8 (shuffled passes), the α with the best
  validation loss kept; up to min(32, answer tokens + 2) new tokens, stop at a newline, first
  line, lowercased unless case-sensitive, prefix match.
- official (``FitConfig.official()``, ``evaluate(..., protocol="official")``): 400 steps of batch
  1 drawn i.i.d., validation on the first 100 valid items every 50 steps, the final α kept; up to
  20 new tokens (at least 1), no stop at a newline; cut at ``(``, ``St.`` → ``Saint``; no space
  before an all-digit answer.

One CSV row per (task, fit protocol, eval protocol, method), all rows of a (task, fit protocol)
appended together when it finishes; a rerun skips the (task, protocol) pairs already in the CSV.

    python benchmarks/protocol_compare.py --fv ../shared/datasets/fv --limit 50 --threads 1
    python benchmarks/protocol_compare.py --summarize
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from sitelens.pipelines.experiment import DATA_ROOT, pct
from sitelens.pipelines.store import ResultsStore

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CSV = RESULTS / "protocol_compare.csv"
COMMAND = "python benchmarks/protocol_compare.py --fv ../shared/datasets/fv --limit 50 --threads 1"

# the 8-task sample of site_fv.py's reference-schedule rows, plus the two FV tasks where the
# official formatting and scoring touch many targets: word_length (every answer is all digits)
# and country-currency (28 of its 42 test targets carry a parenthesis)
TASKS = [
    "antonym", "word_length", "country-currency", "country-capital", "english-french",
    "present-past", "singular-plural", "capitalize_first_letter", "person-occupation",
    "choose_first_of_3",
]
PROTOCOLS = ("default", "official")
FIELDS = [
    "model", "task", "fit_protocol", "eval_protocol", "method", "first_token_acc", "exact_match",
    "n", "seconds_per_item", "stage1_seconds", "stage2_seconds", "kept_step", "final_valid_loss",
    "n_digit_targets", "n_paren_targets",
]


def _done(path: Path) -> set[tuple[str, str]]:
    if not path.exists():
        return set()
    df = pd.read_csv(path)
    return set(zip(df.task, df.fit_protocol))


def run(args) -> None:
    from sitelens import FitConfig, fit_site, load_model, load_task, summarize
    from sitelens.eval import evaluate

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done(out)
    model = load_model(args.model)
    fv = Path(args.fv)
    names = [t for t in (args.tasks.split(",") if args.tasks else TASKS) if t]
    for name in names:
        task = load_task(fv / name, dedupe=True)
        test = task.test[: args.limit]
        counts = {
            "n_digit_targets": sum(ex.output.isdigit() for ex in test),
            "n_paren_targets": sum("(" in ex.output for ex in test),
        }
        for proto in PROTOCOLS:
            if (name, proto) in done:
                continue
            t0 = time.perf_counter()
            cfg = FitConfig.official(seed=args.seed) if proto == "official" else FitConfig(seed=args.seed)
            adapter = fit_site(model, task, config=cfg)
            m = adapter.meta
            fit_info = {
                "stage1_seconds": round(m["stage1_seconds"], 2),
                "stage2_seconds": round(m["stage2_seconds"], 2),
                "kept_step": m["best_step"],
                "final_valid_loss": round(m["final_valid_loss"], 4),
            }
            other = "official" if proto == "default" else "default"
            rows = []
            for eval_proto, methods in ((proto, ["zero-shot", "icl", "site"]), (other, ["site"])):
                df = evaluate(model, task, methods=methods, adapter=adapter, limit=args.limit,
                              seed=args.seed, protocol=eval_proto)
                for r in summarize(df).itertuples():
                    rows.append({
                        "model": args.model, "task": name, "fit_protocol": proto,
                        "eval_protocol": eval_proto, "method": r.method,
                        "first_token_acc": round(r.first_token_acc, 4),
                        "exact_match": round(r.exact_match, 4), "n": r.n,
                        "seconds_per_item": round(r.seconds_per_item, 4), **counts,
                        **(fit_info if r.method == "site" else {}),
                    })
            ResultsStore(out, FIELDS, key=None).append(rows)
            em = {(r["eval_protocol"], r["method"]): r["exact_match"] for r in rows}
            print(f"{name} [{proto}]: {em}  ({time.perf_counter() - t0:.0f}s)", flush=True)



def summarize_all(out: Path = CSV) -> str:
    df = pd.read_csv(out)
    model = df.model.iloc[0]
    matched = df[df.fit_protocol == df.eval_protocol]
    tasks = [t for t in TASKS if t in set(df.task)] + sorted(set(df.task) - set(TASKS))
    both = [t for t in tasks if set(matched[matched.task == t].fit_protocol) == set(PROTOCOLS)]
    lines = [
        "# Default protocol vs official (paper-code) protocol",
        "",
        f"Made by `{COMMAND}`, then `python benchmarks/protocol_compare.py --summarize`, with "
        f"`{model}`, one torch thread, on the 2-core CPU machine while other jobs shared the cores "
        "(seconds are inflated by contention). Test split capped at the first 50 items per task "
        "(`--limit 50`, `evaluate(..., limit=50)`); seed 0. Exact match (EM) and first-token "
        "accuracy (FT) in %; Δ = official − default, in points.",
        "",
        "- **default**: `FitConfig()` — 400 training examples in batches of 8 (shuffled passes), "
        "validation on 64 valid items every 10 steps, the best-validation α kept; generation of up "
        "to min(32, answer tokens + 2) tokens, stopped at a newline; first line, lowercased unless "
        "the task is case-sensitive, prefix match; a space before every answer.",
        "- **official**: `FitConfig.official()` + `evaluate(..., protocol=\"official\")` — the public "
        "SITE code (github.com/SNU-DRL/Soft_Injection): 400 steps of batch 1 drawn i.i.d., "
        "validation on the first 100 valid items every 50 steps, the final α kept; up to 20 new "
        "tokens (at least 1), no newline stop; `St.` → `Saint`, cut at `(`, first line, lowercased "
        "except capitalize/lowercase tasks, prefix match; no space before an all-digit answer.",
        "",
        f"Tasks with both protocols finished: {len(both)} of {len(tasks)}.",
        "",
    ]
    if both:
        sub = matched[matched.task.isin(both)]
        piv = sub.pivot_table(index=["task", "method"], columns="fit_protocol",
                              values=["exact_match", "first_token_acc"])
        sample = [t for t in both if t not in ("word_length", "country-currency")]
        for title, subset in ((f"all {len(both)} tasks", both),
                              (f"the {len(sample)}-task sample (without word_length and "
                               "country-currency)", sample)):
            lines += [f"## Means over {title}", "",
                      "| method | EM default | EM official | Δ EM | FT default | FT official | Δ FT |",
                      "|---|---|---|---|---|---|---|"]
            for method in ("site", "icl", "zero-shot"):
                p = piv.xs(method, level="method").loc[subset]
                em, ft = p["exact_match"].mean(), p["first_token_acc"].mean()
                lines.append(
                    f"| {method} | {pct(em['default'])} | {pct(em['official'])} | "
                    f"{100 * (em['official'] - em['default']):+.1f} | {pct(ft['default'])} | "
                    f"{pct(ft['official'])} | {100 * (ft['official'] - ft['default']):+.1f} |"
                )
            lines.append("")
        lines += [
            "On word_length every answer is a number: under the default protocol the answer token "
            "is the space of `\" 5\"`, which the model always predicts (FT 100%, EM 0%), so the "
            "default FT there measures nothing; the official protocol scores the digit itself.",
            "",
        ]
        lines += ["## SITE per task (fit and eval under the same protocol)", "",
                  "| task | EM default | EM official | Δ EM | FT default | FT official | Δ FT "
                  "| digit / `(` targets | kept step (default, official) | stage 2 s (default, "
                  "official) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        site = sub[sub.method == "site"].set_index(["task", "fit_protocol"])
        for t in both:
            d, o = site.loc[(t, "default")], site.loc[(t, "official")]
            lines.append(
                f"| {t} | {pct(d.exact_match)} | {pct(o.exact_match)} | "
                f"{100 * (o.exact_match - d.exact_match):+.1f} | {pct(d.first_token_acc)} | "
                f"{pct(o.first_token_acc)} | {100 * (o.first_token_acc - d.first_token_acc):+.1f} | "
                f"{int(d.n_digit_targets)} / {int(d.n_paren_targets)} | {int(d.kept_step)}, "
                f"{int(o.kept_step)} | {d.stage2_seconds:.0f}, {o.stage2_seconds:.0f} |"
            )
        # fit × scoring: SITE adapters of each protocol scored under each protocol
        cross = df[(df.method == "site") & df.task.isin(both)]
        cp = cross.pivot_table(index="fit_protocol", columns="eval_protocol",
                               values=["exact_match", "first_token_acc"], aggfunc="mean")
        lines += ["", "## SITE: fit protocol × scoring protocol (means over the same tasks)", "",
                  "Each adapter is also scored under the other protocol's generation and scoring, "
                  "which separates the effect of the fit from that of the scoring.", "",
                  "| fit ↓ / scored → | EM default | EM official | FT default | FT official |",
                  "|---|---|---|---|---|"]
        for fp in PROTOCOLS:
            if fp in cp.index:
                r = cp.loc[fp]
                lines.append(
                    f"| {fp} | {pct(r[('exact_match', 'default')])} | "
                    f"{pct(r[('exact_match', 'official')])} | "
                    f"{pct(r[('first_token_acc', 'default')])} | "
                    f"{pct(r[('first_token_acc', 'official')])} |"
                )
        lines += ["", "## zero-shot and 10-shot ICL per task", "",
                  "| task | ICL EM default | ICL EM official | zero-shot EM default | zero-shot EM "
                  "official |", "|---|---|---|---|---|"]
        for t in both:
            r = piv.loc[t]["exact_match"]
            lines.append(f"| {t} | {pct(r.loc['icl', 'default'])} | {pct(r.loc['icl', 'official'])} "
                         f"| {pct(r.loc['zero-shot', 'default'])} | "
                         f"{pct(r.loc['zero-shot', 'official'])} |")
    lines.append("")
    text = "\n".join(lines)
    out.with_suffix(".md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--fv", default=str(DATA_ROOT / "fv"))
    ap.add_argument("--limit", type=int, default=50, help="first N test items per task")
    ap.add_argument("--tasks", default="", help="comma-separated FV task names (default: TASKS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(CSV), help="results CSV (the .md is written beside it)")
    ap.add_argument("--summarize", action="store_true", help="only write the markdown summary")
    args = ap.parse_args()
    if not args.summarize:
        run(args)
    print(summarize_all(Path(args.out)))


if __name__ == "__main__":
    main()
