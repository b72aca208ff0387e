"""The greedy-selection speed benchmark of the frontier (``python benchmarks/greedy_speed.py``):
one greedy step, every candidate head scored in batched rows on one prefix cache
(:func:`sitelens.lenses.selectors.greedy_step_scores`; on a HookedTransformer each candidate's rows
start at its own layer, :mod:`sitelens.lenses.greedy_rows`) vs one full patched forward pass per
candidate. Passes are counted by a forward pre-hook; the valid prefix cache (built once per greedy
run) is built and both paths are warmed up before the clock starts. Both sides must pick the same
head (``same_pick``; the max |Δ prob| between them is reported). ``--tiny``: a smoke test on a tiny
random model."""

from __future__ import annotations

import torch
from lib.study import add_model_task_arguments, study_model

from sitelens.pipelines.experiment import Experiment, Job, load_avg, main, md_table


class GreedySpeed(Experiment):
    name, title = "greedy_speed", "Greedy selection: batched candidate scoring vs one pass per candidate"
    columns = ("model task n_valid n_chosen n_candidates threads load_avg_1min load_avg_1min_after mode "
               "forward_passes seconds speedup same_pick max_abs_prob_diff").split()
    key, replace, threads = None, True, None

    def add_arguments(self, p) -> None:
        add_model_task_arguments(p)
        p.add_argument("--n-valid", type=int, default=16)
        p.add_argument("--n-chosen", type=int, default=2, help="heads already chosen (the step's set)")

    def cells(self, args):
        return [Job(f"{args.model}/{args.task}")]

    def run(self, job: Job) -> list[dict]:
        from sitelens.lenses import selectors as S
        from sitelens.models import model_name
        from sitelens.patching import patched_last_logits
        from sitelens.patching.engine import ForwardPassCounter
        from sitelens.site import SiteAdapter, task_embedding
        from sitelens.tasks import DEFAULT_TEMPLATE, answer_token_ids, load_task, zero_shot_prompts

        a = self.args
        model = study_model(a)
        task, load0 = load_task(a.task), load_avg()
        emb = task_embedding(model, task, n_prompts=4 if a.tiny else 20, n_shots=2 if a.tiny else 10)
        L, H = model.cfg.n_layers, model.cfg.n_heads
        ad = SiteAdapter(torch.zeros(L, H), emb, {"template": DEFAULT_TEMPLATE.to_dict()})
        ctx = S.SelectionContext(model, task, ad, S.FrontierConfig(n_valid=a.n_valid), seed=0)
        chosen, _ = list(range(a.n_chosen)), ctx.valid  # the prefix cache: once per greedy run
        cands = [j for j in range(L * H) if j not in chosen]
        prompts = zero_shot_prompts(model, task.valid[: a.n_valid])
        ans = torch.tensor(answer_token_ids(model, [ex.output for ex in task.valid[: a.n_valid]]))
        S.greedy_step_scores(ctx, chosen, cands[:2])  # warm-up (first-call allocations), untimed
        patched_last_logits(model, prompts, use_cache=False)
        with ForwardPassCounter(model) as fb:
            acc_b, prob_b = S.greedy_step_scores(ctx, chosen, cands)
        acc_s, prob_s = torch.zeros(len(cands)), torch.zeros(len(cands))
        with ForwardPassCounter(model) as fs:
            for i, j in enumerate(cands):
                w = torch.zeros(L * H).index_fill(0, torch.tensor(chosen + [j]), 1.0).reshape(L, H)
                logits = patched_last_logits(model, prompts, w, emb, use_cache=False)  # [n, d_vocab]
                acc_s[i] = (logits.argmax(-1) == ans).float().mean()
                prob_s[i] = torch.softmax(logits, -1).gather(1, ans[:, None]).mean()
        same = S.best_candidate(acc_b, prob_b) == S.best_candidate(acc_s, prob_s)
        common = dict(model=model_name(model), task=task.name, n_valid=len(prompts), n_chosen=a.n_chosen,
                      n_candidates=len(cands), threads=torch.get_num_threads(), load_avg_1min=load0,
                      load_avg_1min_after=load_avg(), same_pick=same,
                      max_abs_prob_diff=float((prob_b - prob_s).abs().max()))
        return [{**common, "mode": m, "forward_passes": c.count, "seconds": round(c.seconds, 3),
                 "speedup": round(fs.seconds / c.seconds, 1)} for m, c in (("serial", fs), ("batched", fb))]

    def report(self, df) -> str:
        c, b = df.iloc[0], df.iloc[-1]
        return (f"{'**Smoke test (--tiny): not a benchmark.**  ' * self.args.tiny}`{c.model}`, `{c.task}`: "
                f"{c.n_candidates} candidates × {c.n_valid} valid prompts, {c.n_chosen} heads chosen; "
                f"{c.threads} thread(s); 1-minute load average {c.load_avg_1min:.2f} before, "
                f"{c.load_avg_1min_after:.2f} after (a moving average: it lags the machine by about a "
                f"minute). Forward passes: calls of the model plus batched waves up the blocks.\n\n"
                f"{md_table(df)}\n\n"
                f"Batched is **{b.speedup}×** faster; same pick: {c.same_pick}.\n")


if __name__ == "__main__":
    raise SystemExit(main(GreedySpeed()))
