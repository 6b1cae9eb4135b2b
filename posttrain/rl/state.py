"""`RLRun`: what one RL run holds, below the modules that drive it (the loop, PPO, distillation,
async), so that none of them imports another for the type."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from posttrain.core.dist import World
from posttrain.rl.config import RLConfig
from posttrain.rl.curriculum import CurriculumSource
from posttrain.rl.policy import Policy
from posttrain.rollout import RolloutEngine


@dataclasses.dataclass
class RLRun:
    """Everything one RL run holds; built by ``setup``."""

    cfg: RLConfig
    tokenizer: object
    policy: Policy
    engine: RolloutEngine | None
    source: CurriculumSource
    train_prompts: dict[int, list[int]]
    eval_examples: list[dict]
    eval_prompts: list[list[int]]
    verifier: object
    loss_fn: object
    run_dir: Path
    world: World = dataclasses.field(default_factory=World)
    start_step: int = 0
    version: int = 0  # the policy version the engine holds (every rank keeps count; rank 0 has the engine)
    ppo: object = None  # algorithm=ppo: critic and reward model (posttrain.rl.ppo.PPOState)
    env: object = None  # env.name set: episodes in a multi-turn environment (posttrain.envs.session.EnvSession)
    colocated: bool = False  # under torchrun every rank has an engine and generates its own groups
    precision: object = None  # rollout.precision_fallback on: the engine's dtype (posttrain.rl.precision.PrecisionFallback)
    behaviour: object = None  # async with staleness: the trainer's weights per version (posttrain.rl.drift.BehaviourWeights)
