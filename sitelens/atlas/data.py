"""The data behind the head atlas: α maps of many tasks, their similarity, measured transfer, what
each head's injected vector promotes, and the other lenses' scores where computed.

:func:`build_atlas_data` fits SITE on every task (seeds of :class:`AtlasConfig`; each fit an adapter
under a resumable cache keyed on everything that made it, :class:`sitelens.pipelines.store.CellStore`),
then measures transfer (task B's embedding through task A's α, :func:`sitelens.patching.inter_task`)
on every ordered pair, the α similarity (Spearman over heads) and whether it predicts transfer
(Spearman ρ and a Mantel permutation p, :func:`sitelens.patching.analysis.transfer_similarity_correlation`),
the family structure of the similarity against a permutation null, and each head's top promoted
tokens (:func:`sitelens.lenses.head_logit_lens`). :class:`AtlasData` holds the tables;
:meth:`AtlasData.save` / :meth:`AtlasData.load` keep them as small CSV + JSON files
(``sitelens/data/atlas/{model}/`` for the bundled models), so the page and the widget build without refitting.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sitelens.atlas.tables import MINIMAL_FILE, read_minimal
from sitelens.io import atomic_write_csv, atomic_write_json
from sitelens.models import LoadSpec

FILES = ("alpha.csv", "similarity.csv", "transfer.csv", "tokens.csv", "lenses.csv", "summary.json")

# Families of the FV benchmark's tasks (by name), for the within- vs between-family test.
FV_FAMILY_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"^choose_|^alphabetically_", "list selection"),
    (r"_v_", "category filter"),
    (r"^conll2003_|^squad|^commonsense", "reading"),
    (r"^english[-_]|^country[-_]language", "translation"),
    (r"capitaliz|lowercase|uppercase|letter|word_length", "string"),
    (r"^(present[-_]past|singular[-_]plural|adjective_comparative)$", "morphology"),
    (r"^(antonym|synonym)$", "lexical"),
    (r"^(next_item|prev_item)$", "sequence"),
    (r"^(sentiment|ag_news)$", "classification"),
    (r"country|landmark|park|person|product|national_parks|animal_young", "knowledge"),
)


def task_family(name: str) -> str | None:
    """The family of an FV / built-in task name (``None`` when no pattern matches)."""
    for pattern, family in FV_FAMILY_PATTERNS:
        if re.search(pattern, name):
            return family
    return None


@dataclass(frozen=True)
class AtlasConfig:
    """Settings of :func:`build_atlas_data` (all of them key the cached fits and the files)."""

    seeds: tuple[int, ...] = (0,)
    n_prompts: int = 50  # stage-1 prompts
    n_shots: int = 10
    n_examples: int = 400  # stage-2 items (FitConfig default: 50 steps of batch 8)
    transfer_limit: int = 20  # test items per target task in the transfer measurement
    k: int = 10  # top-k heads of the inter-task "topk" mode
    top_tokens: int = 3  # promoted tokens kept per head
    fast_lenses: tuple[str, ...] = ("alpha-grad", "atp", "dla")  # computed on every task
    n_perm: int = 1000  # permutations of the Mantel and family tests
    seed: int = 0  # of the permutations and bootstrap


@dataclass
class AtlasData:
    """One model's atlas tables (see the module docstring)."""

    model: str
    n_layers: int
    n_heads: int
    alpha: pd.DataFrame  # task, layer, head, alpha, ci_low, ci_high, n_seeds
    similarity: pd.DataFrame  # square, Spearman ρ of α maps, index/columns = task
    transfer: pd.DataFrame  # source_task, target_task, mode, accuracy, zero_shot, n
    tokens: pd.DataFrame  # task, layer, head, rank, token, logit
    lenses: pd.DataFrame  # task, lens, layer, head, score, ci_low, ci_high (may be empty)
    summary: dict = field(default_factory=dict)
    minimal: pd.DataFrame | None = None  # minimal.csv (sitelens.atlas.minimal), when made and current
    minimal_note: str = ""  # why there is no minimal table

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(self.alpha["task"]))

    def alpha_map(self, task: str, column: str = "alpha") -> np.ndarray:
        d = self.alpha[self.alpha.task == task].sort_values(["layer", "head"])
        return d[column].to_numpy(float).reshape(self.n_layers, self.n_heads)

    def save(self, directory: str | Path) -> Path:
        """Write the tables atomically into ``directory`` (created)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_csv(d / "alpha.csv", self.alpha)
        atomic_write_csv(d / "similarity.csv", self.similarity.reset_index(names="task"))
        atomic_write_csv(d / "transfer.csv", self.transfer)
        atomic_write_csv(d / "tokens.csv", self.tokens)
        atomic_write_csv(d / "lenses.csv", self.lenses)
        if self.minimal is not None:
            atomic_write_csv(d / MINIMAL_FILE, self.minimal)
        atomic_write_json(d / "summary.json", {"model": self.model, "n_layers": self.n_layers,
                                               "n_heads": self.n_heads, **self.summary})
        return d

    @classmethod
    def load(cls, directory: str | Path) -> AtlasData:
        from sitelens.errors import OutputError

        d = Path(directory)
        missing = [f for f in FILES if not (d / f).exists()]
        if missing:
            raise OutputError(f"{d} is not an atlas data folder: {', '.join(missing)} missing. "
                              "Build it with `sitelens atlas --refit`.")
        summary = json.loads((d / "summary.json").read_text())
        sim = pd.read_csv(d / "similarity.csv").set_index("task")
        minimal, note = read_minimal(d, summary)
        return cls(
            model=summary.pop("model"), n_layers=int(summary.pop("n_layers")),
            n_heads=int(summary.pop("n_heads")), alpha=pd.read_csv(d / "alpha.csv"),
            similarity=sim, transfer=pd.read_csv(d / "transfer.csv"),
            tokens=pd.read_csv(d / "tokens.csv", keep_default_na=False),
            lenses=pd.read_csv(d / "lenses.csv"), summary=summary, minimal=minimal,
            minimal_note=note)


# ----------------------------------------------------------------------------------------------
# statistics


def family_test(similarity: pd.DataFrame, families: dict[str, str | None], *, n_perm: int = 1000,
                seed: int = 0) -> dict:
    """Mean off-diagonal similarity within families minus between families, and its permutation
    p-value (family labels shuffled over tasks, ``n_perm`` seeded permutations, one-sided)."""
    names = [t for t in similarity.index if families.get(t)]
    S = similarity.loc[names, names].to_numpy(float)
    labels = np.array([families[t] for t in names])
    off = ~np.eye(len(names), dtype=bool)

    def gap(lab: np.ndarray) -> float:
        same = (lab[:, None] == lab[None, :]) & off
        diff = (lab[:, None] != lab[None, :]) & off
        if not same.any() or not diff.any():
            return float("nan")
        return float(S[same].mean() - S[diff].mean())

    obs = gap(labels)
    rng = np.random.default_rng(seed)
    null = np.array([gap(rng.permutation(labels)) for _ in range(n_perm)])
    p = (int(np.sum(null >= obs - 1e-12)) + 1) / (n_perm + 1) if np.isfinite(obs) else float("nan")
    return {"gap": obs, "p_value": p, "null_mean": float(np.nanmean(null)) if n_perm else None,
            "n_tasks": len(names), "n_families": int(len(set(labels)))}


def depth_profile(data: AtlasData, bins: int = 10) -> pd.DataFrame:
    """α mass per relative-depth bin (layer / n_layers in deciles), averaged over tasks: one row
    per bin with ``mass`` (share of the total α in that bin) and ``mean_alpha``."""
    a = data.alpha.assign(depth=(data.alpha.layer + 0.5) / data.n_layers)
    a["bin"] = np.minimum((a.depth * bins).astype(int), bins - 1)
    per = a.groupby(["task", "bin"])["alpha"].sum() / a.groupby("task")["alpha"].sum()
    mass = per.groupby(level="bin").mean().reindex(range(bins), fill_value=0.0)
    mean = a.groupby("bin")["alpha"].mean()
    return pd.DataFrame({"bin": range(bins), "depth_low": np.arange(bins) / bins,
                         "mass": mass.reindex(range(bins)).to_numpy(),
                         "mean_alpha": mean.reindex(range(bins)).to_numpy()})


def depth_enrichment(data: AtlasData, bins: int = 10) -> pd.DataFrame:
    """:func:`depth_profile` with ``layer_share`` (the share of the blocks whose centre lies in the
    bin), ``enrichment`` (mass / layer_share: 1 is uniform; NaN for a bin without a block) and
    ``centre_of_mass`` (the α-weighted mean depth (layer + 0.5) / n_layers, mean over tasks; the
    same in every row): where two models of different depths put their α, comparably."""
    L = data.n_layers
    centres = (np.arange(L) + 0.5) / L  # [n_layers] relative depth of each block's centre
    share = np.bincount(np.minimum((centres * bins).astype(int), bins - 1), minlength=bins) / L
    com = float(np.mean([float((t.alpha * ((t.layer + 0.5) / L)).sum() / t.alpha.sum())
                         for _, t in data.alpha.groupby("task")]))
    return pd.DataFrame([{"bin": r.bin, "depth_low": r.depth_low, "mass": r.mass, "layer_share": share[r.bin],
                          "enrichment": r.mass / share[r.bin] if share[r.bin] else float("nan"),
                          "mean_alpha": r.mean_alpha, "centre_of_mass": com}
                         for r in depth_profile(data, bins).itertuples()])


# ----------------------------------------------------------------------------------------------
# building


def _fit_path(task, seed: int, cfg: AtlasConfig, cells):
    """Where the cached adapter of (``task``, ``seed``) lives, and the fit's config."""
    from sitelens.pipelines.store import slug
    from sitelens.provenance import task_hash
    from sitelens.site import FitConfig

    fc = FitConfig(n_examples=cfg.n_examples, seed=seed)
    params = {"fit": asdict(fc), "n_prompts": cfg.n_prompts, "n_shots": cfg.n_shots,
              "task_hash": task_hash(task)}
    return cells.path(f"adapters/{slug(task.name)}_s{seed}", params), fc


def _fit_cached(model, task, seed: int, cfg: AtlasConfig, cells, log):
    from sitelens.site import SiteAdapter, fit_site

    path, fc = _fit_path(task, seed, cfg, cells)
    ad = SiteAdapter.load_matching(path, model, on_error=lambda e: log(f"  {path.name}: {e}; refitting"))
    if ad is not None:
        return ad
    t0 = time.perf_counter()
    ad = fit_site(model, task, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, config=fc)
    ad.save(path)
    cells.record(f"fit/{task.name}/s{seed}", time.perf_counter() - t0)
    log(f"  fitted {task.name} seed {seed} in {time.perf_counter() - t0:.1f}s")
    return ad


def _cell_store(model, cache_dir, log):
    from sitelens.models import fingerprint, model_name
    from sitelens.pipelines.store import CellStore
    from sitelens.provenance import NUMERICS_VERSION

    return CellStore(Path(cache_dir) / model_name(model), log,
                     base={"fingerprint": fingerprint(model), "numerics": NUMERICS_VERSION})


@dataclass(frozen=True)
class AtlasFitJob:
    """One atlas fit for a worker (picklable): the model's name (+ ``n_ctx``) for
    :func:`sitelens.pipelines.executors.cached_model` and its weight fingerprint, the cache directory, the
    task, the seed, the config."""

    model: str
    n_ctx: int | None
    fingerprint: str  # the driver's: the worker's model must have the same weights
    cache_dir: str
    task: object  # a sitelens.tasks.Task
    seed: int
    config: AtlasConfig
    load: LoadSpec | None = None  # how the worker loads the model (None: load_model's defaults)


def run_atlas_fit(job: AtlasFitJob) -> str:
    """Fit (or find) one (task, seed) adapter in this process (a worker) and save it into the
    cache; returns ``""``, or the message of the :class:`~sitelens.errors.SitelensError` that
    left the task out (e.g. too few items for the shots)."""
    from sitelens.errors import SitelensError
    from sitelens.pipelines.executors import cached_model, check_fingerprint

    model = cached_model(job.model, job.n_ctx, job.load)
    check_fingerprint(model, job.model, job.fingerprint)
    cells = _cell_store(model, job.cache_dir, lambda m: None)
    try:
        _fit_cached(model, job.task, job.seed, job.config, cells, lambda m: None)
    except SitelensError as e:
        return str(e)
    return ""


def fit_on_executor(model, spec: str, tasks, cfg: AtlasConfig, cache_dir, executor, *,
                    n_ctx: int | None = None, log=None, load: LoadSpec | None = None
                    ) -> dict[str, str]:
    """Run the missing (task, seed) fits of :func:`build_atlas_data` on ``executor`` (each worker
    loads ``spec`` with ``n_ctx`` and ``load`` itself and writes its adapter into ``cache_dir``); returns
    ``{task: why}`` for the tasks that could not be fitted."""
    from sitelens.pipelines.executors import Cell

    log = log or (lambda msg: None)
    cells = _cell_store(model, cache_dir, lambda m: None)
    todo = []
    for task in tasks:
        for seed in cfg.seeds:
            path, _ = _fit_path(task, seed, cfg, cells)
            if not (path / "adapter.json").exists():
                job = AtlasFitJob(spec, n_ctx, cells.base["fingerprint"],
                                  str(Path(cache_dir).resolve()), task, seed, cfg, load)
                todo.append(Cell(str(path), run_atlas_fit, (job,),
                                 label=f"{task.name} seed {seed}"))
    skipped: dict[str, str] = {}

    def done(cell, why: str) -> None:
        name = cell.args[0].task.name
        if why:
            skipped.setdefault(name, why)
        log(f"  {cell.label}: {'skipped: ' + why if why else 'fitted'} ({executor.name})")

    if todo:
        log(f"{len(todo)} fit(s) on {executor.name}")
        executor.run(todo, done)
    return skipped


def _fast_lenses(model, task, adapter, cfg: AtlasConfig) -> pd.DataFrame:
    """The cheap lenses of one task (all heads from a forward and a backward pass), with the
    embedding of the task's first fit."""
    from sitelens.lenses import HeadScores, alpha_gradient, attribution_patching
    from sitelens.lenses.logit_lens import direct_logit_attribution

    parts = []
    for lens in cfg.fast_lenses:
        if lens == "alpha-grad":
            parts.append(alpha_gradient(model, task, adapter.embedding, seed=cfg.seed))
        elif lens in ("atp", "atp-star"):
            parts.append(attribution_patching(model, task, adapter.embedding,
                                              grad_drop=lens == "atp-star", seed=cfg.seed))
        elif lens == "dla":
            parts.append(direct_logit_attribution(model, task, adapter, seed=cfg.seed))
        else:
            raise ValueError(f"Atlas fast lenses are alpha-grad, atp, atp-star, dla; got {lens!r}.")
    return HeadScores.concat(parts).df


def _fit_joint(model, tasks, cfg: AtlasConfig, cells, log) -> None:
    """The missing (task, seed) fits, per seed all tasks at once (:func:`sitelens.site.fit_site_tasks`:
    stage 1 pooled, stage 2 joint), saved into the fit cache where the one-task loop of
    :func:`_fit_all` then finds them; each fit's recorded seconds is its even share of the joint
    wall time. A :class:`~sitelens.errors.SitelensError` (e.g. a task with too few items for the
    shots) leaves that seed's fits to the one-task loop, which names the task it skips."""
    from sitelens.errors import SitelensError
    from sitelens.site import fit_site_tasks

    for seed in cfg.seeds:
        todo = []
        for task in tasks:
            path, fc = _fit_path(task, seed, cfg, cells)
            if not (path / "adapter.json").exists():
                todo.append((task, path))
        if len(todo) < 2:
            continue
        t0 = time.perf_counter()
        try:
            ads = fit_site_tasks(model, [t for t, _ in todo], n_prompts=cfg.n_prompts,
                                 n_shots=cfg.n_shots, config=fc)
        except SitelensError as e:
            log(f"  joint fit of seed {seed} failed ({e}); fitting one task at a time")
            continue
        share = (time.perf_counter() - t0) / len(todo)
        for (task, path), ad in zip(todo, ads):
            ad.save(path)
            cells.record(f"fit/{task.name}/s{seed}", share)
        log(f"  fitted {len(todo)} tasks jointly, seed {seed}, in {share * len(todo):.1f}s")


def _fit_all(model, tasks, cfg: AtlasConfig, cells, log,
             skipped: dict[str, str] | None = None, *, joint: bool = False) -> tuple[dict, dict, float]:
    """``({task: [adapter per seed]}, {skipped task: why}, seconds)``; tasks already in
    ``skipped`` (their fit failed on a worker) are not tried again. ``joint``: the missing fits
    first run jointly (:func:`_fit_joint`)."""
    from sitelens.errors import SitelensError

    t0 = time.perf_counter()
    if joint:
        _fit_joint(model, [t for t in tasks if t.name not in (skipped or {})], cfg, cells, log)
    adapters: dict[str, list] = {}
    skipped = dict(skipped or {})
    for i, task in enumerate(tasks):
        if task.name in skipped:
            log(f"[{i + 1}/{len(tasks)}] {task.name}: skipped: {skipped[task.name]}")
            continue
        log(f"[{i + 1}/{len(tasks)}] {task.name}")
        try:
            adapters[task.name] = [_fit_cached(model, task, s, cfg, cells, log) for s in cfg.seeds]
        except SitelensError as e:  # e.g. too few training items for the shots: left out, said
            skipped[task.name] = str(e)
            log(f"  skipped {task.name}: {e}")
    return adapters, skipped, time.perf_counter() - t0


def _alpha_table(adapters: dict, L: int, H: int) -> pd.DataFrame:
    """One row per (task, layer, head): mean α over the seeds and its 95% t-interval."""
    import torch

    from sitelens.lenses.alpha import interval

    rows = []
    for tname, ads in adapters.items():
        A = torch.stack([a.alpha.detach().float().cpu() for a in ads]).numpy()  # [S, L, H]
        lo, hi = interval(A)
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        rows.append(pd.DataFrame({
            "task": tname, "layer": layer.ravel(), "head": head.ravel(),
            "alpha": A.mean(0).ravel(), "ci_low": np.clip(lo, 0, 1).ravel(),
            "ci_high": np.clip(hi, 0, 1).ravel(), "n_seeds": len(ads)}))
    return pd.concat(rows, ignore_index=True)


def _statistics(sim: pd.DataFrame, transfer: pd.DataFrame, names: list[str], cfg: AtlasConfig
                ) -> dict:
    """α similarity vs transfer (raw accuracy in both modes, and relative to zero-shot) and the
    within- vs between-family test."""
    from sitelens.patching.analysis import transfer_similarity_correlation

    def corr(mode: str, normalize: str) -> dict:
        return transfer_similarity_correlation(sim, transfer, mode=mode, normalize=normalize,
                                               n_perm=cfg.n_perm, seed=cfg.seed)

    return {
        "similarity_vs_transfer": {m: corr(m, "none") for m in ("alpha", "topk")},
        "similarity_vs_transfer_zero_shot_normalized": corr("alpha", "zero_shot"),
        "family_test": family_test(sim, {t: task_family(t) for t in names}, n_perm=cfg.n_perm,
                                   seed=cfg.seed),
    }


def _tokens_table(model, first: dict, cfg: AtlasConfig) -> pd.DataFrame:
    from sitelens.lenses.logit_lens import head_logit_lens

    toks = [head_logit_lens(model, ad.embedding, k=cfg.top_tokens).drop(columns=["token_id"])
            .assign(task=t) for t, ad in first.items()]
    tokens = pd.concat(toks, ignore_index=True)[["task", "layer", "head", "rank", "token", "logit"]]
    tokens["logit"] = tokens["logit"].round(3)
    return tokens


def _lens_table(model, tasks, first: dict, cfg: AtlasConfig, cells, lenses) -> pd.DataFrame:
    """The fast lenses of every task (cached cells) plus the other lenses of ``lenses``."""
    from sitelens.provenance import task_hash

    cols = ["task", "lens", "layer", "head", "score", "ci_low", "ci_high"]
    parts = []
    for task in tasks:
        ad = first[task.name]
        p = {"lenses": list(cfg.fast_lenses), "task_hash": task_hash(task),
             "adapter": ad.meta.get("hyperparameters"), "seed": cfg.seed}
        parts.append(cells.csv(f"lenses/{task.name}", p,
                               lambda task=task, ad=ad: _fast_lenses(model, task, ad, cfg)))
    rows = pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
    if lenses is not None and len(lenses):
        extra = lenses[lenses.task.isin(list(first))][cols]
        rows = pd.concat([rows, extra[~extra.lens.isin(cfg.fast_lenses)]], ignore_index=True)
    return _round_lens(rows)


def _round_lens(rows: pd.DataFrame) -> pd.DataFrame:
    """The lens table's scores and intervals at 4 significant digits (what the atlas shows)."""
    num = ["score", "ci_low", "ci_high"]
    rows[num] = rows[num].astype(float).map(lambda x: float(f"{x:.4g}"))
    return rows


def build_atlas_data(
    model,
    tasks: Sequence,
    config: AtlasConfig | None = None,
    *,
    cache_dir: str | Path = "runs/atlas",
    lenses: pd.DataFrame | None = None,
    log: Callable[[str], None] | None = None,
    executor=None,
    model_spec: str | None = None,
    n_ctx: int | None = None,
    load: LoadSpec | None = None,
    joint: bool = False,
) -> AtlasData:
    """Fit, measure and tabulate one model's atlas (see the module docstring). ``tasks``: loaded
    :class:`~sitelens.tasks.Task` objects (a task that cannot be fitted, e.g. too few items for
    the shots, is left out and named in ``summary["skipped"]``). ``lenses``: optional
    :class:`HeadScores`-style rows (``task, lens, layer, head, score, ci_low, ci_high``) to carry
    into the atlas. Every fit, the transfer table and each task's fast lenses are cells under
    ``cache_dir/{model}`` (a rerun reuses them).

    ``executor`` (:func:`sitelens.pipelines.executors.make_executor`; default in this process): with
    ``processes:N`` or ``ray[:ADDRESS]`` the missing fits run on workers first
    (:func:`fit_on_executor`; each loads ``model_spec``, default the model's name, with ``n_ctx``
    and the load specification ``load``, and writes into ``cache_dir``, which they must see), the
    rest as above. ``joint``: the fits left to this process run all tasks at once, per seed
    (:func:`sitelens.site.fit_site_tasks`; each equals its one-task fit up to float rounding)."""
    import torch

    from sitelens.models import fingerprint, model_name
    from sitelens.patching import inter_task
    from sitelens.patching.analysis import alpha_similarity
    from sitelens.pipelines.executors import make_executor
    from sitelens.provenance import NUMERICS_VERSION, task_hash

    cfg = config or AtlasConfig()
    log = log or (lambda msg: None)
    name = model_name(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    cells = _cell_store(model, cache_dir, log)
    ex = make_executor(executor)
    try:
        failed = ({} if ex.in_process else
                  fit_on_executor(model, model_spec or name, tasks, cfg, cache_dir, ex,
                                  n_ctx=n_ctx, log=log, load=load))
    finally:
        if ex is not executor:
            ex.close()
    adapters, skipped, fit_seconds = _fit_all(model, tasks, cfg, cells, log, failed, joint=joint)
    tasks = [t for t in tasks if t.name in adapters]
    names = list(adapters)
    alpha = _alpha_table(adapters, L, H)
    mean_alpha = {t: torch.tensor(alpha[alpha.task == t].alpha.to_numpy(np.float32)).reshape(L, H)
                  for t in names}  # [n_layers, n_heads] each
    sim = alpha_similarity(mean_alpha)["spearman"]
    first = {t: ads[0] for t, ads in adapters.items()}
    params = {"tasks": [[t.name, task_hash(t)] for t in tasks], "seeds": list(cfg.seeds),
              "config": asdict(cfg)}
    t1 = time.perf_counter()
    transfer = cells.csv("transfer", params, lambda: inter_task(
        model, list(tasks), first, k=min(cfg.k, L * H), limit=cfg.transfer_limit, seed=cfg.seed,
        n_boot=0))
    transfer_seconds = time.perf_counter() - t1
    t2 = time.perf_counter()
    lens_rows = _lens_table(model, tasks, first, cfg, cells, lenses)
    lens_seconds = time.perf_counter() - t2
    data = AtlasData(name, L, H, alpha.round(5), sim.round(5), transfer,
                     _tokens_table(model, first, cfg), lens_rows)
    data.summary = {
        "config": asdict(cfg), "n_tasks": len(names), "skipped": skipped,
        "fingerprint": fingerprint(model), "numerics_version": NUMERICS_VERSION,
        **_statistics(sim, transfer, names, cfg),
        "families": {t: task_family(t) for t in names},
        "depth_profile": depth_profile(data).round(5).to_dict(orient="list"),
        "seconds": {"fits": round(fit_seconds, 1), "transfer": round(transfer_seconds, 1),
                    "fast_lenses": round(lens_seconds, 1)},
        "threads": torch.get_num_threads(),
    }
    return data
