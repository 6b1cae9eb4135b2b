"""In async mode, the engine's mismatch apart from the policy's drift.

A stale sample was drawn by version ``v - s`` while the trainer holds ``v``: the gap between the
sampler's log-probs and the trainer's is then the engine's own error (kernels, precision, a broken
sync) plus what ``s`` updates moved the policy. One figure for both cannot say which grew. So the
trainer keeps its own trainable weights at every version still inside the staleness bound
(`BehaviourWeights`), scores each stale row under the version that sampled it, and reports two
figures that each mean one thing (`split_mismatch`):

* ``mismatch/*``: sampler vs trainer *at the sampler's version* (the engine's error alone; what
  ``rollout.precision_fallback`` and the watchdog read), over every scored row;
* ``staleness/drift_*``: trainer now vs trainer at the sampler's version (the policy's own drift),
  over the stale rows (0 on a step without any).

Same metric forms in both (`posttrain.algos.correction.mismatch_metrics`). The importance weights
are untouched: they correct for the whole gap, as they must. Rows whose version the trainer no
longer holds (sampled before a resume) are left out of both. A multi-turn episode carries one
version, its oldest turn's: turns a newer version sampled count that drift as mismatch. Costs one forward without autograd
of the stale rows, per stale version, and ``max_staleness`` copies of the trainable weights, kept in
host memory (``asynchrony.mismatch_by_version=false`` turns it off).
"""

from __future__ import annotations

import contextlib

import torch

from posttrain.algos.correction import mismatch_metrics
from posttrain.core.fsdp import reshard
from posttrain.rl.batch import RLBatch
from posttrain.rl.policy import placeholder_rows

DRIFT_PREFIX = "staleness/drift_"


class BehaviourWeights:
    """The policy's trainable weights at each version still inside the staleness bound."""

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self.saved: dict[int, list[torch.Tensor]] = {}

    def record(self, version: int, model) -> None:
        """Keep ``model``'s trainable weights as ``version`` (the weights the engine was last sent),
        and forget the versions no admitted sample can come from any more."""
        if version not in self.saved:
            # host memory: K copies of a full model's weights would not fit beside it on an accelerator
            self.saved[version] = [p.detach().to("cpu", copy=True) for p in _trainable(model)]
        for old in [v for v in self.saved if v < version - self.max_staleness]:
            del self.saved[old]

    @contextlib.contextmanager
    def holding(self, version: int, model):
        """``model`` with the weights of ``version`` inside the block, its own again after it."""
        params = _trainable(model)
        now = [p.detach().to("cpu", copy=True) for p in params]
        with torch.no_grad():
            for p, then in zip(params, self.saved[version]):
                p.copy_(then)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, mine in zip(params, now):
                    p.copy_(mine)


def _trainable(model) -> list[torch.Tensor]:
    """The trainable weights this rank holds: its shards under FSDP (a DTensor's local part, whose
    storage is the parameter's); frozen ones (LoRA's base) never change."""
    reshard(model)  # a forward without backward may have left the root gathered
    return [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters() if p.requires_grad]


def score_stale_rows(policy, batch: RLBatch, version: int, weights: BehaviourWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_BT, known_B)``: the trainer's log-probs of each scored stale row under the version
    that sampled it (0 elsewhere), and which rows that covers. Runs before `Policy.score`, whose kept
    forward must not see its weights change. Every rank runs the same versions in step (sharded
    forwards), each on its own rows or a placeholder."""
    logp = torch.zeros(batch.mask_BT.shape)
    scored = batch.score_weight_B is None or batch.score_weight_B > 0
    stale = (batch.policy_version_B != version) & torch.as_tensor(scored)
    mine = {int(v) for v in batch.policy_version_B[stale].tolist() if int(v) in weights.saved}
    every = sorted(set().union(*policy.world.all_gather_object(mine))) if policy.world.distributed else sorted(mine)
    known = torch.zeros(len(batch), dtype=torch.bool)
    policy.model.eval()
    for v in every:
        rows = torch.nonzero(stale & (batch.policy_version_B == v)).flatten()
        with weights.holding(v, policy.model), torch.no_grad():
            for idx in policy.plan(batch, rows):
                mb = batch.select(idx if len(idx) else placeholder_rows(batch))
                out = policy._forward(policy.model, mb)[0]
                if len(idx):
                    logp[idx, : out.shape[1]] = out.float()
        reshard(policy.model)
        known[rows] = True
    return logp, known


def split_mismatch(batch: RLBatch, version: int, stale_logp_BT: torch.Tensor, known_B: torch.Tensor) -> dict:
    """``mismatch/*`` of the sampler against the trainer at the sampler's version, and
    ``staleness/drift_*`` of the trainer now against itself then (module docstring)."""
    fresh_B = batch.policy_version_B == version
    at_sampler_BT = torch.where(known_B[:, None], stale_logp_BT, batch.old_logp_BT)
    mask = batch.scored_mask_BT & (fresh_B | known_B)[:, None]
    drift = mismatch_metrics(batch.old_logp_BT, at_sampler_BT, mask & known_B[:, None])
    return ({k: float(v) for k, v in mismatch_metrics(at_sampler_BT, batch.sampler_logp_BT, mask).items()}
            | {DRIFT_PREFIX + k.split("/", 1)[1]: float(v) for k, v in drift.items()})
