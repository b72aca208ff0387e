"""Issue 18's "no change in behaviour" check: a ``sitelens bench`` grid rerun after the refactor
against the committed baselines table.

    OMP_NUM_THREADS=1 sitelens bench --models smollm2-135m-instruct \\
        --tasks ../shared/datasets/fv/synonym,../shared/datasets/fv/capitalize_second_letter \\
        --limit 50 --threads 1 --out benchmarks/results/refactor_check/bench_post_refactor.csv
    python scripts/checks/refactor_check.py

Writes ``results/refactor_check/compare.md``: per (task, method) exact match and first-token
accuracy (rerun vs committed) and |ΔdNTP|.
"""

from __future__ import annotations

import pandas as pd

from sitelens.pipelines.experiment import RESULTS, md_table

HERE = RESULTS


def main() -> int:
    new = pd.read_csv(HERE / "refactor_check" / "bench_post_refactor.csv")
    old = pd.read_csv(HERE / "baselines_smollm2-135m-instruct.csv")
    m = new.merge(old, on=["task", "method"], suffixes=("_rerun", "_committed"))
    m["dntp_abs_diff"] = (m.dntp_rerun - m.dntp_committed).abs().map(lambda x: f"{x:.1e}")
    cols = ["task", "method", "exact_match_rerun", "exact_match_committed",
            "first_token_acc_rerun", "first_token_acc_committed", "dntp_abs_diff"]
    same = int(((m.exact_match_rerun == m.exact_match_committed)
                & (m.first_token_acc_rerun == m.first_token_acc_committed)).sum())
    text = "\n".join([
        "# Refactor check (issue 18)", "",
        f"{same} of {len(m)} (task, method) cells have identical exact match and first-token "
        "accuracy after the refactor; see the script's docstring for the commands.", "",
        md_table(m[cols]), ""])
    (HERE / "refactor_check" / "compare.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
