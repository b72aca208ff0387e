"""Checks that run before a model is loaded and before anything is written.

:func:`validate` checks what the parser cannot: path arguments, the fit options (``FitConfig``'s
own checks), model names (bundled, TransformerLens names in the local Hugging Face cache, HF
directories and their files: :func:`sitelens.models.hf_arch.check_hf_files`), tasks (loaded
here, cheap, and kept on ``args`` for the command), enough pairs for ``--n-shots`` and the splits
(:func:`_check_n_shots`), adapter directories, option combinations (:func:`check_heads_options`
for ``sitelens heads``: ``dla`` and the backend,
:func:`~sitelens.cli.frontier.check_frontier_options`; options the command would ignore,
:func:`sitelens.cli.options.check_ignored`). :func:`check_outputs` refuses output paths of the
wrong kind, and earlier results without ``--force``. :func:`check_heads` is the one check that
needs the model (k at most its number of heads); the commands call it right after the load. Each
raises a :class:`~sitelens.errors.SitelensError`, which :func:`sitelens.cli.main` prints as one
line.
"""

from __future__ import annotations

from pathlib import Path

from sitelens.cli.configs import CONFIGS
from sitelens.cli.frontier import check_frontier_options
from sitelens.cli.guards import check_no_replace
from sitelens.cli.options import check_ignored, is_read, paths
from sitelens.cli.parser import command_name
from sitelens.cli.types import split_csv
from sitelens.errors import UsageError
from sitelens.io import check_dir, check_output


def check_path_arg(value: str, option: str) -> None:
    """An output or input path that the file system can take: not empty, no NUL character, not
    too long (caught here as one error instead of an OSError later)."""
    from sitelens.errors import OutputError

    if not value.strip():
        raise UsageError(f"{option} is empty; give a path.")
    if "\x00" in value:
        raise UsageError(f"{option} {value!r} contains a NUL character; give a valid path.")
    try:
        Path(value).exists()
    except OSError as e:
        raise OutputError(f"Cannot use {option} {value!r}: {e.strerror or e}; give another path.") from e


def load_task_checked(spec: str, **kw):
    """:func:`sitelens.tasks.load_task`, with an OS error (e.g. a name too long for a path) raised
    as a :class:`~sitelens.errors.TaskError`."""
    from sitelens.errors import TaskError
    from sitelens.tasks import load_task

    try:
        return load_task(spec, **kw)
    except OSError as e:
        raise TaskError(f"Cannot read the task {spec!r}: {e.strerror or e}; give a built-in "
                        "task name, an FV-layout directory or a JSON file.") from e


def _tasks_dir_specs(tasks_dir: str, abstractive: bool) -> list[str]:
    """The FV-layout task folders under ``--tasks-dir`` (only the abstractive ones with
    ``--abstractive``)."""
    from sitelens.errors import TaskError
    from sitelens.tasks import collection_dirs

    root = Path(tasks_dir)
    if not root.is_dir():
        raise TaskError(f"--tasks-dir {root} is not a directory; give the directory that holds "
                        "one FV-layout folder (TASK/train.json, ...) per task.")
    names = [p.name for p in collection_dirs(root)]
    if abstractive:
        from sitelens.pipelines.bench import FV_EXTRACTIVE

        names = [n for n in names if n not in FV_EXTRACTIVE]
    if not names:
        raise TaskError(f"--tasks-dir {root} holds no task folder (TASK/train.json); give the "
                        "directory that holds one FV-layout folder per task.")
    return [str(root / n) for n in names]


def _expand_collections(specs: list[str]) -> list[str]:
    """Each spec, with a collection directory (task folders inside, no ``train.json`` of its
    own, e.g. ``../shared/datasets/cls``) replaced by its task folders."""
    from sitelens.tasks import collection_dirs

    out = []
    for spec in specs:
        path = Path(spec).expanduser()
        try:
            inner = [] if (path / "train.json").exists() else collection_dirs(path)
        except OSError:  # e.g. a name too long for a path: load_task_checked reports it
            inner = []
        out += [str(p) for p in inner] or [spec]
    return out


def bench_tasks(args) -> list:
    """The tasks of ``sitelens bench``: ``--tasks`` (space- or comma-separated; a collection
    directory stands for all of its task folders) and the folders of ``--tasks-dir``, loaded with
    ``dedupe=True``; the list :func:`validate` kept, if it ran."""
    from sitelens.errors import TaskError

    if getattr(args, "_tasks", None) is not None:  # loaded by validate
        return args._tasks
    if args.abstractive and not args.tasks_dir:
        raise UsageError("--abstractive selects among the tasks of --tasks-dir; give --tasks-dir DIR.")
    specs = _expand_collections([t for arg in args.tasks for t in arg.split(",") if t])  # a/{x,y}
    if args.tasks_dir:
        specs += _tasks_dir_specs(args.tasks_dir, args.abstractive)
    if not specs:
        raise TaskError("Give --tasks NAME[,NAME...] or --tasks-dir DIR.")
    return [load_task_checked(s, seed=args.seed, dedupe=True) for s in specs]


def _check_path_args(args) -> None:
    for option, value, _, _ in paths(args, CONFIGS[command_name(args)]):
        for v in split_csv(value) if option == "--adapters" else [value]:
            check_path_arg(v, option)


def _check_fit_options(args) -> None:
    """The fit options through ``FitConfig``'s own checks (``--lr`` positive and finite, ...)."""
    if hasattr(args, "lr"):
        from sitelens.cli.common import fit_config_from_args

        fit_config_from_args(args)


def _check_models(args) -> None:
    """Every model name loads from local files; a local Hugging Face directory is of a family the
    chosen backend loads (resolved only for a directory: it imports TransformerLens)."""
    from sitelens.models import check_model_available
    from sitelens.models.available import is_local_dir

    models = [args.model] if hasattr(args, "model") else split_csv(args.models)
    for name in models:
        backend = getattr(args, "backend", None)
        if backend is None and is_local_dir(name):
            from sitelens.models import resolve_backend

            backend = resolve_backend(None)
        check_model_available(name, backend)


def inter_tasks(args) -> list:
    """The tasks of ``patch inter``: at least two, and one ``--adapters`` directory per task."""
    from sitelens.errors import AdapterError, TaskError

    names = split_csv(args.tasks)
    if len(names) < 2:
        raise TaskError("patch inter needs at least two tasks: --tasks a,b[,c...].")
    tasks = [load_task_checked(n, seed=args.seed) for n in names]
    dirs = split_csv(args.adapters)
    if dirs and len(dirs) != len(tasks):
        raise AdapterError(f"--adapters has {len(dirs)} directories for {len(tasks)} tasks; "
                           "give one per task, in the order of --tasks.")
    return tasks


def _figures_tasks(args) -> list:
    """The tasks of ``figures``: at least two; ``--intra-tasks`` / ``--effect-tasks`` among them."""
    from sitelens.pipelines.figure_config import FIGURE_TASKS  # no plotly before a model loads

    names = split_csv(args.tasks) or list(FIGURE_TASKS)
    if len(names) < 2:
        raise UsageError("figures needs at least two --tasks (inter-task patching runs over "
                         "pairs): --tasks a,b[,c...].")
    for option in ("intra_tasks", "effect_tasks"):
        extra = [n for n in split_csv(getattr(args, option)) if n not in names]
        if extra:
            raise UsageError(f"--{option.replace('_', '-')} names {extra[0]!r}, which is not "
                             f"in --tasks ({', '.join(names)}); pick a subset of --tasks.")
    return [load_task_checked(n, seed=args.seed) for n in names]


def _load_tasks(args, cmd: str) -> list:
    """Every task the command will use, loaded; the one task of a single-task command is kept as
    ``args._task`` and bench's list as ``args._tasks``."""
    if hasattr(args, "task"):
        args._task = load_task_checked(args.task, seed=args.seed,
                                       dedupe=getattr(args, "dedupe", False))
        return [args._task]
    if cmd == "patch inter":
        return inter_tasks(args)
    if cmd == "bench":
        args._tasks = bench_tasks(args)  # kept: the bench command's bench_tasks returns them
        return args._tasks
    if cmd == "figures":
        return _figures_tasks(args)
    return []  # atlas: its tasks are read with --refit


def _queries_from_train(args, cmd: str) -> bool:
    """Whether the command draws few-shot queries from the train split, whose demonstrations are
    then the other training items: stage 1 of a SITE fit, the corrupted and clean prompts of the
    lenses and of patch effects. Only eval (and run without the site method) prompt the queries
    of ``--split`` valid or test, with every training item free to be a demonstration."""
    if cmd in ("eval", "run"):
        return args.split == "train" or (cmd == "run" and "site" in split_csv(args.methods))
    return True


def _check_n_shots(args, cmd: str, tasks: list) -> None:
    """Every task holds the ``--n-shots`` demonstrations, and the query too when queries come from
    the train split (:func:`_queries_from_train`), where the command reads ``--n-shots`` (eval
    only with the icl method, ...: :func:`sitelens.cli.options.is_read`); for the frontier, also
    :data:`~sitelens.lenses.selectors.MIN_SPLIT` items in each split. The message gives the
    numbers: the pairs a task split here needs (:func:`sitelens.tasks.core.items_needed` of the
    70/10/20 split), or the training items of an FV-layout folder (whose valid and test splits
    :func:`~sitelens.lenses.selectors.check_task_splits` checks), against what it has."""
    from sitelens.errors import TaskError
    from sitelens.tasks.core import items_needed, split_sizes

    n_shots = getattr(args, "n_shots", None)
    if not (n_shots and is_read(args, CONFIGS[cmd], "n_shots")):
        return
    query = int(_queries_from_train(args, cmd))
    least = 1
    if cmd == "frontier":
        from sitelens.lenses.selectors import MIN_SPLIT as least
    need = max(n_shots + query, least)
    shots = f"{n_shots} shot{'s' if n_shots > 1 else ''}"
    demos = f"{n_shots} demonstration{'s' if n_shots > 1 else ''}"
    why = f"{demos} besides each query drawn from train" if query else demos
    for task in tasks:
        split_here = task.source == "builtin" or task.source.endswith(".json")  # 70/10/20 here
        sizes = (len(task.train), len(task.valid), len(task.test))
        if sizes[0] >= need and (not split_here or min(sizes[1:]) >= least):
            continue
        most = sizes[0] - query
        fewer = (f", or use --n-shots {most} or fewer" if most >= max(1, least - query)
                 and min(sizes[1:]) >= least else "")
        if split_here:
            n = items_needed(need, n_valid=least, n_test=least)
            tr, va, te = split_sizes(n)
            each = f"; valid and test {least} each" if least > 1 else ""
            raise TaskError(
                f"--n-shots {n_shots}: task {task.name!r} needs at least {n} pairs for {shots} and "
                f"the splits ({need} training items for {why}{each}; {n} pairs split into train "
                f"{tr}, valid {va}, test {te}); has {sum(sizes)}. Give the task at least {n} "
                f"pairs{fewer}.")
        raise TaskError(
            f"--n-shots {n_shots}: task {task.name!r} needs at least {need} training items for "
            f"{shots} ({why}); its train.json has {sizes[0]}. Give it at least {need} "
            f"training items{fewer}.")


def _check_label_metrics(args, cmd: str) -> None:
    """``sitelens eval --label-metrics`` needs a task with a closed label set
    (:func:`sitelens.eval.labels.wanted_label_set` raises a TaskError for an open-ended one). The
    bench ranks the closed-label tasks among its tasks and leaves the others NaN."""
    if cmd in ("eval", "run") and getattr(args, "label_metrics", False):
        from sitelens.eval.labels import wanted_label_set

        wanted_label_set(args._task, True)


def _check_adapters(args) -> None:
    """Every ``--adapter`` / ``--adapters`` directory loads (a missing, truncated or corrupted
    adapter raises :class:`~sitelens.errors.AdapterError`)."""
    adapter_dirs = [args.adapter] if getattr(args, "adapter", None) else []
    adapter_dirs += split_csv(getattr(args, "adapters", None))
    if adapter_dirs:
        from sitelens.site import SiteAdapter

        for d in adapter_dirs:
            SiteAdapter.load(d)


def check_seeds(args) -> None:
    """The seeds ``--seed`` .. ``--seed + --seeds - 1`` are valid seeds."""
    last = args.seed + args.seeds - 1
    if last > 2**32 - 1:
        raise UsageError(f"--seed {args.seed} with --seeds {args.seeds} runs up to seed {last}, "
                         "beyond 4294967295; use a smaller --seed or fewer --seeds.")


def check_heads_options(args) -> None:
    """``sitelens heads``: every lens asked for runs on the backend of ``--backend``, else the
    default one (:attr:`sitelens.lenses.registry.Lens.backends`: ``dla`` reads ``W_O``, ``W_U``
    and the norms of a ``HookedTransformer``), checked before any load."""
    from sitelens.lenses import parse_lenses
    from sitelens.lenses.registry import REGISTRY
    from sitelens.models import spec

    given_backend = getattr(args, "backend", None)
    backend = spec.resolve_backend(given_backend)
    refused = [n for n in parse_lenses(split_csv(args.lenses)) if backend not in REGISTRY[n].backends]
    if not refused:
        return
    lenses = ", ".join(refused)
    other = next(b for b in REGISTRY[refused[0]].backends)
    why = (f"the model would load with --backend {backend}" if given_backend else
           f"models load on the {backend} backend here (${spec.BACKEND_ENV} or TransformerLens 4)")
    can = other != "hooked" or spec.has_hooked_transformer()
    fix = (f"use --backend {other} (or {spec.BACKEND_ENV}={other}), or drop {lenses} from --lenses"
           if can else f"drop {lenses} from --lenses (TransformerLens 3.x, with --backend hooked, "
           "runs it)")
    reads = " (it reads W_O, W_U and the norms of a HookedTransformer)" if refused == ["dla"] else ""
    raise UsageError(f"--lenses {lenses} runs only on --backend {other}{reads}, and {why}; {fix}.")


def validate(args) -> None:
    """Everything that can be checked before a model is loaded and before anything is written:
    path arguments, fit options, model names, tasks (loaded and kept for the command), enough
    training items for ``--n-shots``, adapter directories, option combinations. Raises a
    :class:`~sitelens.errors.SitelensError`."""
    cmd = command_name(args)
    _check_path_args(args)
    _check_fit_options(args)
    check_device_options(args)
    _check_models(args)
    tasks = _load_tasks(args, cmd)
    _check_n_shots(args, cmd, tasks)
    _check_label_metrics(args, cmd)
    _check_adapters(args)
    if cmd in ("heads", "frontier"):
        check_seeds(args)
        (check_heads_options if cmd == "heads" else check_frontier_options)(args)
    if cmd == "atlas":
        check_atlas_options(args)
    check_executor(args)
    check_ignored(args, CONFIGS[cmd])


def check_executor(args) -> None:
    """``--executor ray...`` needs the ray package (the value itself was checked while parsing)."""
    from sitelens.errors import ExecutorError
    from sitelens.pipelines.executors import ray_available

    if str(getattr(args, "executor", "local")).startswith("ray") and not ray_available():
        raise ExecutorError("--executor ray needs the ray package, which is not installed: pip "
                            "install 'sitelens[ray]' (or pip install ray), or use --executor "
                            "processes:N.")


def check_device_options(args) -> None:
    """``--n-devices`` needs that many CUDA GPUs from ``--device`` on; ``--device-map`` is the bridge
    backend's and goes alone (the parser already checked ``--device`` and the choices)."""
    if all(getattr(args, o, None) is None for o in ("device", "n_devices", "device_map", "backend")):
        return  # nothing to check (and no torch to import for it)
    from sitelens.errors import ModelError
    from sitelens.models import resolve_backend, resolve_device, resolve_n_devices

    try:
        backend = resolve_backend(getattr(args, "backend", None))
    except ModelError as e:
        if getattr(args, "backend", None) != "hooked":  # e.g. an unknown $SITELENS_BACKEND
            raise UsageError(f"--backend: {e}") from None
        import importlib.metadata as md

        from sitelens.models import BACKEND_ENV

        raise UsageError(f"--backend hooked needs HookedTransformer, which TransformerLens "
                         f"{md.version('transformer-lens')} no longer has; use --backend bridge "
                         f"(or {BACKEND_ENV}=bridge), or install 'transformer-lens>=3.9,<4'.") from None

    device = resolve_device(getattr(args, "device", None))
    try:
        resolve_n_devices(getattr(args, "n_devices", None), device)
    except ModelError as e:
        raise UsageError(f"--n-devices: {e}") from None
    if getattr(args, "device_map", None) is None:
        return
    if backend != "bridge":
        raise UsageError("--device-map places the Hugging Face modules of a TransformerBridge; "
                         "with the hooked backend split the model with --n-devices instead (or "
                         "add --backend bridge).")
    if device is not None or (getattr(args, "n_devices", None) or 1) > 1:
        raise UsageError("--device-map says where every module goes: give it without --device "
                         "and --n-devices.")


def check_atlas_options(args) -> None:
    """``sitelens atlas``: the tables exist under ``--data`` (default: those shipped with sitelens),
    or ``--refit`` with a task folder that exists."""
    from pathlib import Path

    from sitelens.atlas.tables import data_dir, models_under, no_tables_message
    from sitelens.errors import OutputError, TaskError

    if args.refit:
        if not Path(args.tasks_dir).is_dir():
            raise TaskError(f"--tasks-dir {args.tasks_dir} is not a directory; pass the FV-layout "
                            "task folders, e.g. --tasks-dir ../shared/datasets/fv.")
        check_seeds(args)
        check_dir(args.cache_dir, option="--cache-dir")
        check_dir(data_dir(args.data), option="--data")
        return
    root = data_dir(args.data)
    wanted = split_csv(args.models) or models_under(root)
    missing = [m for m in wanted if not (root / m / "summary.json").exists()]
    if not wanted or missing:
        raise OutputError(no_tables_message(root, missing))


def check_outputs(args) -> None:
    """Refuse, before any work, every output path of the wrong kind or where a file of another
    kind lies (:func:`sitelens.io.check_output`; the kinds: the options' ``path``); output
    directories must be writable; an earlier adapter or result there needs ``--force``
    (:func:`sitelens.cli.guards.check_no_replace`)."""
    cmd = command_name(args)
    for option, value, kind, _ in paths(args, CONFIGS[cmd]):
        if kind in ("csv", "html"):
            check_output(value, kind, option=option)
        elif kind in ("dir", "adapter"):
            check_dir(value, option=option)
    if cmd == "bench":  # the summary and plot beside the CSV (cmd_bench checks again)
        out = check_output(args.out, "csv")
        check_output(out.with_suffix(".md"), "md", option="--out (its .md summary)")
        check_output(out.with_suffix(".dntp.html"), "html", option="--out (its .dntp.html plot)")
    if cmd == "run":  # its folder, and what an earlier run left there (resumed or refused)
        from sitelens.cli.run import plan_run

        plan_run(args)
    if cmd == "frontier":  # what an earlier frontier left there (resumed or refused)
        from sitelens.cli.frontier import plan_frontier

        plan_frontier(args)
    check_no_replace(args, cmd)


def check_heads(model, ks: list[int], option: str) -> None:
    """Every k of ``ks`` at most the model's number of heads (the parser checked k >= 1)."""
    from sitelens.models import model_name

    L, H = model.cfg.n_layers, model.cfg.n_heads
    bad = [k for k in ks if k > L * H]
    if bad:
        raise UsageError(
            f"{option} {bad[0]} is more than the {L * H} attention heads of "
            f"{model_name(model)} ({L} layers x {H} heads); use k between 1 and {L * H}."
        )
