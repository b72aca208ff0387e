"""Wall seconds of a whole task: `sitelens run` (one process, one load) vs `sitelens fit` then
`sitelens eval` (two), each a fresh process under /usr/bin/time -v, with the 1-minute load average.

    python scripts/run_time.py [REPS=3]   # -> benchmarks/results/run_time.csv, .md
    python scripts/run_time.py --report   # rewrite run_time.md from run_time.csv, running nothing

Issue 33's baseline is cited (``benchmarks/cited.csv``, id ``issue33_fit_eval_site_s``), not
measured here; the public reference code is measured side by side with `sitelens run` by
``benchmarks/reference.py`` (``benchmarks/results/reference.md``).

In scripts/, not benchmarks/: that folder is at its 3,500-line cap.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from sitelens.io import atomic_write_csv, atomic_write_text

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from lib.cited import cited  # noqa: E402  (benchmarks/lib, beside the scripts that share it)

RES = Path(__file__).parents[1] / "benchmarks" / "results"
MODEL, TASK = "smollm2-135m-instruct", "country-capital"
BASE = ["--model", MODEL, "--task", f"../shared/datasets/fv/{TASK}", "--threads", "2"]


def timed(argv: list[str]) -> tuple[float, str, dict]:
    """(wall s, stdout, stages) of ``sitelens ARGV`` as a fresh process, by /usr/bin/time -v; the
    stages (seconds) as its stderr reports them: load, stage 1, stage 2, evaluation (all methods)."""
    r = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "sitelens.cli", *argv],
                       capture_output=True, text=True, check=True)
    h, m, s = (["0", "0"] + re.search(r"Elapsed.*: ([\d:.]+)", r.stderr)[1].split(":"))[-3:]
    num = r"([\d.]+)s"
    stages = {"load_s": re.search(r"^loaded .* in " + num, r.stderr, re.M),
              "stage1_s": re.search(r"stage1 " + num, r.stderr),
              "stage2_s": re.search(r"stage2 " + num, r.stderr)}
    stages = {k: float(v[1]) for k, v in stages.items() if v}
    evals = re.findall(r"^eval .*done in " + num, r.stderr, re.M)
    stages.update({"eval_s": round(sum(map(float, evals)), 1)} if evals else {})
    return 3600 * float(h) + 60 * float(m) + float(s), r.stdout, stages


def main(reps: int) -> None:
    rows = []
    for rep in range(reps):
        with tempfile.TemporaryDirectory() as d:
            site = ["--methods", "site"]
            for cmd, argv in (("run", ["run", *BASE, "--out", f"{d}/run", "--json"]),
                              ("run site", ["run", *BASE, *site, "--out", f"{d}/rs", "--json"]),
                              ("fit", ["fit", *BASE, "--out", f"{d}/fit"]),
                              ("eval", ["eval", *BASE, "--adapter", f"{d}/fit", "--json"]),
                              ("eval site", ["eval", *BASE, *site, "--adapter", f"{d}/fit",
                                             "--json"])):
                load = os.getloadavg()[0]
                wall, out, stages = timed(argv)
                em = json.loads(out)["site"]["exact_match"] if cmd != "fit" else None
                rows.append(dict(rep=rep, command=cmd, wall_s=round(wall, 2), load_avg_1min=load,
                                 site_exact_match=em, **stages))
                print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    atomic_write_csv(RES / "run_time.csv", df)
    report(df)


def report(df: pd.DataFrame) -> None:
    """Write run_time.md from the rows of run_time.csv."""
    reps = df.rep.nunique()
    base = cited("issue33_fit_eval_site_s")
    w = df.pivot(index="rep", columns="command", values="wall_s")
    w["fit + eval"] = w["fit"] + w["eval"]
    w["fit + eval site"] = w["fit"] + w["eval site"]
    em = {c: "/".join(f"{x:.3f}" for x in df[df.command == c].site_exact_match.unique())
          for c in ("run", "run site", "eval", "eval site")}
    md = [f"# A whole task in one process: `sitelens run` vs `sitelens fit` + `sitelens eval`\n\n"
          f"Made by `python scripts/run_time.py {reps}` ({MODEL}, {TASK}, whole test set, default "
          "protocol, --threads 2); wall of each fresh process by /usr/bin/time -v. The machine is "
          "shared (2 cores): the load average says how busy it was.\n",
          "| command | median wall s | min | max |", "|---|---|---|---|"]
    md += [f"| {c} | {w[c].median():.1f} | {w[c].min():.1f} | {w[c].max():.1f} |"
           for c in ("run", "fit", "eval", "fit + eval", "run site", "eval site",
                     "fit + eval site")]
    md.append("\n`run`, `eval`: methods zero-shot, icl, site (the default); `run site`, `eval site`: "
              "`--methods site`, the same work as issue 33's baseline (fit + SITE's evaluation: "
              f"{base.value:.1f} s over two processes, measured there on this kind of machine, not rerun "
              "here; cited).")
    for c in ("run", "run site"):
        st = df[df.command == c][["load_s", "stage1_s", "stage2_s", "eval_s"]].median()
        md.append(f"\nInside `sitelens {c}` (medians, s, as it reports them): " + ", ".join(
            f"{k[:-2]} {v:.1f}" for k, v in st.items()) + f"; the rest of its wall (start-up, "
            f"imports, writing): {w[c].median() - st.sum():.1f}.")
    md.append(f"\n`run site` median {w['run site'].median():.1f} s (target: <= 24 s). The public "
              "reference code, run side by side with `sitelens run` in one run on the same items: "
              "[reference.md](reference.md) (`python benchmarks/reference.py`).")
    md.append(f"\nrun / (fit + eval), median: {w['run'].median() / w['fit + eval'].median():.2f}; "
              f"load average (1 min) {df.load_avg_1min.min():.2f}–{df.load_avg_1min.max():.2f}; "
              "site exact match: " + ", ".join(f"{c} {v}" for c, v in em.items()) + ".")
    atomic_write_text(RES / "run_time.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    if sys.argv[1:] == ["--report"]:
        report(pd.read_csv(RES / "run_time.csv"))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
