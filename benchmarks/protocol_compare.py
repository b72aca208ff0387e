"""The default protocol vs the official (paper-code) protocol, fit + eval, on FV tasks.

Per task and protocol, SITE is fitted under that protocol and zero-shot, 10-shot ICL and SITE are
evaluated under it on the first ``--limit`` test items; the adapter is also scored under the other
protocol (``cross`` rows), separating the fit from the scoring. A row per (task, fit protocol,
eval protocol, method) in ``results/protocol_compare.csv``; a (task, protocol) pair is done when
it has rows. The protocols are described in docs/tasks.md.

    python benchmarks/protocol_compare.py --data-root ../shared/datasets --limit 50 --threads 1
    python benchmarks/protocol_compare.py --report
"""

from __future__ import annotations

import time

import pandas as pd

from sitelens.pipelines.experiment import Experiment, Job, main, pct

COMMAND = "python benchmarks/protocol_compare.py --data-root ../shared/datasets --limit 50 --threads 1"
# the 8-task sample of site_fv.py's reference-schedule rows, plus the two FV tasks where the
# official formatting and scoring touch many targets: word_length (every answer is all digits)
# and country-currency (28 of its 42 test targets carry a parenthesis)
TASKS = (
    "antonym", "word_length", "country-currency", "country-capital", "english-french",
    "present-past", "singular-plural", "capitalize_first_letter", "person-occupation",
    "choose_first_of_3",
)
PROTOCOLS = ("default", "official")
FIELDS = [
    "model", "task", "fit_protocol", "eval_protocol", "method", "first_token_acc", "exact_match",
    "n", "seconds_per_item", "stage1_seconds", "stage2_seconds", "kept_step", "final_valid_loss",
    "n_digit_targets", "n_paren_targets",
]
INTRO = [
    "Test split capped at the first 50 items per task (`--limit 50`, `evaluate(..., limit=50)`); seed 0. "
    "Exact match (EM) and first-token accuracy (FT) in %; Δ = official − default, in points.", "",
    "- **default**: `FitConfig()` — 400 training examples in batches of 8 (shuffled passes), validation on "
    "64 valid items every 10 steps, the best-validation α kept; generation of up to min(32, answer tokens + "
    "2) tokens, stopped at a newline; first line, lowercased unless the task is case-sensitive, prefix "
    "match; a space before every answer.",
    "- **official**: `FitConfig.official()` + `evaluate(..., protocol=\"official\")` — the public SITE code "
    "(github.com/SNU-DRL/Soft_Injection): 400 steps of batch 1 drawn i.i.d., validation on the first 100 "
    "valid items every 50 steps, the final α kept; up to 20 new tokens (at least 1), no newline stop; `St.` "
    "→ `Saint`, cut at `(`, first line, lowercased except capitalize/lowercase tasks, prefix match; no space "
    "before an all-digit answer.", "",
]


def em_ft(d, o) -> str:
    """``| EM d | EM o | Δ EM | FT d | FT o | Δ FT`` of two rows (default, official)."""
    return (f"{pct(d.exact_match)} | {pct(o.exact_match)} | {100 * (o.exact_match - d.exact_match):+.1f} | "
            f"{pct(d.first_token_acc)} | {pct(o.first_token_acc)} | "
            f"{100 * (o.first_token_acc - d.first_token_acc):+.1f}")


class ProtocolCompare(Experiment):
    name = "protocol_compare"
    columns = FIELDS
    key = None
    models = ("smollm2-135m-instruct",)
    tasks = TASKS
    limit = 50

    def add_arguments(self, p) -> None:
        p.add_argument("--seed", type=int, default=0)

    def done_keys(self) -> set[str]:
        df = self.read()
        return {f"{t}/{p}" for t, p in zip(df.task, df.fit_protocol)}

    def cells(self, args):
        return [Job(f"{t}/{p}", f"{t} [{p}]", {"task": t, "protocol": p})
                for t in args.tasks for p in PROTOCOLS]

    def run(self, job: Job) -> list[dict]:
        from sitelens import FitConfig, fit_site, load_task, summarize
        from sitelens.eval import evaluate
        from sitelens.pipelines.executors import cached_model

        args, proto, name = self.args, job["protocol"], job["task"]
        model = cached_model(args.models[0])
        task = load_task(args.data_root / "fv" / name, dedupe=True)
        test = task.test[: args.limit]
        counts = {"n_digit_targets": sum(ex.output.isdigit() for ex in test),
                  "n_paren_targets": sum("(" in ex.output for ex in test)}
        t0 = time.perf_counter()
        adapter = fit_site(model, task, config=(FitConfig.official if proto == "official" else FitConfig)(
            seed=args.seed))
        m = adapter.meta
        fit_info = {"stage1_seconds": round(m["stage1_seconds"], 2),
                    "stage2_seconds": round(m["stage2_seconds"], 2), "kept_step": m["best_step"],
                    "final_valid_loss": round(m["final_valid_loss"], 4)}
        other = "official" if proto == "default" else "default"
        rows = []
        for eval_proto, methods in ((proto, ["zero-shot", "icl", "site"]), (other, ["site"])):
            df = evaluate(model, task, methods=methods, adapter=adapter, limit=args.limit, seed=args.seed,
                          protocol=eval_proto)
            rows += [{"model": args.models[0], "task": name, "fit_protocol": proto,
                      "eval_protocol": eval_proto, "method": r.method,
                      "first_token_acc": round(r.first_token_acc, 4),
                      "exact_match": round(r.exact_match, 4), "n": r.n,
                      "seconds_per_item": round(r.seconds_per_item, 4), **counts,
                      **(fit_info if r.method == "site" else {})} for r in summarize(df).itertuples()]
        em = {(r["eval_protocol"], r["method"]): r["exact_match"] for r in rows}
        print(f"{name} [{proto}]: {em}  ({time.perf_counter() - t0:.0f}s)", flush=True)
        return rows

    def report(self, df: pd.DataFrame) -> str:
        matched = df[df.fit_protocol == df.eval_protocol]
        tasks = [t for t in TASKS if t in set(df.task)] + sorted(set(df.task) - set(TASKS))
        both = [t for t in tasks if set(matched[matched.task == t].fit_protocol) == set(PROTOCOLS)]
        lines = [
            "# Default protocol vs official (paper-code) protocol", "",
            f"Made by `{COMMAND}`, then `python benchmarks/protocol_compare.py --report`, with "
            f"`{df.model.iloc[0]}`, one torch thread, on the 2-core CPU machine while other jobs shared the "
            "cores (seconds are inflated by contention). " + INTRO[0], *INTRO[1:],
            f"Tasks with both protocols finished: {len(both)} of {len(tasks)}.", "",
        ]
        if not both:
            return "\n".join(lines + [""])
        sub = matched[matched.task.isin(both)]
        piv = sub.pivot_table(index=["task", "method"], columns="fit_protocol",
                              values=["exact_match", "first_token_acc"])
        sample = [t for t in both if t not in ("word_length", "country-currency")]
        sample_title = f"the {len(sample)}-task sample (without word_length and country-currency)"
        for title, subset in ((f"all {len(both)} tasks", both), (sample_title, sample)):
            lines += [f"## Means over {title}", "",
                      "| method | EM default | EM official | Δ EM | FT default | FT official | Δ FT |",
                      "|---|---|---|---|---|---|---|"]
            for method in ("site", "icl", "zero-shot"):
                p = piv.xs(method, level="method").loc[subset].mean()
                d, o = (pd.Series({c: p[(c, x)] for c in ("exact_match", "first_token_acc")})
                        for x in PROTOCOLS)
                lines.append(f"| {method} | {em_ft(d, o)} |")
            lines.append("")
        lines += [
            "On word_length every answer is a number: under the default protocol the answer token "
            "is the space of `\" 5\"`, which the model always predicts (FT 100%, EM 0%), so the "
            "default FT there measures nothing; the official protocol scores the digit itself.", "",
            "## SITE per task (fit and eval under the same protocol)", "",
            "| task | EM default | EM official | Δ EM | FT default | FT official | Δ FT | digit / `(` "
            "targets | kept step (default, official) | stage 2 s (default, official) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
        site = sub[sub.method == "site"].set_index(["task", "fit_protocol"])
        for t in both:
            d, o = site.loc[(t, "default")], site.loc[(t, "official")]
            lines.append(f"| {t} | {em_ft(d, o)} | {int(d.n_digit_targets)} / {int(d.n_paren_targets)} | "
                         f"{int(d.kept_step)}, {int(o.kept_step)} | "
                         f"{d.stage2_seconds:.0f}, {o.stage2_seconds:.0f} |")
        cp = df[(df.method == "site") & df.task.isin(both)].pivot_table(
            index="fit_protocol", columns="eval_protocol", values=["exact_match", "first_token_acc"],
            aggfunc="mean")
        lines += ["", "## SITE: fit protocol × scoring protocol (means over the same tasks)", "",
                  "Each adapter is also scored under the other protocol's generation and scoring, "
                  "which separates the effect of the fit from that of the scoring.", "",
                  "| fit ↓ / scored → | EM default | EM official | FT default | FT official |",
                  "|---|---|---|---|---|"]
        cols = [(v, e) for v in ("exact_match", "first_token_acc") for e in PROTOCOLS]
        lines += [f"| {fp} | " + " | ".join(pct(cp.loc[fp][c]) for c in cols) + " |"
                  for fp in PROTOCOLS if fp in cp.index]
        lines += ["", "## zero-shot and 10-shot ICL per task", "",
                  "| task | ICL EM default | ICL EM official | zero-shot EM default | zero-shot EM "
                  "official |",
                  "|---|---|---|---|---|"]
        for t in both:
            r = piv.loc[t]["exact_match"]
            lines.append(f"| {t} | " + " | ".join(pct(r.loc[m, p]) for m in ("icl", "zero-shot")
                                                 for p in PROTOCOLS) + " |")
        return "\n".join(lines + [""])


if __name__ == "__main__":
    raise SystemExit(main(ProtocolCompare()))
