"""The default protocol vs the official (paper-code) protocol, fit + eval, on FV tasks: SITE fitted
under each, zero-shot, ICL and SITE scored under it, the adapter also under the other (docs/tasks.md).

    python benchmarks/protocol_compare.py --data-root ../shared/datasets --limit 50 --threads 1
"""

from __future__ import annotations

import pandas as pd

from sitelens import FitConfig, fit_site, load_task, summarize
from sitelens.eval.evaluation import evaluate
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, main, md_table, pct

# the 8-task sample of site_fv.py's reference-schedule rows, plus the two FV tasks where the
# official formatting and scoring touch many targets: word_length (every answer is all digits)
# and country-currency (28 of its 42 test targets carry a parenthesis)
TASKS = ("antonym", "word_length", "country-currency", "country-capital", "english-french", "present-past",
         "singular-plural", "capitalize_first_letter", "person-occupation", "choose_first_of_3")
PROTOCOLS = ("default", "official")
FIELDS = ["model", "task", "fit_protocol", "eval_protocol", "method", "first_token_acc", "exact_match", "n",
          "seconds_per_item", "stage1_seconds", "stage2_seconds", "kept_step", "final_valid_loss",
          "n_digit_targets", "n_paren_targets"]


def em_ft(p: pd.DataFrame) -> pd.DataFrame:
    """EM and FT (in %) under each protocol and Δ = official − default (points) of the rows of ``p``,
    whose columns are (metric, protocol)."""
    out = {}
    for metric, short in (("exact_match", "EM"), ("first_token_acc", "FT")):
        d, o = p[(metric, "default")], p[(metric, "official")]
        out |= {f"{short} default": d.map(pct), f"{short} official": o.map(pct),
                f"Δ {short}": (100 * (o - d)).map("{:+.1f}".format)}
    return pd.DataFrame(out)


class ProtocolCompare(Experiment):
    name, title = "protocol_compare", "Default protocol vs official (paper-code) protocol"
    columns, key, models, tasks, limit = FIELDS, None, ("smollm2-135m-instruct",), TASKS, 50

    def done_keys(self) -> set[str]:
        df = self.read()
        return {f"{t}/{p}" for t, p in zip(df.task, df.fit_protocol)}

    def cells(self, args):
        return [Job(f"{t}/{p}", f"{t} [{p}]", {"task": t, "protocol": p})
                for t in args.tasks for p in PROTOCOLS]

    def run(self, job: Job) -> list[dict]:
        args, proto, name = self.args, job["protocol"], job["task"]
        model = cached_model(args.models[0])
        task = load_task(args.data_root / "fv" / name, dedupe=True)
        test = task.test[: args.limit]
        counts = {"n_digit_targets": sum(ex.output.isdigit() for ex in test),
                  "n_paren_targets": sum("(" in ex.output for ex in test)}
        config = FitConfig.official(seed=0) if proto == "official" else FitConfig(seed=0)
        adapter = fit_site(model, task, config=config)
        m = adapter.meta
        fit_info = {"stage1_seconds": round(m["stage1_seconds"], 2),
                    "stage2_seconds": round(m["stage2_seconds"], 2), "kept_step": m["best_step"],
                    "final_valid_loss": round(m["final_valid_loss"], 4)}
        other = "official" if proto == "default" else "default"
        rows = []
        for eval_proto, methods in ((proto, ["zero-shot", "icl", "site"]), (other, ["site"])):
            df = evaluate(model, task, methods=methods, adapter=adapter, limit=args.limit, seed=0,
                          protocol=eval_proto)
            rows += [{"model": args.models[0], "task": name, "fit_protocol": proto,
                      "eval_protocol": eval_proto, "method": r.method,
                      "first_token_acc": round(r.first_token_acc, 4),
                      "exact_match": round(r.exact_match, 4), "n": r.n,
                      "seconds_per_item": round(r.seconds_per_item, 4), **counts,
                      **(fit_info if r.method == "site" else {})} for r in summarize(df).itertuples()]
        return rows

    def report(self, df: pd.DataFrame) -> str:
        matched = df[df.fit_protocol == df.eval_protocol]
        tasks = [t for t in TASKS if t in set(df.task)] + sorted(set(df.task) - set(TASKS))
        both = [t for t in tasks if set(matched[matched.task == t].fit_protocol) == set(PROTOCOLS)]
        lines = [f"`{df.model.iloc[0]}`, one torch thread while other jobs shared the 2 cores; the first 50 "
                 "test items per task, seed 0; the protocols: docs/tasks.md. EM, FT: exact match and "
                 "first-token accuracy in %; Δ = official − default, in points. Tasks with both protocols "
                 f"finished: {len(both)} of {len(tasks)}.", ""]
        if not both:
            return "\n".join(lines)
        values = ["exact_match", "first_token_acc"]
        sub = matched[matched.task.isin(both)]
        piv = sub.pivot_table(index=["task", "method"], columns="fit_protocol", values=values)
        sample = [t for t in both if t not in ("word_length", "country-currency")]
        for title, subset in ((f"all {len(both)} tasks", both), (
                f"the {len(sample)}-task sample (without word_length and country-currency)", sample)):
            means = piv[piv.index.get_level_values("task").isin(subset)].groupby(level="method").mean()
            lines += [f"## Means over {title}", "",
                      md_table(em_ft(means.loc[["site", "icl", "zero-shot"]]).reset_index()), ""]
        site = sub[sub.method == "site"].set_index(["task", "fit_protocol"]).unstack().loc[both]
        per_task = em_ft(site).assign(**{
            "digit / `(` targets": [f"{int(d)} / {int(p)}" for d, p in zip(
                site[("n_digit_targets", "default")], site[("n_paren_targets", "default")])],
            "kept step (default, official)": [f"{int(d)}, {int(o)}" for d, o in site["kept_step"].values],
            "stage 2 s (default, official)": [f"{d:.0f}, {o:.0f}" for d, o in site["stage2_seconds"].values]})
        cross = df[(df.method == "site") & df.task.isin(both)].pivot_table(
            index="fit_protocol", columns="eval_protocol", values=values, aggfunc="mean")
        cross.columns = [f"{'EM' if v == 'exact_match' else 'FT'} {e}" for v, e in cross.columns]
        ref = piv["exact_match"].unstack("method").loc[both]
        ref = pd.DataFrame({f"{'ICL' if m == 'icl' else m} EM {p}": ref[(p, m)].map(pct)
                            for m in ("icl", "zero-shot") for p in PROTOCOLS})
        return "\n".join(lines + [
            "## SITE per task (fit and eval under the same protocol)", "",
            md_table(per_task.reset_index()), "",
            "## SITE: fit protocol × scoring protocol (means over the same tasks)", "",
            md_table(cross.map(pct).rename_axis("fit ↓ / scored →").reset_index()), "",
            "## zero-shot and 10-shot ICL per task", "", md_table(ref.reset_index()), ""])


if __name__ == "__main__":
    raise SystemExit(main(ProtocolCompare()))
