"""Shot counts that fit the context: the largest k ≤ 10 whose k-shot prompts plus 32 generated
tokens fit n_ctx = 2048 (:func:`sitelens.tasks.shots.shots_that_fit`), per task of the cls, bbh,
mmlu_pro and anli collections and bundled tokenizer (tokenization only).

    python benchmarks/shot_counts.py          # -> results/shot_counts.csv (a row per model × task), .md
"""

import pandas as pd

from sitelens.models import fingerprint
from sitelens.pipelines.executors import cached_model
from sitelens.pipelines.experiment import Experiment, Job, main, md_table
from sitelens.provenance import task_hash
from sitelens.tasks import load_collection, shots
from sitelens.tasks.shots import MAX_SHOTS, RESERVE

COLLECTIONS = ("cls", "bbh", "mmlu_pro", "anli")
N_CTX = 2048
COLUMNS = ["model", "fingerprint", "collection", "task", "task_hash", "n_ctx", "reserve", "k_guaranteed",
           "k_seed0", "tokens_0shot_max", "tokens_10shot_bound", "tokens_10shot_seed0",
           "tokens_at_k_guaranteed"]


class ShotCounts(Experiment):
    name = "shot_counts"
    title = "Shot counts that fit the context"
    columns = COLUMNS
    key = None
    models = ("smollm2-135m-instruct", "gemma-3-270m")

    def done_keys(self) -> set[str]:
        return set(self.read().model)

    def cells(self, args):
        return [Job(m, m) for m in args.models]

    def run(self, job: Job) -> list[dict]:
        model, rows = cached_model(job.key), []
        for c in COLLECTIONS:
            for t in load_collection(self.args.data_root / c):
                g = shots.guaranteed_lengths(model, t, shots.MAX_SHOTS)
                s = shots.seeded_lengths(model, t, shots.MAX_SHOTS, seed=0)
                if any(a < b for a, b in zip(g, s)):
                    raise AssertionError(f"{t.name}: a seeded prompt is longer than the bound: {g} vs {s}")
                fit_g = shots.shots_that_fit(model, t, n_ctx=N_CTX, guaranteed=True)
                rows.append({
                    "model": job.key, "fingerprint": fingerprint(model), "collection": c, "task": t.name,
                    "task_hash": task_hash(t), "n_ctx": N_CTX, "reserve": shots.RESERVE,
                    "k_guaranteed": fit_g.k,
                    "k_seed0": shots.shots_that_fit(model, t, n_ctx=N_CTX, guaranteed=False, seed=0).k,
                    "tokens_0shot_max": g[0],
                    "tokens_10shot_bound": g[-1] if len(g) > shots.MAX_SHOTS else "",
                    "tokens_10shot_seed0": s[-1] if len(s) > shots.MAX_SHOTS else "",
                    "tokens_at_k_guaranteed": fit_g.tokens_at_k,
                })
        return rows

    def report(self, df: pd.DataFrame) -> str:
        per = (df.groupby(["collection", "model"], sort=False)
               .agg(tasks=("task", "size"), k=("k_guaranteed", "min"), k_seed0=("k_seed0", "min"),
                    longest_zero_shot=("tokens_0shot_max", "max")).reset_index())
        limiting = df.sort_values("k_guaranteed").groupby(["collection", "model"], sort=False).first()["task"]
        per["smallest k at"] = [limiting[(c, m)] for c, m in zip(per["collection"], per["model"])]
        short = df[df["k_guaranteed"] < MAX_SHOTS][["collection", "model", "task", "k_guaranteed", "k_seed0",
                                                    "tokens_0shot_max", "tokens_10shot_bound"]]
        return "\n".join([
            f"The largest k ≤ {MAX_SHOTS} whose k-shot prompts plus {RESERVE} generated tokens fit n_ctx = "
            f"{N_CTX}, for every seed (**k**) and for the seed-0 test prompts (**k (seed 0)**); the smallest "
            "over each collection's tasks (docs/tasks.md).", "",
            md_table(per.rename(columns={"k_seed0": "k (seed 0)",
                                         "longest_zero_shot": "longest 0-shot prompt (tokens)"})),
            "", "## Per task (k < 10 only)", "",
            md_table(short) if len(short) else "Every task fits 10 shots.", ""])


if __name__ == "__main__":
    raise SystemExit(main(ShotCounts()))
