"""`posttrain rl`: the synchronous RL controller. One step, top to bottom:

    prompts ─▶ engine.generate(n=G) ─▶ verifier ─▶ Outcome per sample
            ─▶ trainer log-probs (old policy, reference) ─▶ advantages ─▶ IS weights vs sampler
            ─▶ policy.train_step(batch, loss_fn) ─▶ engine.load_weights(version+1, checksum)

The rollout engine holds its own copy of the weights (optionally in another dtype) and only
receives new ones through ``load_weights`` with a verified checksum. Samples whose outcome is
INFRA_FAIL or TASK_FAIL are masked from the gradient and counted; groups whose rewards are all
equal get zero advantage (and, with dynamic sampling, are replaced by fresh prompts).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from posttrain.algos import ADVANTAGES
from posttrain.algos.advantages import zero_variance
from posttrain.config import save_config, to_dict
from posttrain.models.hf import check_model_path, disable_dropout, load_model, load_tokenizer, quiet_transformers
from posttrain.outcome import Outcome
from posttrain.rl.batch import RLBatch, group_outcomes, outcome_batch
from posttrain.rl.config import RLConfig
from posttrain.rl.diagnostics import Watchdog, rollout_metrics
from posttrain.rl.evaluate import eval_metrics, evaluate, score
from posttrain.rl.losses import make_loss_fn, off_policy_correction, reference_kl
from posttrain.rl.policy import Policy
from posttrain.rl.curriculum import CurriculumSource
from posttrain.rollout import SamplingParams, TorchEngine, weights_checksum
from posttrain.rollout.types import Rollouts
from posttrain.tracking import MetricsLogger, StageTimer, latest_checkpoint, progress_bar
from posttrain.train.checkpoint import load_trainer_state, restore_weights, save_checkpoint
from posttrain.train.optim import build_optimizer, build_scheduler, rng_state, seed_everything, set_rng_state


@dataclasses.dataclass
class RLRun:
    """Everything one RL run holds; built by ``setup``."""

    cfg: RLConfig
    tokenizer: object
    policy: Policy
    engine: TorchEngine
    source: CurriculumSource
    train_prompts: dict[int, list[int]]
    eval_examples: list[dict]
    eval_prompts: list[list[int]]
    verifier: object
    loss_fn: object
    run_dir: Path
    start_step: int = 0
    ppo: object = None  # algorithm=ppo: critic and reward model (posttrain.rl.ppo.PPOState)


def sampling_params(cfg: RLConfig, seed: int) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=list(r.stop), seed=seed)


def generate_groups(run: RLRun, step: int, round_: int, k: int):
    """Sample G completions for each of the next ``k`` prompts and judge them."""
    picked = run.source.next(k)
    examples = [ex for _, ex in picked]
    prompts = [run.train_prompts[i] for i, _ in picked]
    seed = run.cfg.seed * 1_000_003 + step * 101 + round_
    ro = run.engine.generate(prompts, run.cfg.rollout.group_size, sampling_params(run.cfg, seed))
    outcomes = score(run.verifier, ro.completion_texts(), [examples[i] for i in ro.prompt_idx])
    run.source.observe([i for i, _ in picked], outcomes, run.cfg.rollout.group_size)
    return ro, outcomes


def collect(run: RLRun, step: int) -> tuple[Rollouts, list[Outcome], dict]:
    """One generation round, or with dynamic sampling several, keeping informative groups only."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    want = cfg.prompts_per_step
    ro, outcomes = generate_groups(run, step, 0, want)
    info = {"dynamic_sampling/rounds": 1}
    if not cfg.dynamic_sampling.enabled:
        return ro, outcomes, info
    kept_ro, kept_out = [], []
    for round_ in range(cfg.dynamic_sampling.max_rounds):
        if round_ > 0:
            ro, outcomes = generate_groups(run, step, round_, want)
        zv = group_outcomes(outcomes, G)[2]
        if round_ == 0:  # what sampling alone would have trained on
            info["dynamic_sampling/sampled_zero_variance_frac"] = float(zv.float().mean())
        for p in torch.nonzero(~zv).flatten().tolist():
            if len(kept_ro) < want:
                rows = list(range(p * G, (p + 1) * G))
                kept_ro.append(ro.select(rows, [len(kept_ro)] * G))
                kept_out.extend(outcomes[r] for r in rows)
        info["dynamic_sampling/rounds"] = round_ + 1
        if len(kept_ro) == want:
            break
    info["dynamic_sampling/kept_groups"] = len(kept_ro)
    if not kept_ro:
        return ro, outcomes, info | {"dynamic_sampling/starved": 1}
    return Rollouts.concat(kept_ro), kept_out, info


def advantages(cfg: RLConfig, batch: RLBatch) -> tuple[torch.Tensor, dict]:
    """(N,) group-relative advantages of the GRPO family, and their metrics.

    One rule for what reaches the optimizer: a group whose task rewards are all equal (or that has
    fewer than two valid samples) gets advantage exactly 0, whatever else happens, so
    ``groups/zero_variance_frac`` is the fraction of groups that send no gradient. With
    ``kl.mode=reward`` the per-sequence KL (``kl.coef`` · the sum over the sample's tokens) is
    subtracted from the rewards of the other groups before their normalisation.
    """
    G = cfg.rollout.group_size
    rewards_PG, valid_PG = batch.rewards_B.view(-1, G), batch.valid_B.view(-1, G)
    zero_var_P = zero_variance(rewards_PG, valid_PG)
    metrics, shaped_PG = {}, rewards_PG
    if batch.ref_logp_BT is not None:
        kl_BT, metrics = reference_kl(cfg, batch)
        if cfg.kl.mode == "reward":
            shaped_PG = rewards_PG - cfg.kl.coef * kl_BT.sum(1).view(-1, G)
    lengths_PG = batch.train_mask_BT.sum(1).view(-1, G)
    adv_PG, _ = ADVANTAGES[cfg.algorithm](shaped_PG, valid_PG, lengths_PG=lengths_PG)
    adv_B = torch.where(zero_var_P[:, None], 0.0, adv_PG).flatten().float()
    return adv_B, metrics | {"adv/abs_mean": float(adv_B.abs().mean()),
                             "groups/zero_variance_frac": float(zero_var_P.float().mean())}


def rl_step(run: RLRun, step: int, timer: StageTimer) -> dict:
    with timer("rollout"):
        ro, outcomes, info = collect(run, step)
    return learn(run, step, timer, ro, outcomes, info)


def learn(run: RLRun, step: int, timer: StageTimer, ro: Rollouts, outcomes: list[Outcome], info: dict) -> dict:
    """Everything after generation, shared by sync and async and by every algorithm: batch,
    log-probs, advantages (or PPO's critic targets), off-policy correction, update, weight sync."""
    cfg = run.cfg
    with timer("reward"):
        batch = outcome_batch(ro, outcomes, run.tokenizer.pad_token_id)
        metrics = run.ppo.combine_rewards(run, batch) if run.ppo is not None else {}
    with timer("logprobs"):
        metrics |= run.policy.score(batch)
    if run.ppo is not None:  # GAE over token rewards with the learned critic; equal rewards still teach
        targets, m = run.ppo.targets(run, batch, timer)
        G = cfg.rollout.group_size
        m["groups/zero_variance_frac"] = float(zero_variance(batch.rewards_B.view(-1, G),
                                                             batch.valid_B.view(-1, G)).float().mean())
    else:
        with timer("adv"):
            batch.adv_B, m = advantages(cfg, batch)
    metrics |= m | off_policy_correction(batch, cfg)
    metrics |= rollout_metrics(ro, outcomes, metrics.pop("groups/zero_variance_frac", 0.0)) | info
    metrics |= run.source.metrics()
    metrics["tokens/generated"] = sum(len(c) for c in ro.completion_ids)
    if info.get("dynamic_sampling/starved"):
        return metrics | {"update/skipped": 1}
    with timer("update"):
        if run.ppo is not None:
            metrics |= run.ppo.update(run, batch, targets, seed=cfg.seed + step)
        else:
            metrics |= run.policy.train_step(batch, run.loss_fn, aggregation=cfg.aggregation_mode,
                                             epochs=cfg.ppo_epochs, mini_batches=cfg.mini_batches,
                                             norm_constant=float(cfg.rollout.max_new_tokens), seed=cfg.seed + step)
    with timer("sync"):
        sync_weights(run)
    return metrics


def sync_weights(run: RLRun) -> None:
    weights = run.policy.export_weights()
    run.engine.load_weights(weights, run.engine.version + 1, weights_checksum(weights))


def encode_prompts(tokenizer, examples: list[dict], use_chat_template: bool) -> list[list[int]]:
    from posttrain.data.chat import encode_prompt

    return [encode_prompt(tokenizer, ex["prompt"], use_chat_template) for ex in examples]


def load_prompt_records(path: str) -> list[dict]:
    from posttrain.data.records import load_prompt_examples

    return [ex.as_dict() for ex in load_prompt_examples(path)]


def setup(cfg: RLConfig) -> RLRun:
    """Load and check everything before the run directory is touched (bad input writes nothing)."""
    from posttrain.verifiers import build_reward

    quiet_transformers()
    seed_everything(cfg.seed)
    check_model_path(cfg.model.path)
    train_examples = load_prompt_records(cfg.data.path)
    eval_examples = load_prompt_records(cfg.data.eval_path)[: cfg.data.eval_max_prompts] \
        if cfg.data.eval_path else []
    verifier = build_reward(cfg.verifier, format_weight=cfg.format_weight)
    tokenizer = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model)
    disable_dropout(model)  # old, new and reference log-probs must come from the same function
    ref = None
    if cfg.kl.coef > 0 or cfg.kl.track:
        ref_cfg = dataclasses.replace(cfg.model, path=cfg.kl.ref_path or cfg.model.path)
        ref = load_model(ref_cfg, trainable=False, key="kl.ref_path" if cfg.kl.ref_path else "model.path")
        disable_dropout(ref)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    updates = cfg.num_steps * cfg.ppo_epochs * cfg.mini_batches
    policy = Policy(model, optimizer, build_scheduler(optimizer, cfg.optim, updates),
                    temperature=cfg.rollout.temperature, grad_clip=cfg.optim.grad_clip,
                    micro_batch_size=cfg.micro_batch_size, ref_model=ref,
                    reuse_score_forward=cfg.algorithm != "ppo" and cfg.ppo_epochs * cfg.mini_batches == 1)
    engine = None  # async: the engine runs in its own process, started by run_async
    if cfg.mode == "sync":
        engine = TorchEngine(cfg.model.path, tokenizer=tokenizer, device=cfg.model.device,
                             dtype=getattr(torch, cfg.rollout.engine_dtype))
    if cfg.model.lora.enabled and engine is not None:
        sync_weights_to(engine, policy, version=0)
    train_prompts = dict(enumerate(encode_prompts(tokenizer, train_examples, cfg.data.use_chat_template)))
    run = RLRun(cfg=cfg, tokenizer=tokenizer, policy=policy, engine=engine,
                source=CurriculumSource(train_examples, cfg.seed, cfg.curriculum), train_prompts=train_prompts,
                eval_examples=eval_examples,
                eval_prompts=encode_prompts(tokenizer, eval_examples, cfg.data.use_chat_template),
                verifier=verifier, loss_fn=make_loss_fn(cfg), run_dir=Path(cfg.out_dir))
    if cfg.algorithm == "ppo":
        from posttrain.rl.ppo import setup_ppo

        run.ppo = setup_ppo(run)
    return run


def sync_weights_to(engine, policy: Policy, version: int) -> None:
    weights = policy.export_weights()
    engine.load_weights(weights, version, weights_checksum(weights))


def checkpoint(run: RLRun, step: int, extra: dict | None = None) -> Path:
    state = {"step": step, "optimizer": run.policy.optimizer.state_dict(),
             "scheduler": run.policy.scheduler.state_dict(), "rng": rng_state(),
             "prompts": run.source.state_dict(), "engine_version": run.engine.version, **(extra or {})}
    path = save_checkpoint(run.run_dir, step, run.policy.model, run.tokenizer, state, run.cfg.keep_last)
    if run.ppo is not None:
        run.ppo.save(path)
    return path


def maybe_resume(run: RLRun) -> int:
    ckpt = latest_checkpoint(run.run_dir) if run.cfg.resume else None
    if ckpt is None:
        return 0
    state = load_trainer_state(ckpt)
    restore_weights(run.policy.model, ckpt)
    if run.ppo is not None:
        run.ppo.load(ckpt)
    run.policy.optimizer.load_state_dict(state["optimizer"])
    run.policy.scheduler.load_state_dict(state["scheduler"])
    run.source.load_state_dict(state["prompts"])
    set_rng_state(state["rng"])
    sync_weights_to(run.engine, run.policy, version=state["engine_version"])
    print(f"resumed from {ckpt} (step {state['step']})")
    return state["step"]


def held_out_eval(run: RLRun) -> dict:
    if not run.eval_examples:
        return {}
    greedy = dataclasses.replace(sampling_params(run.cfg, run.cfg.seed), temperature=0.0)
    summary = evaluate(run.engine, run.eval_prompts, run.eval_examples, run.verifier,
                       profile="greedy", sampling=greedy, n=1, seed=run.cfg.seed)
    return eval_metrics(summary, "heldout")


def finish_step(run: RLRun, step: int, timer: StageTimer, t0: float, metrics: dict) -> dict:
    """The tail of every step, sync or async: eval when due, stage times, throughput, version."""
    cfg = run.cfg
    if cfg.eval_every and step % cfg.eval_every == 0 or step == cfg.num_steps:
        with timer("eval"):
            metrics |= held_out_eval(run)
    metrics |= timer.pop()
    metrics["time/step_s"] = time.perf_counter() - t0
    metrics["tokens_per_s"] = metrics["tokens/generated"] / metrics["time/step_s"]
    metrics["policy_version"] = run.engine.version
    return metrics


def run_rl(cfg: RLConfig, printer=print) -> dict:
    """Run (or resume) RL; returns the last step's metrics."""
    if cfg.mode == "async":
        from posttrain.rl.async_.run import run_async

        return run_async(cfg, printer)
    run = setup(cfg)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    start = maybe_resume(run)
    save_config(cfg, run.run_dir / "config.yaml")
    logger = MetricsLogger(run.run_dir, cfg.logging, resume_step=start, config_dict=to_dict(cfg))
    watchdog, timer = Watchdog(printer, zero_variance_warning=cfg.algorithm != "ppo"), StageTimer()
    last: dict = held_out_eval(run) if start == 0 else {}
    if last:
        logger.log({"step": 0, **last})
    with progress_bar(cfg.logging.progress) as bar:
        task = bar.add_task("rl", total=cfg.num_steps, completed=start, info="")
        for step in range(start + 1, cfg.num_steps + 1):
            t0 = time.perf_counter()
            metrics = finish_step(run, step, timer, t0, rl_step(run, step, timer))
            logger.log({"step": step, **metrics})
            watchdog.check(step, metrics)
            if cfg.save_every and step % cfg.save_every == 0 or step == cfg.num_steps:
                checkpoint(run, step)
            bar.update(task, advance=1, info=f"reward {metrics['reward/mean']:.3f} "
                       f"ent {metrics['entropy']:.3f} {metrics['tokens_per_s']:.0f} tok/s")
            last = metrics
    logger.close()
    return last
