"""Roofline measurements: what a piece of work computes and moves, and what this machine can do.

:class:`OpCounter` (a ``TorchDispatchMode``) watches every aten op that runs in its block, forward
and backward, and counts from the real shapes:

- ``flops``: the matmuls, 2·m·n·k per product (``mm``, ``addmm``, ``bmm``, ``baddbmm``; a fused
  attention op counts its two products, 4·b·h·q·k·d, and 2.5× that backward). A product with a
  weight operand is ``weight_flops``; one between two activations (QKᵀ and the attention-weighted
  values) is ``attention_flops``. Element-wise ops count no FLOPs (they are bandwidth, not compute);
- ``bytes``: every op that is not a view reads each tensor input and writes each output once
  (eager PyTorch, no fusion, no reuse from a cache): the DRAM traffic of eager execution as an
  upper bound. A gather (an embedding lookup) reads only the rows it returns. Split into
  ``weight_bytes`` (tensors that are parameters of the model, views or copies of them) and the
  rest (activations; ``kv_bytes``: the key/value operands of the attention products, the KV
  cache read);
- ``shapes``: the FLOPs of each matmul shape, to time the machine at the shapes the work uses.

:func:`matmul_gflops` times ``torch.matmul`` at given shapes, :func:`stream_gbs` a STREAM-like
copy and triad; :func:`roofline_row` puts a stage's counts, its measured seconds and the machine's
peaks together (attainable = min(peak, intensity · bandwidth)). :class:`Roofline`, the
experiment: ``python benchmarks/roofline.py`` -> results/roofline.csv, .md (and model_reuse.csv:
seconds per bench cell, model reused or reloaded). Its stages: stage 1, stage 2, stage 2 of the
cell's task and ``--joint-tasks`` fitted jointly (:func:`sitelens.site.fit_alpha_tasks`, their
stage 1 made first and not timed), and each method's evaluation.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from sitelens.pipelines import experiment as xp
from sitelens.pipelines.experiment import Clock, Experiment, Job, main, md_table

aten = torch.ops.aten
# ops that read only the rows they return (an embedding lookup reads a few rows, not the table)
GATHERS = {aten.index.Tensor, aten.embedding.default, aten.index_select.default, aten.gather.default}
G = 1e9
MATMULS = {aten.mm.default: "mm", aten.addmm.default: "mm", aten.bmm.default: "bmm",
           aten.baddbmm.default: "bmm"}


def distinct_bytes(t: torch.Tensor) -> int:
    """The bytes of the distinct elements of ``t`` (a broadcast dimension, stride 0, is read once)."""
    n = math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0) if t.dim() else 1
    return n * t.element_size()


def _matmul_shape(kind: str, args) -> tuple[int, ...]:
    """(batch, m, k, n) of a matmul op's operands (``addmm``/``baddbmm``: the last two)."""
    a, b = (args[1], args[2]) if len(args) >= 3 and isinstance(args[2], torch.Tensor) else args[:2]
    if kind == "mm":
        return (1, a.shape[0], a.shape[1], b.shape[1])
    return (a.shape[0], a.shape[1], a.shape[2], b.shape[2])


class OpCounter(TorchDispatchMode):
    """FLOPs and bytes of the ops run in the block (see the module docstring); ``weights``: the
    model's parameters (and buffers), whose reads count as ``weight_bytes``."""

    def __init__(self, weights=()):
        super().__init__()
        self.flops = self.weight_flops = self.attention_flops = 0
        self.bytes = self.weight_bytes = self.kv_bytes = 0
        self.ops = 0
        self.shapes: dict[tuple, int] = defaultdict(int)  # (batch, m, k, n) -> FLOPs
        self._weight = WeakTensorKeyDictionary()
        for w in weights:
            self._weight[w] = True

    def _is_weight(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self._weight

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        from_weights = bool(ins) and all(self._is_weight(t) for t in ins)
        if from_weights:  # a view or a copy of parameters is a parameter too
            for t in outs:
                self._weight[t] = True
        self.ops += 1  # every aten op, views too: each costs a dispatch
        if func.is_view:
            return out
        out_bytes = sum(distinct_bytes(t) for t in outs)
        if func in GATHERS:  # the source (first input): only the gathered elements are read
            src, rest = ins[0], ins[1:]
            w_in = out_bytes if self._is_weight(src) else 0
            moved = 2 * out_bytes + sum(distinct_bytes(t) for t in rest)
        else:
            w_in = sum(distinct_bytes(t) for t in ins if self._is_weight(t))
            moved = sum(distinct_bytes(t) for t in ins) + out_bytes
        self.bytes += moved
        self.weight_bytes += w_in + (out_bytes if from_weights else 0)
        kind = MATMULS.get(func)
        if kind is not None:
            shape = _matmul_shape(kind, args)
            f = 2 * math.prod(shape)
            self.flops += f
            self.shapes[shape] += f
            operands = args[1:3] if func in (aten.addmm.default, aten.baddbmm.default) else args[:2]
            if any(self._is_weight(t) for t in operands):
                self.weight_flops += f
            else:
                self.attention_flops += f
                self.kv_bytes += distinct_bytes(operands[1])
        elif "scaled_dot_product" in func.__name__:
            q, k = args[0], args[1]  # [batch, heads, pos, d_head]
            f = 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
            f = int(f * 2.5) if "backward" in func.__name__ else f
            self.flops += f
            self.attention_flops += f
            self.kv_bytes += distinct_bytes(args[1]) + distinct_bytes(args[2])
        return out

    def totals(self) -> dict:
        return dict(flops=self.flops, weight_flops=self.weight_flops,
                    attention_flops=self.attention_flops, bytes=self.bytes,
                    weight_bytes=self.weight_bytes, kv_bytes=self.kv_bytes, ops=self.ops)

    @classmethod
    def combined(cls, counters) -> OpCounter:
        """One counter holding the sums of ``counters`` (e.g. the stages of a whole run)."""
        out = cls()
        for c in counters:
            for k in ("flops", "weight_flops", "attention_flops", "bytes", "weight_bytes", "kv_bytes", "ops"):
                setattr(out, k, getattr(out, k) + getattr(c, k))
            for shape, f in c.shapes.items():
                out.shapes[shape] += f
        return out

    def top_shapes(self, share: float = 0.9, most: int = 6) -> list[tuple[tuple, float]]:
        """The matmul shapes that make ``share`` of the counted products' FLOPs (at most ``most``),
        with their share: products grouped by (batch, k, n) (one weight, or one attention shape),
        each group at its FLOP-weighted mean m."""
        groups: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])  # (b, k, n) -> [flops, flops·m]
        for (b, m, k, n), f in self.shapes.items():
            groups[(b, k, n)][0] += f
            groups[(b, k, n)][1] += f * m
        total = sum(g[0] for g in groups.values()) or 1
        out, acc = [], 0
        for (b, k, n), (f, fm) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
            if acc >= share * total or len(out) >= most:
                break
            out.append(((b, max(1, round(fm / f)), k, n), f / total))
            acc += f
        return out


def model_weights(model) -> list[torch.Tensor]:
    """The parameters and buffers of ``model`` (what :class:`OpCounter` counts as weights)."""
    return [*model.parameters(), *model.buffers()]


def _best_seconds(fn, min_time: float = 0.3, reps: int = 3) -> float:
    """The fastest of ``reps`` timings of ``fn`` (each repeated until ``min_time`` passes)."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if time.perf_counter() - t0 >= min_time:
                break
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def matmul_gflops(shape: tuple[int, ...], dtype=torch.float32) -> float:
    """GFLOP/s of ``torch.matmul`` on random operands of ``shape`` = (batch, m, k, n) (batch 1:
    a plain 2-D product), at the current torch thread count."""
    b, m, k, n = shape
    x = torch.randn(*(() if b == 1 else (b,)), m, k, dtype=dtype)
    y = torch.randn(*(() if b == 1 else (b,)), k, n, dtype=dtype)
    return 2 * b * m * k * n / _best_seconds(lambda: torch.matmul(x, y)) / 1e9


def stream_gbs(n: int = 1 << 26) -> dict[str, float]:
    """Memory bandwidth (GB/s) of a copy (a = b: 2 arrays moved) and a triad (a = b + s·c: 3) on
    float32 arrays of ``n`` elements (256 MiB each by default, far beyond the caches)."""
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    nb = n * 4
    copy = _best_seconds(lambda: a.copy_(b), min_time=0.5)
    triad = _best_seconds(lambda: torch.add(b, c, alpha=3.0, out=a), min_time=0.5)
    return {"copy": 2 * nb / copy / 1e9, "triad": 3 * nb / triad / 1e9}


def op_seconds(shape=(8, 576)) -> float:
    """Seconds of one small eager op (``torch.add`` on ``shape`` float32): the dispatch cost that
    a pass of many small ops pays per op, whatever its FLOPs and bytes."""
    x, y = torch.rand(shape), torch.rand(shape)
    return _best_seconds(lambda: [torch.add(x, y) for _ in range(100)], min_time=0.2) / 100


def roofline_row(totals: dict, seconds: float, peak_gflops: float, bandwidth_gbs: float,
                 op_s: float = 0.0) -> dict:
    """A stage's intensity (FLOP/byte), attainable and achieved GFLOP/s, % of attainable, the
    bound it sits under (``compute`` when intensity · bandwidth ≥ peak, else ``memory``) and its
    floors in seconds: compute (FLOPs / peak), memory (bytes / bandwidth) and dispatch (aten ops ·
    ``op_s``, the cost of one small op)."""
    ai = totals["flops"] / max(1, totals["bytes"])
    attainable = min(peak_gflops, ai * bandwidth_gbs)
    achieved = totals["flops"] / seconds / 1e9
    return dict(intensity=round(ai, 2), attainable_gflops=round(attainable, 1),
                achieved_gflops=round(achieved, 1), pct_attainable=round(100 * achieved / attainable, 1),
                bound="compute" if ai * bandwidth_gbs >= peak_gflops else "memory",
                compute_floor_s=round(totals["flops"] / peak_gflops / 1e9, 2),
                memory_floor_s=round(totals["bytes"] / bandwidth_gbs / 1e9, 2),
                ops=totals["ops"], dispatch_floor_s=round(totals["ops"] * op_s, 2))


def derive(df: pd.DataFrame) -> pd.DataFrame:
    """The roofline columns of each stage row from its counts and the machine (:func:`roofline_row`,
    the compute roof = the 2048³ matmul rate ``square_gflops``): the CSV's derived columns are
    always recomputed from its raw ones, so ``--report`` and a run agree."""
    out = []
    for r in df.to_dict("records"):
        tot = {"flops": r["gflop"] * G, "bytes": r["gbytes"] * G, "ops": int(r["ops"])}
        out.append({**r, "peak_gflops": r["square_gflops"], **roofline_row(
            tot, r["seconds"], r["square_gflops"], r["bandwidth_gbs"], r["op_us"] / 1e6)})
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------------------------
# the benchmark


class Roofline(Experiment):
    """The roofline benchmark (``benchmarks/roofline.py``): one cell per model and task."""

    name, title, key, replace, threads = "roofline", "Roofline of SITE's stages", None, True, 2
    models, tasks = ("smollm2-135m-instruct", "gemma-3-270m"), ("country-capital",)
    columns = ["model", "task", "stage", "seconds", "cpu_seconds", "gflop", "weight_gflop",
               "attention_gflop", "gbytes", "weight_gbytes", "kv_gbytes", "intensity", "peak_gflops",
               "shape_gflops", "bandwidth_gbs", "attainable_gflops", "achieved_gflops", "pct_attainable",
               "bound",
               "compute_floor_s", "memory_floor_s", "ops", "dispatch_floor_s", "op_us", "top_shapes",
               "square_gflops", "copy_gbs", "load_average", "threads", "date"]

    def add_arguments(self, parser) -> None:
        parser.add_argument("--n-ctx", type=int, default=None, help="context length (default: load_model's)")
        parser.add_argument("--joint-tasks", default="antonym,english-french,present-past",
                            help="FV tasks fitted with the cell's task in the joint stage-2 row "
                                 "(blank: no such row)")
        parser.add_argument("--reuse-cells", type=int, default=8,
                            help="test items per cell of the model-reuse measurement (0: skip it)")

    def cells(self, args):
        reuse = [Job("model reuse", f"model reuse ({args.models[0]})", {"model": args.models[0]})]
        stages = [Job(f"{m}/{t}", f"{m}/{t}", {"model": m, "task": t})
                  for m in args.models for t in args.tasks]
        return stages + (reuse if args.reuse_cells else [])

    def reuse(self, job: Job) -> list[dict]:
        """Seconds per ``sitelens bench`` cell on one model, in process: the model reused across
        the cells (as run_bench runs them) and loaded again for each cell (``run_cell`` wrapped for
        this measurement only); ``model_reuse.csv``. Tasks country-capital and antonym, methods
        zero-shot and icl, 2 shots, ``--reuse-cells`` test items (the whole run's wall, one
        driver load for the fingerprint included, over its 4 cells)."""
        import tempfile

        from sitelens.models import load_model
        from sitelens.pipelines import bench
        from sitelens.pipelines.executors import preloaded

        real = bench.run_cell

        def reloading(j):  # a worker that kept no model: it loads one for every cell
            load = j.config.load
            with preloaded(j.model, j.n_ctx, load_model(j.model, n_ctx=j.n_ctx, spec=load), load):
                return real(j)

        tasks = [self.args.data_root / "fv" / t for t in ("country-capital", "antonym")]
        rows = []
        for mode in ("warm-up", "reused", "reloaded", "reused", "reloaded"):  # warm-up: not recorded
            la = xp.load_avg()
            bench.run_cell = reloading if mode == "reloaded" else real
            try:
                with tempfile.TemporaryDirectory() as d, Clock() as c:
                    bench.run_bench([job["model"]], tasks, ["zero-shot", "icl"], f"{d}/b.csv",
                                    limit=self.args.reuse_cells, n_shots=2)
            finally:
                bench.run_cell = real
            row = dict(model=job["model"], mode=mode, cells=4, wall_s=round(c.wall, 2),
                       s_per_cell=round(c.wall / 4, 2), load_average=la, date=xp.now())
            rows += [] if mode == "warm-up" else [row]
        store = self.store("model_reuse", list(rows[0]), key=None)
        store.path.unlink(missing_ok=True)
        store.append(rows)
        return []

    def stages(self, model, task, others):
        """(name, thunk) of each stage, in order; later thunks use what earlier ones made.
        ``others``: (task, embedding) of the tasks that join the cell's task in the joint stage 2
        (its rate against the one-task stage 2's is what fitting a sweep jointly buys)."""
        from sitelens.eval.evaluation import evaluate
        from sitelens.site import fit_alpha_tasks, fit_site, task_embedding

        made = {}

        def stage1():
            made["emb"] = task_embedding(model, task)

        def stage2():
            made["adapter"] = fit_site(model, task, embedding=made["emb"])

        def joint():
            fit_alpha_tasks(model, [task, *(t for t, _ in others)], [made["emb"], *(e for _, e in others)])

        def method(m):
            return lambda: evaluate(model, task, methods=[m], adapter=made["adapter"])
        return [("stage 1", stage1), ("stage 2", stage2),
                *([(f"stage 2, {1 + len(others)} tasks jointly", joint)] if others else []),
                *((f"eval {m}", method(m)) for m in ("zero-shot", "icl", "site"))]

    def run(self, job: Job) -> list[dict]:
        from sitelens.models import load_model
        from sitelens.tasks import load_task

        if job.key == "model reuse":
            return self.reuse(job)
        from sitelens.site import task_embedding

        model = load_model(job["model"], n_ctx=self.args.n_ctx)
        task = load_task(self.args.data_root / "fv" / job["task"])
        others = [load_task(self.args.data_root / "fv" / n) for n in xp.split_list(self.args.joint_tasks)]
        others = [(t, task_embedding(model, t)) for t in others if t.name != task.name]  # not timed
        machine = self.machine()
        timed = {}
        la = xp.load_avg()
        for name, thunk in self.stages(model, task, others):  # timed, uninstrumented
            with Clock() as c:
                thunk()
            timed[name] = (c.wall, c.cpu)
        rows, evals = [], []
        for name, thunk in self.stages(model, task, others):  # counted
            with OpCounter(model_weights(model)) as counter:
                thunk()
            rows.append(self.row(job, name, counter, timed[name], machine))
            evals += [counter] if name.startswith("eval") else []
        wall = tuple(sum(timed[n][i] for n in timed if n.startswith("eval")) for i in (0, 1))
        rows.append(self.row(job, "eval (all)", OpCounter.combined(evals), wall, machine))
        return [{**r, "load_average": f"{la:.2f}–{xp.load_avg():.2f}"} for r in rows]

    def machine(self) -> dict:
        square = matmul_gflops((1, 2048, 2048, 2048))
        return {"square": square, **stream_gbs(), "op_s": op_seconds(), "shape_rates": {}}

    def peak_at(self, shapes, machine) -> float:
        """The stage's matmul rate: its top shapes timed, weighted by their FLOPs (harmonic mean)."""
        rates = machine["shape_rates"]
        for s, _ in shapes:
            if s not in rates:
                rates[s] = matmul_gflops(s)
        w = sum(f for _, f in shapes)
        return w / sum(f / rates[s] for s, f in shapes)

    def row(self, job, stage, counter, timed, machine) -> dict:
        """A stage's counts, seconds and the machine; the roofline columns by :func:`derive`."""
        tot, shapes = counter.totals(), counter.top_shapes()
        top = "; ".join(f"{'x'.join(map(str, s))} {100 * f:.0f}%" for s, f in shapes)
        raw = dict(model=job["model"], task=job["task"], stage=stage,
                   seconds=round(timed[0], 2), cpu_seconds=round(timed[1], 2),
                   gflop=round(tot["flops"] / G, 2), weight_gflop=round(tot["weight_flops"] / G, 2),
                   attention_gflop=round(tot["attention_flops"] / G, 3), gbytes=round(tot["bytes"] / G, 2),
                   weight_gbytes=round(tot["weight_bytes"] / G, 2), kv_gbytes=round(tot["kv_bytes"] / G, 3),
                   ops=tot["ops"], shape_gflops=round(self.peak_at(shapes, machine), 1), top_shapes=top,
                   square_gflops=round(machine["square"], 1), bandwidth_gbs=round(machine["triad"], 1),
                   copy_gbs=round(machine["copy"], 1), op_us=round(1e6 * machine["op_s"], 2),
                   threads=torch.get_num_threads(), date=xp.now())
        return derive(pd.DataFrame([raw])).iloc[0].to_dict()

    def report(self, df: pd.DataFrame) -> str:
        df = derive(df)
        cols = ["model", "stage", "seconds", "gflop", "gbytes", "intensity", "peak_gflops",
                "attainable_gflops", "achieved_gflops", "pct_attainable", "bound"]
        floors = ["model", "stage", "seconds", "compute_floor_s", "memory_floor_s", "ops",
                  "dispatch_floor_s"]
        split = ["model", "stage", "cpu_seconds", "shape_gflops", "weight_gflop", "attention_gflop",
                 "weight_gbytes", "kv_gbytes", "top_shapes"]
        m = df.iloc[0]
        return (f"Machine: {xp.host_name()}, {m.threads} threads; float32 matmul 2048³ {m.square_gflops} "
                f"GFLOP/s; triad {m.bandwidth_gbs} GB/s, copy {m.copy_gbs} GB/s; load average (1 min) "
                f"{', '.join(df.load_average.unique())}; {m.date}.\n\n{md_table(df[cols])}\n\n"
                "`gflop`: matmul FLOPs (2·m·n·k per product, attention's included) counted op by op from "
                "the real shapes; `gbytes`: every non-view op's inputs read and outputs written once (eager "
                "traffic, an upper bound); `peak_gflops`: the machine's compute roof, torch.matmul at 2048³; "
                "attainable = min(peak, intensity · triad bandwidth); `shape_gflops`: torch.matmul timed at "
                "the stage's top shapes (grouped at their FLOP-weighted mean m, so an estimate: a stage "
                "can beat it), the rate its shapes allow.\n\nFloors (seconds "
                "the stage could not go below): compute = FLOPs / peak, memory = bytes / triad, dispatch = "
                f"aten ops (views included) x {m.op_us} µs, the cost of one small eager op:\n\n"
                f"{md_table(df[floors])}\n\nSplits and shapes "
                f"(batch x m x k x n, share of FLOPs):\n\n{md_table(df[split])}\n{self.reuse_report()}")

    def reuse_report(self) -> str:
        path = self.out / "model_reuse.csv"
        if not path.exists():
            return ""
        df = pd.read_csv(path)
        med = df.groupby("mode", sort=False).s_per_cell.median()
        return ("\n## One model per worker\n\nSeconds per `sitelens bench` cell (in process, "
                f"{df.model.iloc[0]}, 4 cells a run: country-capital and antonym x zero-shot and icl, "
                "2 shots, `--reuse-cells` items; wall of the whole run over its cells, `model_reuse.csv`): "
                f"the model reused across cells {med['reused']:.2f} s, loaded again for every cell "
                f"{med['reloaded']:.2f} s (medians).\n\n{md_table(df)}\n")


if __name__ == "__main__":
    raise SystemExit(main(Roofline()))
