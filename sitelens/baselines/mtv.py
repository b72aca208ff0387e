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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sitelens.baselines.base import FitParts, Method
from sitelens.site import FitConfig, task_embedding
from sitelens.site.injection import HeadMix
from sitelens.site.training import FitData, RunConfig, run_training, training_batches
from sitelens.tasks import Task, Template


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

    def _fit(self, model, task: Task, seed: int, template: Template, progress: bool) -> FitParts:
        cfg = model.cfg
        L, H, S, dev = cfg.n_layers, cfg.n_heads, self.n_samples, cfg.device
        mean_z = task_embedding(
            model, task, n_prompts=self.n_prompts, n_shots=self.n_shots, seed=seed,
            template=template,
        ).to(dev)  # [n_layers, n_heads, d_head]
        plan = FitConfig(n_examples=self.steps * self.batch_size, batch_size=self.batch_size,
                         seed=seed)
        batches = list(training_batches(list(range(len(task.train))), plan))  # [steps][batch_size]
        data = FitData.build(model, task, batches, n_valid=self.n_valid, template=template)
        gen = torch.Generator().manual_seed(seed)
        theta = torch.full((L, H), float(self.init), requires_grad=True)  # [n_layers, n_heads]

        def hard() -> Tensor:
            return (torch.sigmoid(theta.detach()) > 0.5).float()  # [n_layers, n_heads]

        def valid_loss() -> float:
            return data.valid.score(model, HeadMix(hard().to(dev), mean_z).hooks(model))[1]

        def objective(batch: list[int], conds: range) -> tuple[Tensor, float]:
            """REINFORCE (one condition): ``S`` masks scored on the batch (reward = −first-token
            CE)."""
            p = torch.sigmoid(theta)  # [n_layers, n_heads]
            masks = torch.bernoulli(p.detach().expand(S, L, H), generator=gen)  # [S, L, H]
            b = data.rows(batch)  # [B]
            rep = b.repeat(S)  # [S*B], sample-major
            weights = masks.repeat_interleave(len(b), dim=0).to(dev)  # [S*B, L, H]
            with torch.no_grad():
                sub = data.train.select(rep)
                logits = sub.logits(model, HeadMix(weights, mean_z).hooks(model))  # [S*B, V]
                ce = F.cross_entropy(logits, sub.answers.to(logits.device),
                                     reduction="none").view(S, len(b))
                reward = -ce.mean(1).cpu()  # [S]
            logp = (masks * torch.log(p + 1e-8) + (1 - masks) * torch.log(1 - p + 1e-8)).sum(
                dim=(1, 2)
            )  # [S]
            adv = reward - reward.mean()  # [S]
            return -(adv * logp).mean(), float(reward.mean())

        (run,) = run_training(
            [theta], batches, objective, valid_loss, snapshot=lambda r: hard(),
            config=RunConfig(lr=self.lr, seed=seed, eval_every=self.eval_every,
                             metric="mean_reward", what=self.name, task=task.name,
                             progress=progress),
        )
        mask = run.kept
        return FitParts(
            intervention=HeadMix(weights=mask.to(dev), targets=mean_z),
            n_params=L * H,
            state={"mask": mask, "theta": theta.detach(), "mean_z": mean_z,
                   "history": run.history, "best_step": run.best_step},
            meta={"stored_numbers": L * H * cfg.d_head, "n_selected": int(mask.sum())},
        )
