"""Summaries of the baselines benchmark: ``baselines_{model}.md`` and ``baselines_{model}.dntp.html``
(+ ``.png`` with kaleido) from the ``sitelens bench`` CSVs ``results/baselines_{model}.csv``.

    python benchmarks/baselines.py [--no-png]

The cells come from the resumable CLI; each md names its command (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sitelens.pipelines.bench import (
    dntp_accuracy_correlation,
    dntp_accuracy_figure,
    read_results,
    summary_markdown,
)
from sitelens.pipelines.experiment import Experiment, main

EMBEDDING_BASELINES = ["fv", "tv", "ltv", "mtv", "i2cl"]
PEFT = ["lora", "ia3"]
ORDER = ["zero-shot", "icl", "site", *EMBEDDING_BASELINES, *PEFT]
# What each method's fit runs with its defaults (``sitelens.baselines``), to read the fit seconds by.
FIT_WORK = {
    "site": "50 ten-shot prompts (stage 1), then 50 Adam steps of 8 last-token passes over frozen "
            "prefix caches, forward and backward, validated every 10 steps on 64 items",
    "fv": "50 ten-shot prompts (mean head outputs), 16 corrupted ten-shot prompts with every head "
          "patched in turn (n_layers × n_heads last-token rows over frozen prefixes), then one "
          "64-item validation pass per candidate layer",
    "tv": "50 ten-shot prompts, then one 64-item validation pass per candidate layer",
    "ltv": "256 ten-shot prompts (h_icl) and their 256 zero-shot queries (h_zs), then one "
           "d_model × d_model ridge solve",
    "mtv": "50 ten-shot prompts, then 40 REINFORCE steps of 4 sampled head masks × 8 items",
    "i2cl": "10 single demonstrations, then 50 Adam steps of 8 full zero-shot passes (the vectors act "
            "at every position)",
    "lora": "50 Adam steps (lr 1e-3) of 8 full zero-shot passes (rank-8 updates of W_Q and W_V in "
            "every layer), validated every 10 steps on 64 items",
    "ia3": "50 Adam steps of 8 full zero-shot passes (key, value and MLP rescaling in every layer), "
           "validated every 10 steps on 64 items",
}
COMMANDS = {  # the commands that made the committed CSVs
    "smollm2-135m-instruct": (
        "sitelens bench --models smollm2-135m-instruct --tasks ../shared/datasets/fv/{antonym,country-capital"
        ",present-past,singular-plural,capitalize_first_letter,choose_first_of_3,person-occupation,english-fr"
        "ench,capitalize_last_letter,lowercase_last_letter,capitalize_second_letter,verb_v_adjective_3,countr"
        "y-currency,choose_middle_of_3,object_v_concept_3,alphabetically_last_3,color_v_animal_3,prev_item,ne"
        "xt_item,concept_v_object_3,next_capital_letter,alphabetically_first_3,choose_last_of_3,animal_v_obje"
        "ct_3,fruit_v_animal_3,word_length,synonym,person-sport,english-spanish,park-country,person-instrumen"
        "t,english-german,product-company,capitalize,landmark-country,adjective_v_verb_3,color_v_animal_5,cho"
        "ose_last_of_5,animal_v_object_5,choose_middle_of_5,verb_v_adjective_5,alphabetically_last_5,national"
        "_parks,lowercase_first_letter,adjective_v_verb_5,sentiment,object_v_concept_5,concept_v_object_5,alp"
        "habetically_first_5,fruit_v_animal_5,choose_first_of_5,conll2003_location,conll2003_person,conll2003"
        "_organization,commonsense_qa,ag_news,squad_val} --limit 50 --threads 1 --n-ctx 4096 --out benchmarks"
        "/results/baselines_smollm2-135m-instruct.csv"
    ),
    "gemma-3-270m": (
        "sitelens bench --models gemma-3-270m --tasks ../shared/datasets/fv/{antonym,country-capital,present-"
        "past,english-french,singular-plural,capitalize_first_letter,person-occupation,choose_first_of_3,engl"
        "ish-german,capitalize,person-sport,english-spanish,lowercase_first_letter,person-instrument,synonym,"
        "next_item,prev_item,product-company,lowercase_last_letter,capitalize_second_letter,capitalize_last_l"
        "etter,landmark-country,next_capital_letter,word_length,national_parks,sentiment,country-currency,par"
        "k-country,commonsense_qa,ag_news} --limit 50 --threads 1 --out benchmarks/results/baselines_gemma-3-"
        "270m.csv"
    ),
}
NOTE = ("Run on the shared 2-core CPU with one torch thread while other benchmarks ran, so fit "
        "seconds and seconds per item are inflated by contention. `--n-ctx 4096` is needed only by "
        "squad_val on SmolLM2 (10-shot prompts up to 2,621 tokens; the other cells ran at the "
        "default 2048, which gives the same results for prompts that fit).")
TIME_NOTE = (
    "Median fit seconds per task, slowest first, with the work each fit does by default (a ten-shot prompt "
    "is about ten times as long as a zero-shot one). FV and LTV are the slow ones because of how many "
    "prompts their definitions need (FV: a patch of every head on corrupted prompts; LTV: 256 ten-shot "
    "prompts); fewer prompts (`FV(n_effect_prompts=…)`, `LTV(n_queries=…)`) trade accuracy for time. On very "
    "long prompts FV is slower than it needs to be: every (prompt, head) row of the causal-effect pass gets "
    "its own copy of its prompt's prefix K/V (`select_cache`, and TransformerLens's KV append concatenates "
    "past and new keys), so on SmolLM2's squad_val (2,400-token ten-shot prefixes, 113 MB of K/V per row, 16 "
    "× 271 rows) a fit copies about 490 GB; an attention that reads one shared prefix per prompt would "
    "remove that cost (not implemented).")


def targets(df: pd.DataFrame) -> list[str]:
    """The issue's target lines: SITE vs each embedding baseline, SITE beside LoRA and (IA)3."""
    em = df.groupby("method")["exact_match"].mean()
    if "site" not in em:
        return []
    site, lines = em["site"], []
    beaten = [m for m in EMBEDDING_BASELINES if m in em and em[m] > site]
    rest = [m for m in EMBEDDING_BASELINES if m in em]
    if beaten:
        lines.append(f"- SITE ≥ every embedding baseline: **missed**, {', '.join(beaten)} higher "
                     f"(SITE {100 * site:.1f}; " + ", ".join(f"{m} {100 * em[m]:.1f}" for m in beaten) + ").")
    elif rest:
        best = max(rest, key=lambda m: em[m])
        lines.append(f"- SITE ≥ every embedding baseline: **met** (SITE {100 * site:.1f} vs best "
                     f"embedding baseline {best} {100 * em[best]:.1f}).")
    peft = [f"{m} {100 * em[m]:.1f}" for m in PEFT if m in em]
    if peft:
        lines.append(f"- SITE vs PEFT, side by side: SITE {100 * site:.1f}, " + ", ".join(peft)
                     + " (exact match %).")
    return lines


def per_task_table(df: pd.DataFrame) -> list[str]:
    piv = df.pivot_table(index="task", columns="method", values="exact_match")
    cols = [m for m in ORDER if m in piv.columns]
    return ["| task | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)] + [
        f"| {task} | " + " | ".join("" if pd.isna(r[m]) else f"{100 * r[m]:.0f}" for m in cols) + " |"
        for task, r in piv.iterrows()]


def time_notes(df: pd.DataFrame) -> list[str]:
    """Where the fit seconds go, slowest method first (median fit seconds over the tasks)."""
    fit = df.groupby("method")["fit_seconds"].median().sort_values(ascending=False)
    per_item = df.groupby("method")["seconds_per_item"].median()
    lines = ["### Where the time goes", "", TIME_NOTE, ""]
    lines += [f"- {m}: {sec:.0f} s — {FIT_WORK[m]}." for m, sec in fit.items() if m in FIT_WORK]
    if "icl" in per_item and "zero-shot" in per_item and per_item["zero-shot"] > 0:
        lines.append(f"- icl: no fit; each item costs {per_item['icl'] / per_item['zero-shot']:.1f}× "
                     "a zero-shot item (the ten-shot prompt is prefilled for every query).")
    return lines + [""]


def dntp_notes(full: pd.DataFrame) -> list[str]:
    """dNTP vs exact match for all methods and for the ICL-derived ones (PEFT left out: LoRA and
    (IA)3 train on the answer token, so they can be accurate far from the ICL distribution)."""
    lines = ["### dNTP and exact match", "",
             "| methods | cells | Pearson r | Spearman ρ (pooled) | Spearman ρ within a task (mean) |",
             "|---|---:|---:|---:|---:|"]
    for label, exclude in (("all but ICL", ("icl",)),
                           ("ICL-derived and zero-shot (no LoRA, (IA)3)", ("icl", *PEFT))):
        c = next(iter(dntp_accuracy_correlation(full, exclude=exclude).values()), None)
        if c:
            lines.append(f"| {label} | {c['n_cells']} | {c['pearson']:.2f} | {c['spearman']:.2f} "
                         f"| {c['within_task_spearman']:.2f} ({c['n_tasks_within']} tasks) |")
    return lines + [""]


def summarize(path: Path, command: str, png: bool = True) -> str:
    df = read_results(path)
    dup = df.duplicated(["model", "task", "method", "seed"], keep=False)
    if dup.any():  # its means would count twice
        cells = df.loc[dup, ["task", "method"]].drop_duplicates().values.tolist()
        raise SystemExit(f"{path.name} holds the cells {cells[:5]} more than once (rows of "
                         "different settings); keep one row per cell, then rerun.")
    model = df["model"].iloc[0]
    ok = df[pd.to_numeric(df["exact_match"], errors="coerce").notna()]
    tasks = sorted(t for t, g in ok.groupby("task") if set(g["method"]) >= set(df["method"]))
    full = df[df["task"].isin(tasks)]
    order = [m for m in ORDER if m in set(full.method)] + sorted(set(full.method) - set(ORDER))
    full = full.assign(method=pd.Categorical(full["method"], order, ordered=True))
    full = full.sort_values(["method", "task"]).assign(method=lambda d: d.method.astype(str))
    text = "\n".join([
        f"# Baselines on {model}", "",
        f"Made by `{command}` (resumable; the same command continues it), then "
        "`python benchmarks/baselines.py`. Test split capped at 50 items. " + NOTE + " Means are over "
        f"the tasks where every method finished: {', '.join(tasks)} ({len(tasks)} of "
        f"{df['task'].nunique()} started; all rows are in the CSV). Exact match and first-token accuracy "
        "are fractions; dNTP = KL(P_icl ‖ P_method) of the next-token distribution at the answer "
        "position over the full vocabulary, mean over test queries (10-shot ICL is P_icl, so its "
        "dNTP is 0).", "", *targets(full), "", summary_markdown(full).strip(), "",
        "### Exact match per task (%)", "", *per_task_table(full), "", *dntp_notes(full), *time_notes(full),
    ])
    from sitelens.io import atomic_write_text
    from sitelens.viz.export import write_figure_html

    stem = path.with_suffix("")
    atomic_write_text(f"{stem}.md", text)
    fig = dntp_accuracy_figure(full)
    write_figure_html(fig, f"{stem}.dntp.html")  # + plotly.min.js beside it (offline)
    if png:
        try:
            fig.write_image(f"{stem}.dntp.png", width=900, height=500)
        except Exception as e:  # kaleido/Chromium missing: the html is still written
            print(f"no png for {model}: {e}")
    return text


class Baselines(Experiment):
    name = "baselines"
    key = None

    def add_arguments(self, p) -> None:
        p.add_argument("--no-png", action="store_true")

    def cells(self, args):
        return ()  # the cells are `sitelens bench` runs

    def write_report(self) -> str:
        texts = []
        for path in sorted(self.out.glob("baselines_*.csv")):
            model = path.stem.removeprefix("baselines_")
            cmd = COMMANDS.get(model, f"sitelens bench --models {model} ... --out {path}")
            texts.append(summarize(path, cmd, png=not self.args.no_png))
        return "\n".join(texts)


if __name__ == "__main__":
    raise SystemExit(main(Baselines()))
