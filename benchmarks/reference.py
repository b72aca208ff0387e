"""The public SITE reference code and `sitelens run`, side by side in one run, on the same task and
test items: the reference (github.com/SNU-DRL/Soft_Injection, its ``eval.py`` with the settings of
its ``eval_scripts/construct_scripts.ipynb``: 50 prompts of 10 shots, 400 α epochs of batch 1, lr
0.2, 20 new tokens, exact match), ``sitelens run`` with the default protocol and ``sitelens run
--protocol official``, each with float32 and with bfloat16 weights (``--dtype bfloat16``), each a
fresh process timed whole, with the 1-minute load average before it.

    python benchmarks/reference.py --reference DIR [--baukit DIR] [--task country-capital]
    python benchmarks/reference.py --reference DIR --tiny    # a smoke run, results in the scratch
    python benchmarks/reference.py --report                  # rewrite reference.md from the CSVs

DIR is a checkout of the reference (``git clone https://github.com/SNU-DRL/Soft_Injection``);
baukit (``git clone https://github.com/davidbau/baukit``) defaults to ``DIR/../baukit``. Neither is
edited: the reference is copied into ``--scratch`` and patched there for a CPU-only machine
(:data:`PATCHES`), baukit's package is copied beside it with an ``__init__`` that imports only
``nethook`` (the rest imports torchvision). The reference runs in its own venv in the scratch
folder, with pip installs of the versions this interpreter has (:data:`PINNED`), on the bundled
SmolLM2 saved as a local Hugging Face folder from its GGUF (dequantized as sitelens loads it). The
reference sets no seed: the launcher seeds torch, numpy and random with ``--seed``, and records
each test item's generated text, so both sides are scored by both criteria on the same items.

Writes ``benchmarks/results/reference.csv`` (one row per side), ``reference_items.csv`` (one row
per side and test item) and ``reference.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pandas as pd
from lib.cpu import cpu_bf16

from sitelens.eval.scoring import exact_match, official_exact_match
from sitelens.io import atomic_write_csv, atomic_write_text
from sitelens.stats import mcnemar_exact, paired_difference

RES = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
HF_NAME = "SmolLM2-135M-Instruct"  # the folder's name, which the reference reads as the model's
# the reference's venv: these at this interpreter's versions; what its imports need besides
PINNED = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy",
          "pandas", "tqdm")
UNPINNED = ("scikit-learn", "pillow")  # preprocess.py imports sklearn, models.py PIL
# sitelens's sides: (name, protocol, extra flags); bfloat16 weights (`--dtype bfloat16`) run this
# CPU's matmuls several times faster (benchmarks/dtype_compare.py has their accuracy on the FV tasks)
OURS = (("sitelens default", "default", ()), ("sitelens official", "official", ()),
        ("sitelens default bfloat16", "default", ("--dtype", "bfloat16")),
        ("sitelens official bfloat16", "official", ("--dtype", "bfloat16")))
SIDES = ("reference", *(name for name, _, _ in OURS))

# ------------------------------------------------------------------------------------------------
# the CPU patches: pure functions of a source text; each fails when its anchor is missing, so a
# changed reference stops the run instead of running unpatched


def patch_cuda(src: str) -> str:
    """Every quoted ``'cuda'`` / ``"cuda"`` device string becomes ``'cpu'`` (``torch.cuda.*`` calls,
    no-ops on a CPU build, stay)."""
    out, n = re.subn(r"""(['"])cuda\1""", r"\1cpu\1", src)
    if n == 0:
        raise ValueError("no 'cuda' device string to patch")
    return out


BNB = "import bitsandbytes as bnb\n"


def patch_bitsandbytes(src: str) -> str:
    """``import bitsandbytes`` made optional: only the 4-bit 70B/32B/Mixtral paths use it."""
    if BNB not in src:
        raise ValueError("no `import bitsandbytes as bnb` to make optional")
    return src.replace(BNB, "try:\n    import bitsandbytes as bnb\nexcept ImportError:  # CPU: "
                            "no 4-bit paths\n    bnb = None\n", 1)


LOAD_MODEL = "def load_model(model_name, cur_dataset, lr):\n"
LOCAL_BRANCH = """    import os as _os
    if _os.path.isdir(model_name):  # a local Llama-architecture folder, on the CPU, float32
        model = LlamaForCausalLM.from_pretrained(model_name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(model_name)
        return LlamaHelper(model, tokenizer, cur_dataset, lr)
"""


def patch_load_model(src: str) -> str:
    """A first branch in ``utils.load_model`` that loads a local directory as ``LlamaForCausalLM``
    on the CPU (the others name hub models and ``device_map="auto"``)."""
    head = src.find(LOAD_MODEL)
    if head < 0:
        raise ValueError("no `def load_model(model_name, cur_dataset, lr):` to patch")
    doc = src.find('"""', src.find('"""', head + len(LOAD_MODEL)) + 3)  # the docstring's end
    cut = src.index("\n", doc) + 1 if doc >= 0 else head + len(LOAD_MODEL)
    return src[:cut] + LOCAL_BRANCH + src[cut:]


def patch_baukit_init(src: str) -> str:
    """baukit's ``__init__`` with only its ``nethook`` imports (the widgets, images and datasets
    import torchvision, which the reference never uses)."""
    keep = [line for line in src.splitlines() if line.startswith("from .nethook import")]
    if not keep:
        raise ValueError("no `from .nethook import` in baukit's __init__")
    return "\n".join(keep) + "\n"


PATCHES = {"models.py": (patch_cuda,), "preprocess.py": (patch_cuda,),
           "utils.py": (patch_cuda, patch_bitsandbytes, patch_load_model)}

# the reference's eval.py, seeded, with each test item's generated text recorded: eval.py's
# `from utils import *` picks up the wrapped function from the already imported utils module
LAUNCHER = """import json, os, random, runpy, sys
import numpy as np, torch
seed = int(os.environ["REF_SEED"])
random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
sys.path.insert(0, os.getcwd())
import utils
texts = []
_run = utils.soft_intervention_natural_text
def recorded(*a, **k):
    clean, interv = _run(*a, **k)
    texts.append(interv)
    return clean, interv
utils.soft_intervention_natural_text = recorded
sys.argv = ["eval.py", *sys.argv[1:]]
try:
    runpy.run_path("eval.py", run_name="__main__")
finally:
    with open(os.environ["REF_ITEMS"], "w") as f:
        json.dump(texts, f)
"""


def git_commit(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def prepare_reference(ref: Path, baukit: Path, dest: Path, task: str, limit: int | None) -> None:
    """A patched copy of the reference in ``dest`` (``dest/lib/baukit`` beside it); ``limit`` keeps
    the first items of the task's test split (the reference has no option for it)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(ref, dest, ignore=shutil.ignore_patterns(".git"))
    for name, patches in PATCHES.items():
        src = (dest / name).read_text()
        for p in patches:
            src = p(src)
        (dest / name).write_text(src)
    shutil.copytree(baukit / "baukit", dest / "lib" / "baukit")
    init = dest / "lib" / "baukit" / "__init__.py"
    init.write_text(patch_baukit_init(init.read_text()))
    (dest / "launch.py").write_text(LAUNCHER)
    if limit is not None:
        test = dest / "dataset" / task / "test.json"
        test.write_text(json.dumps(json.loads(test.read_text())[:limit]))


def make_venv(venv: Path) -> Path:
    """The reference's venv (kept across runs): this interpreter's versions of :data:`PINNED`."""
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pins = [f"{p}=={version(p).split('+')[0]}" for p in PINNED]
        subprocess.run([str(py), "-m", "pip", "install", "-q", *pins, *UNPINNED], check=True)
    return py


def make_hf_model(dest: Path) -> Path:
    """The bundled SmolLM2 as a local Hugging Face folder (kept across runs): its GGUF dequantized
    to float32 as sitelens loads it, copied into a plain ``LlamaForCausalLM`` (a GGUF-loaded model
    refuses ``save_pretrained``), with its tokenizer."""
    if not (dest / "config.json").exists():
        from transformers import LlamaForCausalLM

        from sitelens.models.gguf import load_hf_reference

        hf, tok = load_hf_reference(MODEL)
        hf.config.architectures = ["LlamaForCausalLM"]
        plain = LlamaForCausalLM(hf.config)
        plain.load_state_dict(hf.state_dict())
        plain.save_pretrained(dest)
        tok.save_pretrained(dest)
    return dest


def versions(py: Path, names: tuple[str, ...]) -> str:
    code = ("import json, importlib.metadata as m; import sys; "
            "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    got = json.loads(subprocess.run([str(py), "-c", code, *names], capture_output=True, text=True,
                                    check=True).stdout)
    return " ".join(f"{k}=={v}" for k, v in got.items())


def timed(cmd: list[str], cwd: Path, env: dict, log: Path) -> tuple[float, float, str, str]:
    """(wall s, 1-minute load average just before, stdout, stderr) of a fresh process; its output
    also goes to ``log``."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({r.returncode}); see {log}:\n{r.stderr[-2000:]}")
    return wall, load, r.stdout, r.stderr


def sitelens_stages(stderr: str) -> dict:
    """The stage seconds `sitelens run` reports on stderr (as ``scripts/run_time.py`` reads them)."""
    num = r"([\d.]+)s"
    got = {"load_s": re.search(r"^loaded .* in " + num, stderr, re.M),
           "stage1_s": re.search(r"stage1 " + num, stderr),
           "stage2_s": re.search(r"stage2 " + num, stderr)}
    out = {k: float(v[1]) for k, v in got.items() if v}
    evals = re.findall(r"^eval .*done in " + num, stderr, re.M)
    return out | ({"eval_s": sum(map(float, evals))} if evals else {})


def score(items: pd.DataFrame, task: str) -> pd.DataFrame:
    """Both criteria on each item's text: ``correct`` (sitelens's exact match: the first line starts
    with the target, case-insensitive) and ``correct_official`` (the reference's: ``St.`` → Saint,
    cut at ``(``, compared on the target's length)."""
    items = items.copy()
    items["correct"] = [exact_match(p, t) for p, t in zip(items.prediction, items.target)]
    items["correct_official"] = [official_exact_match(p, t, task)
                                 for p, t in zip(items.prediction, items.target)]
    return items


def reference_side(args, py, hf, site, out, scratch, ref_sched, common) -> tuple[dict, list]:
    """The reference's row (wall, load, its stages, its own score) and each test item's text."""
    task, ref, baukit = args.task, Path(args.reference).resolve(), Path(args.baukit).resolve()
    cmd = [str(py), "launch.py", "--exact_match", "--model_name", str(hf), "--data_name", "icl",
           *ref_sched, "--num_shot", "10", "--max_token", "20", "--eval_num_shot", "0",
           "--activation_path", f"{out}/mean_activations", "--alphas_path", f"{out}/alphas.pt",
           "--result_folder", f"{out}/result", "--cur_mode", "interv", "--experiment_name", "run",
           "--batch_size", "1", "--test_batch_size", "1", "--data_path", "./dataset",
           "--dataset_names", task, "--lr", "0.2"]
    env = os.environ | {"PYTHONPATH": str(site / "lib"), "OMP_NUM_THREADS": str(args.threads),
                        "REF_SEED": str(args.seed), "REF_ITEMS": str(out / "texts.json")}
    out.mkdir(parents=True)
    wall, load, _, _ = timed(cmd, site, env, scratch / "reference.log")
    res = json.loads((out / "result" / "run.json").read_text())
    texts = json.loads((out / "texts.json").read_text())
    t = res["time_cost"]
    return dict(side="reference", wall_s=wall, load_avg_1min=load,
                stage1_s=t["time_for_mean_activations"], stage2_s=t["time_for_alphas"],
                eval_s=t["time_for_eval"],
                reported_exact_match=res["accuracy"][task]["Intervention Accuracy"],
                commit=git_commit(ref), baukit_commit=git_commit(baukit),
                versions=versions(py, PINNED), command=" ".join(cmd), **common), texts


def run(args) -> None:
    scratch = Path(args.scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    ref, baukit = Path(args.reference).resolve(), Path(args.baukit).resolve()
    task, limit = args.task, (5 if args.tiny else None)
    site = scratch / "site"
    saved = scratch / "reference_side.json"  # the reference's row and texts, for --reuse-reference
    if not (args.reuse_reference and saved.exists()):
        saved.unlink(missing_ok=True)
        prepare_reference(ref, baukit, site, task, limit)
    py = make_venv(Path(args.venv).resolve() if args.venv else scratch / "venv")
    hf = make_hf_model(scratch / HF_NAME)
    test = json.loads((site / "dataset" / task / "test.json").read_text())
    threads = str(args.threads)
    # --tiny: few prompts, few α steps (under 50, the reference keeps its final α), few items
    ref_sched = (["--num_example", "5", "--epoch", "20"] if args.tiny else
                 ["--num_example", "50", "--epoch", "400"])
    ours_sched = ["--n-prompts", "5", "--n-examples", "16", "--limit", str(limit)] if args.tiny else []
    common = dict(model=MODEL, task=task, n_items=len(test), seed=args.seed, threads=args.threads,
                  host=platform.node(), cpus=os.cpu_count(), tiny=args.tiny, cpu_bf16=cpu_bf16())
    rows, items = [], []

    out = site / "site_out"
    if saved.exists():
        row, texts = json.loads(saved.read_text())
    else:
        row, texts = reference_side(args, py, hf, site, out, scratch, ref_sched, common)
        saved.write_text(json.dumps([row, texts]))
    rows.append(row)
    items.append(pd.DataFrame(dict(side="reference", input=[x["input"] for x in test],
                                   target=[x["output"] for x in test], prediction=texts)))

    import sitelens

    ours_versions = versions(Path(sys.executable), ("torch", "transformers", "transformer_lens",
                                                    "numpy")) + f" sitelens=={sitelens.__version__}"
    for side, proto, extra in OURS:
        d = scratch / side.replace(" ", "_")
        shutil.rmtree(d, ignore_errors=True)
        cmd = [sys.executable, "-m", "sitelens.cli", "run", "--model", MODEL, "--task",
               str(site / "dataset" / task), "--protocol", proto, "--methods", "site", "--seed",
               str(args.seed), "--threads", threads, *extra, *ours_sched, "--out", str(d), "--json"]
        wall, load, stdout, stderr = timed(cmd, REPO, os.environ | {"PYTHONPATH": str(REPO)},
                                           scratch / f"{d.name}.log")
        got = pd.read_csv(d / "items.csv", keep_default_na=False, na_values=[""])
        got = got[got.method == "site"]
        rows.append(dict(side=side, wall_s=wall, load_avg_1min=load, **sitelens_stages(stderr),
                         reported_exact_match=json.loads(stdout)["site"]["exact_match"],
                         commit=git_commit(REPO),
                         versions=ours_versions, command=" ".join(cmd), **common))
        items.append(pd.DataFrame(dict(side=side, input=got.input.astype(str),
                                       target=got.target.astype(str), prediction=got.prediction)))

    df, it = pd.DataFrame(rows), score(pd.concat(items, ignore_index=True).fillna(""), task)
    res_dir = Path(args.results) if args.results else (scratch / "results" if args.tiny else RES)
    res_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(res_dir / "reference_items.csv", it)
    atomic_write_csv(res_dir / "reference.csv", summarize(df, it))
    report(res_dir)


def summarize(df: pd.DataFrame, items: pd.DataFrame) -> pd.DataFrame:
    """Each side's row with its exact match by both criteria over the same items, and sitelens's
    paired difference to the reference (items paired by input and target) with McNemar's test."""
    ref = items[items.side == "reference"].set_index(["input", "target"])
    out = []
    for row in df.to_dict("records"):
        mine = items[items.side == row["side"]].set_index(["input", "target"])
        if set(mine.index) != set(ref.index):
            raise ValueError(f"{row['side']} scored other items than the reference")
        mine = mine.loc[ref.index]
        row |= dict(exact_match=mine.correct.mean(), exact_match_official=mine.correct_official.mean())
        for crit in ("correct", "correct_official"):
            sfx = "" if crit == "correct" else "_official"
            pd_ = paired_difference(mine[crit].astype(float), ref[crit].astype(float), over="items")
            mc = mcnemar_exact(mine[crit], ref[crit])
            row |= {f"diff{sfx}": pd_.diff, f"diff_lo{sfx}": pd_.ci_low, f"diff_hi{sfx}": pd_.ci_high,
                    f"only_side{sfx}": mc.only_a, f"only_reference{sfx}": mc.only_b,
                    f"mcnemar_p{sfx}": mc.p_value}
        out.append(row)
    return pd.DataFrame(out)


def bf16_note(r) -> str:
    """The CPU's bfloat16 kind for the report; a table from before the column has none."""
    kind = r.get("cpu_bf16")
    return "" if pd.isna(kind) else f" (bfloat16 matmuls: {kind})"


def report(res_dir: Path = RES) -> str:
    """``reference.md`` from ``reference.csv``: every figure read from the CSV."""
    df = pd.read_csv(res_dir / "reference.csv").set_index("side")
    r = df.loc["reference"]
    md = [f"# The public SITE reference code against `sitelens run`, one run, same items\n\n"
          f"Made by `python benchmarks/reference.py --reference DIR` ({r.model}, {r.task}, its "
          f"{int(r.n_items)} test items, seed {int(r.seed)}, torch threads: {int(r.threads)} each, host "
          f"{r.host} with {int(r.cpus)} CPUs{bf16_note(r)}, shared: the 1-minute load average before "
          f"each side says how busy it was){' — a --tiny smoke run' if bool(r.tiny) else ''}. Each side is "
          "a fresh process timed whole (interpreter start to exit); the stages are as each side "
          "reports them (the reference's `time_cost`: stage 1 its mean activations, stage 2 its α "
          "optimization with validation, eval its test generation; it reports no load time).\n",
          "| side | wall s | × reference | load avg | load s | stage 1 s | stage 2 s | eval s | "
          "exact match | its reported | reference's criterion |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f=".1f": "–" if pd.isna(v) else format(v, f)  # noqa: E731
    for side, x in df.iterrows():
        md.append(f"| {side} | {x.wall_s:.1f} | {r.wall_s / x.wall_s:.1f} | {x.load_avg_1min:.2f} "
                  f"| {fmt(x.get('load_s'))} | {fmt(x.stage1_s)} | {fmt(x.stage2_s)} | "
                  f"{fmt(x.eval_s)} | {x.exact_match:.3f} | {x.reported_exact_match:.3f} | "
                  f"{x.exact_match_official:.3f} |")
    md.append("\nExact match: sitelens's criterion (the first generated line starts with the target, "
              "case-insensitive) on each side's generated text; *its reported*: the figure each side "
              "prints itself (the reference's own criterion: `St.` → Saint, both cut at `(`, the "
              "line compared on the target's length, i.e. a prefix match); *reference's criterion*: "
              "that criterion applied here to each side's text.\n")
    md.append("| side − reference | exact match: difference [95% CI] | only side / only reference "
              "| McNemar p | by the reference's criterion |")
    md.append("|---|---|---|---|---|")
    for side, x in df.drop(index="reference").iterrows():
        md.append(f"| {side} | {x['diff']:+.3f} [{x.diff_lo:+.3f}, {x.diff_hi:+.3f}] | "
                  f"{int(x.only_side)} / {int(x.only_reference)} | {x.mcnemar_p:.3f} | "
                  f"{x.diff_official:+.3f} [{x.diff_lo_official:+.3f}, {x.diff_hi_official:+.3f}], "
                  f"p {x.mcnemar_p_official:.3f} |")
    md.append("\nPaired over the test items (`sitelens.stats.paired_difference`, bootstrap over items; "
              "`mcnemar_exact`). The per-item texts are in `reference_items.csv`.\n")
    md.append(f"Reference: SNU-DRL/Soft_Injection at {r.commit}, baukit (davidbau/baukit) at "
              f"{r.baukit_commit}, in its own venv: {r.versions}. sitelens at "
              f"{df.loc['sitelens default'].commit}: {df.loc['sitelens default'].versions}.\n")
    md.append("Commands (the scratch paths are this run's):\n")
    md += [f"- {side}: `{x.command}`" for side, x in df.iterrows()]
    text = "\n".join(md) + "\n"
    atomic_write_text(res_dir / "reference.md", text)
    print(text)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", help="a checkout of github.com/SNU-DRL/Soft_Injection")
    p.add_argument("--baukit", help="a checkout of github.com/davidbau/baukit (default: "
                                    "REFERENCE/../baukit)")
    p.add_argument("--task", default="country-capital", help="a task folder of the reference's "
                                                             "dataset/ (default: country-capital)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch threads of each side, the same for both "
                   "(default: sitelens's rule once before the runs, the usable cores minus the busy "
                   "ones by the load average: on a shared machine, threads that outnumber the idle "
                   "cores wait on each other at every operation)")
    p.add_argument("--scratch", default="/tmp/sitelens-reference",
                   help="the patched copy, the venv and the model folder (default: %(default)s)")
    p.add_argument("--venv", help="the reference's venv, made if missing (default: SCRATCH/venv)")
    p.add_argument("--results", help="where the CSVs and the .md go (default: benchmarks/results; "
                                     "with --tiny: SCRATCH/results)")
    p.add_argument("--tiny", action="store_true", help="a smoke run: 5 test items, 5 prompts, "
                                                       "20 reference α steps, 16 sitelens examples")
    p.add_argument("--reuse-reference", action="store_true",
                   help="reuse the reference's side of an earlier run with this scratch folder "
                        "(its row is kept in SCRATCH/reference_side.json); run the sitelens sides")
    p.add_argument("--report", action="store_true", help="rewrite reference.md from the CSVs")
    args = p.parse_args(argv)
    if args.report:
        report(Path(args.results) if args.results else RES)
        return
    if not args.reference or not (Path(args.reference) / "eval.py").exists():
        p.error("--reference must be a checkout of the SITE code (with eval.py)")
    args.baukit = args.baukit or str(Path(args.reference).resolve().parent / "baukit")
    if not (Path(args.baukit) / "baukit" / "nethook.py").exists():
        p.error(f"--baukit {args.baukit} is not a checkout of davidbau/baukit")
    if not (Path(args.reference) / "dataset" / args.task / "test.json").exists():
        p.error(f"no task {args.task!r} in the reference's dataset/")
    if args.threads is None:
        from sitelens.threads import default_threads

        args.threads = default_threads()
    run(args)


if __name__ == "__main__":
    main()
