"""Multimodal task vectors (Huang et al.), text-only: mean head activations, with a binary head
selection learned by REINFORCE.

1. mean z: ``hook_z`` at the last token averaged over few-shot prompts (SITE's task embedding).
2. a Bernoulli policy ``p = sigmoid(θ)`` over heads ``[n_layers, n_heads]``; each step samples
   ``n_samples`` masks, scores each on a training batch with the selected heads' ``z`` replaced by
   the mean at the last token (reward = −cross-entropy of the first answer token), and takes an
   Adam step on ``−Σ (r − mean r) · log π(mask)``.
3. the deterministic mask ``p > 0.5`` with the best validation loss (checked every
   ``eval_every`` steps) is kept.

Intervention: ``HeadMix(mask, mean_z)`` (the selected heads replaced at the last prompt token,
prefill only). Trainable parameters: ``n_layers × n_heads`` (θ).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from sitelens.baselines.base import Fitted, LastTokenSet, Method, valid_items
from sitelens.injection import HeadMix
from sitelens.models import select_cache
from sitelens.site import FitConfig, task_embedding, training_batches
from sitelens.tasks import DEFAULT_TEMPLATE, Task, Template


@dataclass(kw_only=True)
class MTV(Method):
    name: str = "mtv"
    n_prompts: int = 50
    n_shots: int = 10
    steps: int = 40  # ≈ 40 s on SmolLM2-135M, one CPU thread
    batch_size: int = 8
    n_samples: int = 4  # masks sampled per step
    lr: float = 0.1
    init: float = 0.0  # θ at the start (p = 0.5)
    eval_every: int = 10
    n_valid: int = 64

    def fit(
        self,
        model,
        task: Task,
        *,
        seed: int = 0,
        template: Template = DEFAULT_TEMPLATE,
        progress: bool = False,
    ) -> Fitted:
        t0 = time.perf_counter()
        cfg = model.cfg
        L, H, dev = cfg.n_layers, cfg.n_heads, cfg.device
        mean_z = task_embedding(
            model, task, n_prompts=self.n_prompts, n_shots=self.n_shots, seed=seed,
            template=template,
        ).to(dev)  # [n_layers, n_heads, d_head]
        fc = FitConfig(n_examples=self.steps * self.batch_size, batch_size=self.batch_size,
                       seed=seed)
        batches = list(training_batches(list(range(len(task.train))), fc))  # [steps][batch_size]
        used = sorted({i for b in batches for i in b})
        row = {i: r for r, i in enumerate(used)}
        train = LastTokenSet.build(model, [task.train[i] for i in used], template)
        valid = LastTokenSet.build(model, valid_items(task, self.n_valid), template)

        gen = torch.Generator().manual_seed(seed)
        theta = torch.full((L, H), float(self.init), requires_grad=True)  # [n_layers, n_heads]
        opt = torch.optim.Adam([theta], lr=self.lr)

        def valid_loss(mask: torch.Tensor) -> float:
            return valid.score(model, HeadMix(mask.to(dev), mean_z).hooks(model))[1]

        def hard(th: torch.Tensor) -> torch.Tensor:
            return (torch.sigmoid(th.detach()) > 0.5).float()  # [n_layers, n_heads]

        best = (valid_loss(hard(theta)), hard(theta), 0)
        history = [{"step": 0, "mean_reward": float("nan"), "valid_loss": best[0]}]
        S = self.n_samples
        bar = tqdm(total=len(batches), desc=f"fit mtv [{task.name}]", disable=not progress,
                   leave=False)
        for step, batch in enumerate(batches, start=1):
            p = torch.sigmoid(theta)  # [n_layers, n_heads]
            masks = torch.bernoulli(p.detach().expand(S, L, H), generator=gen)  # [S, L, H]
            rows = torch.tensor([row[i] for i in batch])  # [B]
            B = len(rows)
            rep = rows.repeat(S)  # [S*B], sample-major
            weights = masks.repeat_interleave(B, dim=0).to(dev)  # [S*B, L, H]
            with torch.no_grad():
                sub = LastTokenSet(select_cache(train.cache, rep), train.last[rep],
                                   train.answers[rep])
                logits = sub.logits(model, HeadMix(weights, mean_z).hooks(model))  # [S*B, V]
                ce = F.cross_entropy(logits, sub.answers, reduction="none").view(S, B)
                reward = -ce.mean(1).cpu()  # [S]
            logp = (masks * torch.log(p + 1e-8) + (1 - masks) * torch.log(1 - p + 1e-8)).sum(
                dim=(1, 2)
            )  # [S]
            adv = reward - reward.mean()  # [S]
            loss = -(adv * logp).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            bar.update(1)
            rec = {"step": step, "mean_reward": float(reward.mean()), "valid_loss": float("nan")}
            if step % self.eval_every == 0 or step == len(batches):
                vl = valid_loss(hard(theta))
                rec["valid_loss"] = vl
                if vl < best[0]:
                    best = (vl, hard(theta), step)
            history.append(rec)
        bar.close()
        mask = best[1]
        return Fitted(
            self.name,
            intervention=HeadMix(weights=mask.to(dev), targets=mean_z),
            n_params=L * H,
            fit_seconds=time.perf_counter() - t0,
            state={"mask": mask, "theta": theta.detach(), "mean_z": mean_z,
                   "history": history, "best_step": best[2]},
            meta={"stored_numbers": L * H * cfg.d_head, "n_selected": int(mask.sum())},
        )
