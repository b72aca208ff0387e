"""``sitelens bench``: models × tasks × methods → one tidy results table, written incrementally.

Every finished (model, task, method) cell is appended to the CSV at once, atomically and under a
file lock (the file is rewritten to a temporary sibling and renamed over the old one; concurrent
processes lose no rows), so a killed run loses at most the cells in progress. Each row records the
settings that made it (:data:`SETTINGS`) and their hash (``key``); a rerun with the same
``out_csv`` skips exactly the cells whose key is already there and recomputes the others, and a
row whose key is already in the file is never appended again (:func:`append_row`).

Cells run in this process by default, or on worker processes or a Ray cluster
(``executor=``, :mod:`sitelens.pipelines.executors`): each cell is an idempotent task (:func:`run_cell`) whose
row comes back to this process and is appended here, so a cell whose worker was killed is rerun
and still lands once.

Per cell: the method is fitted on the task's train/valid splits, then the first ``limit`` test
items are answered greedily from the method's prompts (zero-shot unless the method has a
``prompt_fn``) with its hooks in place for the whole generation (prefill-scoped hooks skip the
decode steps by themselves; every-position hooks act on them). Columns: see :data:`COLUMNS`.
dNTP is against the ``n_shots``-shot ICL distribution of the same queries (same demonstrations as
the ``icl`` method with the same seed, so its dNTP is exactly 0).

With ``label_metrics=True`` (``sitelens bench --label-metrics``), tasks with a closed label set
(:func:`sitelens.eval.labels.label_set`: ``cls/``, ANLI, MMLU-Pro, most of BIG-Bench Hard) are also
scored by ranking their labels under the method's intervention (:mod:`sitelens.eval.labels`):
``label_acc_first``, ``label_acc_full``, ``label_acc_full_norm`` and the ``chance`` level (mean of 1 /
number of labels) beside them; NaN for open-ended tasks. Without it only tasks that declare their
labels (``labels.json``) are ranked, and the label columns of the others are NaN.

Scoring is the one generate-and-score loop of :mod:`sitelens.eval.scoring`; the summaries of a
results table (:func:`summary_markdown`, …) are in :mod:`sitelens.pipelines.bench_summary`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
from torch import Tensor

from sitelens.baselines import Fitted, Method, get_method
from sitelens.errors import ExecutorError, SitelensError
from sitelens.eval.labels import LABEL_METRICS, LabelSet, label_metrics_of, label_set
from sitelens.eval.scoring import rank_labels, reference_logits, score_items
from sitelens.format import progress_bar
from sitelens.models import LoadSpec, fingerprint, load_model, model_name
from sitelens.pipelines.executors import (
    Cell,
    Executor,
    cached_model,
    check_fingerprint,
    make_executor,
    preloaded,
)
from sitelens.pipelines.store import ResultsStore
from sitelens.provenance import NUMERICS_VERSION, canonical, config_with_overrides, settings_hash, task_hash
from sitelens.tasks import DEFAULT_TEMPLATE, Example, Task, Template, load_task

# What made a row (the resume key hashes all of them) ...
SETTINGS = [
    "model", "fingerprint", "task", "task_hash", "method", "method_params", "seed", "n_shots",
    "limit", "n_ctx", "batch_size", "template", "numerics_version",
]
# ... and what it measured.
METRICS = [
    "n", "first_token_acc", "exact_match", "label_acc_first", "label_acc_full",
    "label_acc_full_norm", "chance", "dntp", "trainable_params", "fit_seconds",
    "seconds_per_item", "error",
]
COLUMNS = [*SETTINGS, "key", *METRICS]
# The header of keyed files written before the label metrics existed: read with those columns
# empty, rewritten with the full header by the first append (rows kept, keys still valid).
UNLABELLED_COLUMNS = [c for c in COLUMNS if c not in LABEL_METRICS]
# The header of results files written before rows were keyed on their settings (numerics
# version 1). Such files are still read; their rows have no key, so they are never reused, and the
# first append rewrites the file with the full header (old rows kept, new columns empty).
LEGACY_COLUMNS = [
    "model", "task", "method", "seed", "n", "first_token_acc", "exact_match", "dntp",
    "trainable_params", "fit_seconds", "seconds_per_item", "error",
]
_TEXT = ("model", "fingerprint", "task", "task_hash", "method", "method_params", "template", "key",
         "error")


def cell_settings(model, task: Task, method: Method, *, seed: int, n_shots: int,
                  limit: int | None, batch_size: int, template: Template, joint: bool = False) -> dict:
    """Everything that made a bench row, as the values of :data:`SETTINGS`: the model's name and
    weight fingerprint, the task's name and a hash of its splits, the method's name and every
    hyperparameter (JSON; ``"joint": true`` added when ``joint``, the method fitted with other
    tasks by :meth:`~sitelens.baselines.Method.fit_tasks`, equal to its one-task fit up to float
    rounding only), seed, ``n_shots``, ``limit``, the model's ``n_ctx``, batch size, the prompt
    template (JSON) and :data:`sitelens.provenance.NUMERICS_VERSION`."""
    params = canonical(method)
    if joint:
        params = {**params, "joint": True}
    return {
        "model": model_name(model),
        "fingerprint": fingerprint(model),
        "task": task.name,
        "task_hash": task_hash(task),
        "method": method.name,
        "method_params": json.dumps(params, sort_keys=True, separators=(",", ":")),
        "seed": int(seed),
        "n_shots": int(n_shots),
        "limit": -1 if limit is None else int(limit),
        "n_ctx": int(model.cfg.n_ctx),
        "batch_size": int(batch_size),
        "template": json.dumps(template.to_dict(), sort_keys=True),
        "numerics_version": NUMERICS_VERSION,
    }


def cell_key(settings: dict) -> str:
    """The resume key of a row: a hash of all of its :data:`SETTINGS`."""
    return settings_hash({k: settings[k] for k in SETTINGS}, n=16)


# ----------------------------------------------------------------------------------------------
# the results file


def results_store(out_csv: str | Path) -> ResultsStore:
    """The keyed store of a bench results file: :data:`COLUMNS`, keyed on ``key``; files with the
    :data:`UNLABELLED_COLUMNS` or :data:`LEGACY_COLUMNS` header are read and upgraded by it."""
    return ResultsStore(out_csv, COLUMNS, key="key", older=(UNLABELLED_COLUMNS, LEGACY_COLUMNS))


def read_results(out_csv: str | Path) -> pd.DataFrame:
    """The results table so far (empty, with :data:`COLUMNS`, when the file does not exist).
    A file with an older header is read with the new columns empty."""
    path = Path(out_csv)
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=COLUMNS)
    header = results_store(path).header(path.read_bytes())
    df = pd.read_csv(path, dtype={c: str for c in _TEXT if c in header},
                     keep_default_na=False, na_values=[""])  # a task named "nan" stays a name
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = "" if c in _TEXT else float("nan")
    for c in _TEXT:
        df[c] = df[c].fillna("")
    return df[COLUMNS]


def append_row(out_csv: str | Path, row: dict) -> bool:
    """Append one row through the results store (:class:`~sitelens.pipelines.store.ResultsStore`:
    under the file's lock, by an atomic rewrite; a file with an older header is rewritten with the
    full one first, its rows kept). Idempotent: a row whose ``key`` is already in the file is not
    appended again (returns False; True when appended), so a cell computed twice (a rerun worker,
    two runs racing) still has one row."""
    return results_store(out_csv).append([row]) > 0


# ----------------------------------------------------------------------------------------------
# ----------------------------------------------------------------------------------------------
# scoring: the one loop of sitelens.eval.scoring


def score_fitted(
    model,
    task: Task,
    items: Sequence[Example],
    fitted: Fitted,
    *,
    reference: Tensor | None = None,
    template: Template = DEFAULT_TEMPLATE,
    batch_size: int = 16,
    labels: LabelSet | None = None,
) -> dict:
    """First-token accuracy, exact match, dNTP (if ``reference`` ICL logits are given) and seconds
    per item of a fitted method on ``items``, plus per-item ``dntp_items`` and ``correct``; with
    ``labels``, the label-ranking accuracies and chance level (:data:`LABEL_METRICS`; NaN
    without), ranked under the same intervention and prompts (not counted in
    ``seconds_per_item``). Items are answered greedily from the method's prompts under its
    intervention (:func:`sitelens.eval.scoring.score_items`, default protocol)."""
    # The answer room counts template.answer_prefix before every answer, bare_digits or not: the
    # keyed cells were measured with that room, so another sizing needs a new NUMERICS_VERSION.
    s = score_items(model, task, items, fitted.prompts(model, items, template),
                    intervention=fitted.intervention, template=template, batch_size=batch_size,
                    reference=reference, labels=labels, bare_digit_room=False)
    return {
        "n": len(items),
        "first_token_acc": float(s.first_token_correct.mean()),
        "exact_match": float(s.correct.mean()),
        "dntp": float(s.dntp.mean()) if reference is not None else float("nan"),
        "seconds_per_item": s.seconds_per_item,
        "dntp_items": s.dntp,
        "correct": s.correct,
        **label_metrics_of(s.labels),
    }


def label_metrics(model, items: Sequence[Example], prompts: list[str], fitted: Fitted,
                  labels: LabelSet | None, *, template: Template, batch_size: int) -> dict:
    """The :data:`LABEL_METRICS` of a fitted method: means over items of its label ranks
    (:func:`sitelens.eval.scoring.rank_labels`, under ``fitted.intervention``) and of
    1 / n_labels; all NaN when ``labels`` is None."""
    if labels is None:
        return label_metrics_of(None)
    return label_metrics_of(rank_labels(model, items, prompts, labels, intervention=fitted.intervention,
                                        template=template, batch_size=batch_size))


# ----------------------------------------------------------------------------------------------
# the bench


# The 28 extractive tasks of the FV benchmark (the other 29 are abstractive).
FV_EXTRACTIVE = frozenset({
    "adjective_v_verb_3", "adjective_v_verb_5", "alphabetically_first_3", "alphabetically_first_5",
    "alphabetically_last_3", "alphabetically_last_5", "animal_v_object_3", "animal_v_object_5",
    "choose_first_of_3", "choose_first_of_5", "choose_last_of_3", "choose_last_of_5",
    "choose_middle_of_3", "choose_middle_of_5", "color_v_animal_3", "color_v_animal_5",
    "concept_v_object_3", "concept_v_object_5", "conll2003_location", "conll2003_organization",
    "conll2003_person", "fruit_v_animal_3", "fruit_v_animal_5", "object_v_concept_3",
    "object_v_concept_5", "verb_v_adjective_3", "verb_v_adjective_5", "squad_val",
})


def _task_of(spec) -> Task:
    return spec if isinstance(spec, Task) else load_task(spec)


@dataclass(frozen=True)
class BenchConfig:
    """The settings of one bench run (see :func:`run_bench`, which also takes each field as a
    keyword argument). All but ``progress``, ``n_ctx``, ``load``, ``dntp`` and ``label_metrics`` are
    part of every row's key (the weight fingerprint in the key already tells a bfloat16 model from
    a float32 one); a row computed without one of the last two has NaN in its columns, so resume
    a run with the same ``dntp`` and ``label_metrics``."""

    limit: int | None = 100  # test items per task (None: all)
    seed: int = 0  # fits, demonstrations and the ICL reference
    n_shots: int = 10  # demonstrations of the ICL reference (dNTP) and of the icl method
    batch_size: int = 16  # prompts per forward pass when scoring
    template: Template = DEFAULT_TEMPLATE
    progress: bool = False  # a tqdm bar over the cells
    n_ctx: int | None = None  # context length of models loaded by name (None: load_model's)
    load: LoadSpec | None = None  # device, dtype, ... of models loaded by name (None: load_model's)
    dntp: bool = True  # False: no k-shot ICL reference pass; dNTP is NaN and the row's error says so
    label_metrics: bool = False  # True: rank the labels of every closed-label task (else: declared only)
    # K > 1: the cells of a method that fits jointly (SITE, ``Method.fits_jointly``) are fitted K
    # tasks at a time (``Method.fit_tasks``), each group's other cells run right after it; such
    # rows carry ``"joint": true`` in ``method_params`` (their key), since they equal the one-task
    # fits up to float rounding, not bit for bit. 0 or 1: every cell fits alone.
    joint: int = 0


def run_bench(
    models: Sequence,
    tasks: Sequence,
    methods: Sequence[str | Method],
    out_csv: str | Path,
    config: BenchConfig | None = None,
    *,
    executor: str | Executor | None = None,
    **overrides,
) -> pd.DataFrame:
    """Fit and score every (model, task, method) cell whose key is not yet in ``out_csv``; return
    this run's rows (one per cell, in models × tasks × methods order). ``config`` (default
    :class:`BenchConfig`) holds the settings; keyword ``overrides`` are its field names
    (``limit=3``, ``n_shots=2``, …; an unknown name raises ``TypeError``).

    A cell's key (:func:`cell_key`) hashes everything that made it (:func:`cell_settings`): model
    and weight fingerprint, task and a hash of its splits, the method and all its
    hyperparameters, seed, ``n_shots``, ``limit``, the model's ``n_ctx``, ``batch_size``, the
    template and the numerics version of sitelens. A row computed under other settings is never
    reused (and never removed: the file keeps every row, each with its settings).

    models: names for :func:`sitelens.models.load_model` (loaded only if a cell needs them) or
    loaded models. tasks: specs for :func:`sitelens.tasks.load_task` or :class:`Task` objects.
    methods: names (``sitelens.baselines.available_methods()``) or :class:`Method` instances
    (their ``name`` is the cell key). ``limit``: test items per task. A method that raises a
    :class:`SitelensError` (e.g. too few training items for its demonstrations) gets a row with
    the message in ``error`` and NaN metrics; other exceptions stop the run (finished cells stay).
    ``n_ctx``: context length for models loaded by name (default: :func:`load_model`'s); raise it
    for tasks whose k-shot prompts are longer (squad_val's 10-shot prompts reach 2,621 SmolLM2
    tokens). Results do not depend on it for prompts that fit.

    ``executor``: where the cells run (:func:`sitelens.pipelines.executors.make_executor`): ``None`` or
    ``"local"`` in this process, ``"processes:N"`` on N worker processes, ``"ray"`` /
    ``"ray:HOST:PORT"`` on Ray, or an :class:`~sitelens.pipelines.executors.Executor` (left open). Every
    executor gives the same rows; with a non-local one, models must be given by name (each worker
    loads them itself) and methods must pickle. The model is still loaded here once, for the
    weight fingerprint of the keys.
    """
    cfg = config_with_overrides(BenchConfig, config, overrides, "run_bench")
    methods = [get_method(m) for m in methods]
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique (they key the cells), got {names}")
    task_list = [_task_of(t) for t in tasks]
    ex = make_executor(executor)
    if not ex.in_process and not all(isinstance(m, str) for m in models):
        raise ExecutorError(f"run_bench with executor {ex.name} needs model names (each worker "
                            "loads its model), not loaded models; or use the local executor.")
    done = results_store(out_csv).keys()
    keys_this_run: list[str] = []
    bar = progress_bar(total=len(models) * len(task_list) * len(methods), desc="bench",
                       enabled=cfg.progress, leave=True)

    def on_result(cell: Cell, row: dict) -> None:
        append_row(out_csv, row)
        bar.update(1)

    later: list[Cell] = []  # the cells of a non-local executor: all models in one sweep
    try:
        for spec in models:
            # The key holds the weight fingerprint, so each model is loaded (one at a time) even
            # when all of its cells are done: SmolLM2 takes about a second from the weight cache.
            model = load_model(spec, n_ctx=cfg.n_ctx, spec=cfg.load) if isinstance(spec, str) else spec
            ref = spec if isinstance(spec, str) else f"<in-process model {id(model)}>"
            k = max(1, cfg.joint)
            with preloaded(ref, cfg.n_ctx, model, cfg.load):
                for start in range(0, len(task_list), k):
                    jobs = []
                    for task in task_list[start:start + k]:
                        for method in methods:
                            settings = cell_settings(
                                model, task, method, seed=cfg.seed, n_shots=cfg.n_shots,
                                limit=cfg.limit, batch_size=cfg.batch_size, template=cfg.template,
                                joint=k > 1 and method.fits_jointly)
                            key = cell_key(settings)
                            keys_this_run.append(key)
                            if key in done:
                                bar.update(1)
                                continue
                            done.add(key)  # listed twice (a model or task given twice): run once
                            jobs.append(BenchJob(ref, cfg.n_ctx, task, method, settings, key, cfg))
                    if k > 1:
                        jobs = _fit_jointly(model, jobs, cfg)
                    cells = [Cell(j.key, run_cell, (j,),
                                  label=f"{j.settings['model']}/{j.task.name}/{j.method.name}")
                             for j in jobs]
                    if ex.in_process:
                        ex.run(cells, on_result)
                    else:
                        later += cells
            del model
        if later:
            ex.run(later, on_result)
    finally:
        bar.close()
        _REFERENCE.clear()  # this process's reference logits: not kept past the run
        if ex is not executor:  # made here from a name: closed here
            ex.close()
    df = read_results(out_csv)
    order = {k: i for i, k in enumerate(keys_this_run)}
    mine = df[df["key"].isin(order)].drop_duplicates("key", keep="last")
    return mine.sort_values("key", key=lambda c: c.map(order)).reset_index(drop=True)


@dataclass(frozen=True)
class BenchJob:
    """One bench cell, everything a worker needs to compute its row (picklable): the model's
    name for :func:`sitelens.pipelines.executors.cached_model` (+ ``n_ctx``), the task, the method, the
    row's settings and key, and the run's config."""

    model: str
    n_ctx: int | None
    task: Task
    method: Method
    settings: dict
    key: str
    config: BenchConfig
    fitted: Fitted | None = None  # fitted already (with other tasks, :func:`_fit_jointly`)


def _fit_jointly(model, jobs: list[BenchJob], cfg: BenchConfig) -> list[BenchJob]:
    """``jobs`` with the cells of each method that fits jointly fitted together
    (:meth:`~sitelens.baselines.Method.fit_tasks`, in this process). A joint fit that raises a
    :class:`SitelensError` leaves its cells to fit alone in :func:`run_cell`, where a task's own
    error lands in its row."""
    by_method: dict[str, list[int]] = {}
    for i, j in enumerate(jobs):
        if j.method.fits_jointly:
            by_method.setdefault(j.method.name, []).append(i)
    jobs = list(jobs)
    for idx in by_method.values():
        method = jobs[idx[0]].method
        try:
            fits = method.fit_tasks(model, [jobs[i].task for i in idx], seed=cfg.seed,
                                    template=cfg.template)
        except SitelensError as e:
            warnings.warn(f"the joint fit of {method.name} on {len(idx)} tasks failed ({e}); "
                          "each of them is fitted alone", stacklevel=2)
            continue
        for i, fitted in zip(idx, fits):
            jobs[i] = replace(jobs[i], fitted=fitted)
    return jobs


# the ICL reference logits of the last (model, task, items, shots, seed, template, batch) seen
# in this process, shared by the methods of one task (as a worker runs them one after another)
_REFERENCE: dict[tuple, tuple] = {}


def _reference(model, job: BenchJob, items) -> tuple[Tensor | None, str]:
    cfg, s = job.config, job.settings
    if not cfg.dntp:
        return None, "dntp: not computed (BenchConfig(dntp=False))"
    key = (job.model, s["fingerprint"], s["task_hash"], s["limit"], s["n_shots"], s["seed"],
           s["template"], s["batch_size"])
    if key not in _REFERENCE:
        _REFERENCE.clear()
        try:
            ref = reference_logits(model, job.task, items, n_shots=cfg.n_shots, seed=cfg.seed,
                                   template=cfg.template, batch_size=cfg.batch_size)
            _REFERENCE[key] = (ref, "")
        except SitelensError as e:
            _REFERENCE[key] = (None, f"dntp: {e}")
    return _REFERENCE[key]


def run_cell(job: BenchJob) -> dict:
    """Fit and score one cell, in whatever process runs it; returns its row (settings, key,
    metrics). The model comes from :func:`sitelens.pipelines.executors.cached_model` (loaded once per
    process); a model whose weight fingerprint is not the one in the key raises
    :class:`ExecutorError` (a worker with other weights must not write under this key)."""
    cfg, task, method = job.config, job.task, job.method
    model = cached_model(job.model, job.n_ctx, cfg.load)
    check_fingerprint(model, job.model, job.settings["fingerprint"])
    items = task.test[:cfg.limit] if cfg.limit else task.test
    reference, ref_error = _reference(model, job, items)
    labels = label_set(task) if cfg.label_metrics or task.labels else None
    row = dict(job.settings, key=job.key, n=len(items))
    t0 = time.perf_counter()
    try:
        fitted = job.fitted or method.fit(model, task, seed=cfg.seed, template=cfg.template)
        fit_seconds = fitted.fit_seconds if job.fitted else time.perf_counter() - t0
        res = score_fitted(model, task, items, fitted, reference=reference,
                           template=cfg.template, batch_size=cfg.batch_size, labels=labels)
        row.update({k: res[k] for k in ("first_token_acc", "exact_match", "dntp",
                                         "seconds_per_item", *LABEL_METRICS)})
        row.update(trainable_params=fitted.n_params, fit_seconds=fit_seconds, error=ref_error)
    except SitelensError as e:
        nan = float("nan")
        row.update(first_token_acc=nan, exact_match=nan, dntp=nan, trainable_params=nan,
                   fit_seconds=time.perf_counter() - t0, seconds_per_item=nan,
                   error=f"{type(e).__name__}: {e}", **dict.fromkeys(LABEL_METRICS, nan))
    return row


__all__ = [
    "SETTINGS", "METRICS", "COLUMNS", "UNLABELLED_COLUMNS", "LEGACY_COLUMNS", "cell_settings", "cell_key",
    "read_results", "append_row", "score_fitted", "label_metrics", "FV_EXTRACTIVE", "BenchConfig",
    "run_bench", "BenchJob", "run_cell",
]
