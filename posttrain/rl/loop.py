"""`posttrain rl`: the synchronous RL controller. One step, top to bottom:

    prompts ─▶ engine.generate(n=G) ─▶ verifier ─▶ Outcome per sample
            ─▶ trainer log-probs (old policy, reference) ─▶ advantages ─▶ IS weights vs sampler
            ─▶ policy.train_step(batch, loss_fn) ─▶ engine.load_version(buckets, version+1, digest)

The rollout engine holds its own copy of the weights (optionally in another dtype) and only
receives new ones through ``load_version`` with a verified checksum. Samples whose outcome is
INFRA_FAIL or TASK_FAIL are masked from the gradient and counted; groups whose rewards are all
equal get zero advantage (and, with dynamic sampling, are replaced by fresh prompts).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from pathlib import Path

import torch

from posttrain.algos import ADVANTAGES
from posttrain.algos.advantages import zero_variance
from posttrain.core.checkpoint import load_checkpoint, save_checkpoint
from posttrain.core.dist import World, broadcast_weights, init_world, shard_range
from posttrain.core.fsdp import shard_model
from posttrain.core.loop import Plan, drive, open_run
from posttrain.core.optim import build_optimizer, build_scheduler, seed_everything
from posttrain.errors import UserError
from posttrain.models.hf import check_model_path, disable_dropout, load_model, load_tokenizer, quiet_transformers
from posttrain.outcome import Outcome
from posttrain.rl.batch import RLBatch, concat_groups, group_outcomes, outcome_batch, select_groups
from posttrain.rl.config import RLConfig, sampling_params
from posttrain.rl.diagnostics import Watchdog, rollout_metrics, write_samples
from posttrain.rl.engines import build_engine, colocates, server_dialect
from posttrain.verifiers.code import farm_metrics
from posttrain.verifiers.registry import verifier_metrics
from posttrain.verifiers.evaluate import eval_metrics, evaluate, score
from posttrain.rl.losses import make_loss_fn, off_policy_correction, reference_kl
from posttrain.rl.policy import Policy
from posttrain.rl.precision import PrecisionFallback, follow_the_gap
from posttrain.rl.drift import BehaviourWeights, score_stale_rows, split_mismatch
from posttrain.rl.state import RLRun
from posttrain.rl.curriculum import CurriculumSource
from posttrain.rollout.http import check_servers
from posttrain.rollout.protocol import EngineError, RolloutEngine
from posttrain.rollout.types import Rollouts, WeightsDigest
from posttrain.tracking import StageTimer, latest_checkpoint, read_metrics


def generate_groups(run: RLRun, step: int, round_: int, k: int) -> tuple[Rollouts, list[Outcome], list[int]]:
    """Sample G completions (or, with an environment, G episodes) for each of the next ``k``
    prompts and judge them: ``(rollouts, outcomes, episode_of_row)``, one outcome per episode (a
    completion is an episode of one row) and the episode of each row."""
    picked = run.source.next(k)
    examples = [ex for _, ex in picked]
    seed = run.cfg.seed * 1_000_003 + step * 101 + round_
    if run.env is not None:  # a row per sample of an episode: model and environment tokens, the model's masked in
        ro, outcomes, episode_of_row = run.env.generate(run.engine, examples, run.cfg.rollout.group_size,
                                                        sampling_params(run.cfg, seed))
    elif run.colocated:
        ro, outcomes = colocated_groups(run, [run.train_prompts[i] for i, _ in picked], examples,
                                        sampling_params(run.cfg, seed))
        episode_of_row = list(range(len(ro)))
    else:
        prompts = [run.train_prompts[i] for i, _ in picked]
        ro = run.engine.generate(prompts, run.cfg.rollout.group_size, sampling_params(run.cfg, seed))
        outcomes = score(run.verifier, ro.completion_texts(), [examples[i] for i in ro.prompt_idx], ro.finish_reason)
        episode_of_row = list(range(len(ro)))
    run.source.observe([i for i, _ in picked], outcomes, run.cfg.rollout.group_size)
    return ro, outcomes, episode_of_row


def colocated_groups(run: RLRun, prompts: list[list[int]], examples: list[dict],
                     sampling) -> tuple[Rollouts, list[Outcome]]:
    """Every rank samples and judges its own block of the step's prompts (the block it trains on)
    with its own engine, then every rank gets the whole step. Each prompt keeps the seed it has in
    the whole call (`SamplingParams.for_prompts`), so the step does not depend on the world size."""
    k, G = len(prompts), run.cfg.rollout.group_size
    mine = list(shard_range(k, run.world))
    part = run.engine.generate([prompts[i] for i in mine], G, sampling.for_prompts(mine, k))
    judged = score(run.verifier, part.completion_texts(), [examples[mine[i]] for i in part.prompt_idx],
                   part.finish_reason)
    part = part.select(list(range(len(part))), [mine[i] for i in part.prompt_idx])
    parts = [p for p in run.world.all_gather_object((part, judged)) if len(p[0])]
    return Rollouts.concat([p for p, _ in parts]), [o for _, os in parts for o in os]


def collect(run: RLRun, step: int) -> tuple[Rollouts, list[Outcome], dict, list[int]]:
    """One generation round, or with dynamic sampling several, keeping informative groups only:
    ``(rollouts, outcomes, info, episode_of_row)`` as `generate_groups`."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    want = cfg.prompts_per_step
    ro, outcomes, episodes = generate_groups(run, step, 0, want)
    info = {"dynamic_sampling/rounds": 1, "rollout/generating_ranks": run.world.world_size if run.colocated else 1} \
        | (run.env.metrics() if run.env is not None else {})
    if not cfg.dynamic_sampling.enabled:
        return ro, outcomes, info, episodes
    kept = []
    for round_ in range(cfg.dynamic_sampling.max_rounds):
        if round_ > 0:
            ro, outcomes, episodes = generate_groups(run, step, round_, want)
        zv = group_outcomes(outcomes, G)[2]
        if round_ == 0:  # what sampling alone would have trained on; reward/mean covers kept groups only
            rewards = [o.reward for o in outcomes if o.is_reward]
            info["dynamic_sampling/sampled_zero_variance_frac"] = float(zv.float().mean())
            info["dynamic_sampling/sampled_reward_mean"] = sum(rewards) / len(rewards) if rewards else 0.0
        informative = torch.nonzero(~zv).flatten().tolist()[: want - len(kept)]
        kept += [select_groups(ro, outcomes, episodes, [p], G) for p in informative]
        info["dynamic_sampling/rounds"] = round_ + 1
        if len(kept) == want:
            break
    info["dynamic_sampling/kept_groups"] = len(kept)
    if len(kept) < run.world.world_size:  # under torchrun every rank trains on at least one whole group
        return ro, outcomes, info | {"dynamic_sampling/starved": 1}, episodes
    ro, outcomes, episodes = concat_groups(kept, G)
    return ro, outcomes, info, episodes


def advantages(cfg: RLConfig, batch: RLBatch, world: World) -> tuple[torch.Tensor, dict]:
    """(N,) group-relative advantages of this rank's rows, computed on the whole step, and their metrics.

    One rule for what reaches the optimizer: a group whose task rewards are all equal (or that has
    fewer than two valid samples) gets advantage exactly 0, whatever else happens, so
    ``groups/zero_variance_frac`` is the fraction of groups that send no gradient. With
    ``kl.mode=reward`` the per-sequence KL (``kl.coef`` · the sum over the sample's tokens) is
    subtracted from the rewards of the other groups before their normalisation.

    Every rank holds whole groups; the per-episode inputs are gathered so that statistics over the
    batch (REINFORCE++'s token whitening) are those of the whole step at any world size.

    The statistics are over episodes: an episode split into several rows (``batch.episode_B``)
    takes its reward once, its KL and its length summed over its rows, and every row gets the
    episode's advantage.
    """
    G, ep = batch.group_size, batch.episode_ids()
    metrics, kl_seq_B = {}, torch.zeros(len(batch))
    if batch.ref_logp_BT is not None:
        kl_BT, metrics = reference_kl(cfg, batch, world)
        kl_seq_B = kl_BT.sum(1)
    E = int(ep.max()) + 1
    first_E = torch.zeros(E, dtype=torch.long).scatter_reduce(0, ep, torch.arange(len(batch)), "amin",
                                                              include_self=False)
    lengths_B = batch.train_mask_BT.sum(1)
    mine = (batch.rewards_B[first_E], batch.valid_B[first_E], torch.zeros(E).index_add(0, ep, kl_seq_B),
            torch.zeros(E, dtype=lengths_B.dtype).index_add(0, ep, lengths_B))
    rewards_E, valid_E, kl_E, lengths_E = (torch.cat(x) for x in zip(*world.all_gather_object(mine)))
    rewards_PG, valid_PG = rewards_E.view(-1, G), valid_E.view(-1, G)
    zero_var_P = zero_variance(rewards_PG, valid_PG)
    shaped_PG = rewards_PG - cfg.kl.coef * kl_E.view(-1, G) if cfg.kl.mode == "reward" else rewards_PG
    adv_PG, _ = ADVANTAGES[cfg.algorithm](shaped_PG, valid_PG, lengths_PG=lengths_E.view(-1, G))
    adv_E = torch.where(zero_var_P[:, None], 0.0, adv_PG).flatten().float()
    return adv_E[own_rows(len(adv_E), G, world)][ep], metrics | {
        "adv/abs_mean": float(adv_E.abs().mean()), "groups/zero_variance_frac": float(zero_var_P.float().mean())}


def own_rows(n: int, group_size: int, world: World) -> range:
    """This rank's rows (or episodes) of a step of ``n``: whole groups, in contiguous equal blocks."""
    groups = shard_range(n // group_size, world)
    return range(groups.start * group_size, groups.stop * group_size)


def reference_due(cfg: RLConfig, step: int) -> bool:
    """The reference forward runs every step when the KL is trained on; when it is only tracked,
    on step 1 and every ``kl.track_every`` steps; never without a reference (``kl.track=false``),
    so those steps do not score every row for a forward that does not run (`score_weights`)."""
    return cfg.kl.coef > 0 or cfg.kl.track and (step == 1 or step % cfg.kl.track_every == 0)


def share_step(run: RLRun, make):
    """Rank 0's ``make()`` (its generated step, say) on every rank. When it raises on rank 0, every
    rank raises it: the others would otherwise wait in the next collective forever, and the run's
    last checkpoint (after an `EngineError`) needs every rank."""
    made = None
    if run.world.main:
        try:
            made = make()
        except Exception as e:
            if run.world.distributed:
                run.world.broadcast_object(_Raised(e))
            raise
    made = run.world.broadcast_object(made)
    if isinstance(made, _Raised):
        raise made.error
    return made


class _Raised:
    """An exception on its way from rank 0 to the others (as itself when it pickles)."""

    def __init__(self, error: Exception):
        import pickle

        for candidate in (lambda: error, lambda: type(error)(str(error))):
            try:
                self.error = candidate()
                pickle.loads(pickle.dumps(self.error))
                return
            except Exception:  # noqa: BLE001 - e.g. an error holding a lock or a client
                continue
        self.error = (EngineError if isinstance(error, EngineError) else RuntimeError)(
            f"{type(error).__name__}: {error}")


def rl_step(run: RLRun, step: int, timer: StageTimer) -> dict:
    with timer("rollout"):
        ro, outcomes, info, episodes = collect(run, step) if run.colocated else share_step(run, lambda: collect(run, step))
    asleep = run.cfg.rollout.backend == "vllm" and run.cfg.rollout.vllm.sleep_during_update and run.world.main
    return learn(run, step, timer, ro, outcomes, info, episodes,
                 during=run.engine.asleep() if asleep else contextlib.nullcontext())


def learn(run: RLRun, step: int, timer: StageTimer, ro: Rollouts, outcomes: list[Outcome], info: dict,
          episode_of_row: list[int] | None = None, during=None) -> dict:
    """Everything after generation, shared by sync and async and by every algorithm: batch,
    log-probs, advantages (or PPO's critic targets), off-policy correction, update, weight sync.
    Every rank gets the whole step and trains on its own groups.

    ``outcomes`` has one entry per episode (G per group); ``episode_of_row`` the episode of each row
    of ``ro`` (None: one row per episode, as for single-turn completions). ``during`` is entered for
    the trainer's compute, from log-probs to the update (not the weight sync); the async loop keeps
    its engine busy in it."""
    cfg, world, G = run.cfg, run.world, run.cfg.rollout.group_size
    episode_of_row = list(range(len(ro))) if episode_of_row is None else episode_of_row
    episodes = own_rows(len(outcomes), G, world)  # whole groups of episodes
    rows = [r for r, e in enumerate(episode_of_row) if e in episodes]
    first = episodes.start
    with timer("reward"):
        mine = ro.select(rows, [(episode_of_row[r] - first) // G for r in rows])
        batch = outcome_batch(mine, [outcomes[episode_of_row[r]] for r in rows], run.tokenizer.pad_token_id, G)
        batch.episode_B = torch.tensor([episode_of_row[r] - first for r in rows], dtype=torch.long)
        metrics = run.ppo.combine_rewards(run, batch) if run.ppo is not None else {}
    # The curriculum's view before `during`: the async controller moves the source while the trainer computes.
    metrics |= run.source.metrics() | farm_metrics() | verifier_metrics(run.verifier) if world.main else {}
    if world.main:  # every rank holds the whole step (rank 0's or gathered), so rank 0 writes from all of it
        write_samples(run.run_dir, step, ro, outcomes, episode_of_row, tokenizer=run.tokenizer, group_size=G,
                      n=cfg.logging.samples_per_step)
    with during or contextlib.nullcontext():  # async: the controller keeps receiving and admitting groups meanwhile
        with timer("logprobs"):
            train_rows, with_ref = rows_to_train(cfg, batch, outcomes, first), reference_due(cfg, step)
            batch.score_weight_B = None if with_ref else score_weights(batch, train_rows)
            if run.behaviour is not None:  # async: stale rows under their own version, before score keeps a graph
                run.behaviour.record(run.version, run.policy.model)
                stale = score_stale_rows(run.policy, batch, run.version, run.behaviour)
            defer = defers_old_logprobs(run, with_ref, info)
            batch.old_logp_BT, batch.ref_logp_BT, m = run.policy.score(batch, with_ref=with_ref, train_rows=train_rows,
                                                                       defer=defer)
            metrics |= m
        if run.ppo is not None:  # GAE over token rewards with the learned critic; equal rewards still teach
            targets, m = run.ppo.targets(run, batch, timer)
            m["groups/zero_variance_frac"] = float(group_outcomes(outcomes, G)[2].float().mean())
        else:
            with timer("adv"):
                batch.adv_B, m = advantages(cfg, batch, world)
        split = split_mismatch(batch, run.version, *stale) if run.behaviour is not None else {}
        if not defer:
            batch.old_logp_BT, batch.is_weights_BT, correction = off_policy_correction(batch, cfg)
            metrics |= world.mean_metrics(correction | split, float(batch.scored_mask_BT.sum()))
        metrics |= m
        metrics |= rollout_metrics(ro, outcomes, metrics.pop("groups/zero_variance_frac", 0.0)) | info
        metrics["tokens/generated"] = sum(ro.model_tokens())
        if info.get("dynamic_sampling/starved"):
            return metrics | {"update/skipped": 1}
        with timer("update"):
            if run.ppo is not None:
                metrics |= run.ppo.update(run, batch, targets, seed=cfg.seed + step)
            else:
                metrics |= run.policy.train_step(batch, run.loss_fn, aggregation=cfg.aggregation_mode,
                                                 epochs=cfg.ppo_epochs, mini_batches=cfg.mini_batches,
                                                 norm_constant=float(cfg.rollout.max_new_tokens), seed=cfg.seed + step,
                                                 train_rows=train_rows, correct=(lambda mb: off_policy_correction(
                                                     mb, cfg)[:2]) if defer else None)
        if defer:  # the old log-probs are complete now: the batch as scoring first leaves it, the metrics over the step
            batch.old_logp_BT, batch.is_weights_BT, correction = off_policy_correction(batch, cfg)
            metrics |= world.mean_metrics(correction, float(batch.scored_mask_BT.sum()))
    if run.precision is not None:  # before the sync: the next version loads in the dtype chosen here
        metrics |= follow_the_gap(run, step, metrics.get("mismatch/kl"))
    with timer("sync"):
        sync_weights(run)
    return metrics


def defers_old_logprobs(run: RLRun, with_ref: bool, info: dict) -> bool:
    """Whether the update's own forward gives the old log-probs of the rows that train
    (`Policy.score`'s ``defer``): with one update a step the policy has not moved between scoring
    and updating, so its log-probs are the old ones, and everything the update reads from them (the
    PPO ratio's anchor, the importance weights) is per row. Not when the step has something to do
    with them before the update: the reference forward and its KL (the advantages may read it),
    PPO's critic, the async per-version scoring of stale rows, or a starved step that never updates."""
    return (run.policy.reuse_score_forward and run.ppo is None and run.behaviour is None and not with_ref
            and not info.get("dynamic_sampling/starved"))


def rows_to_train(cfg: RLConfig, batch: RLBatch, outcomes: list[Outcome], first_episode: int) -> torch.Tensor | None:
    """(N,) bool: the rows whose backward can change the update, or None for every row.

    In the GRPO family a zero-variance group's advantage is exactly 0 (`advantages`), and every
    term of the policy losses is multiplied by it: its rows add exactly nothing to the loss or its
    gradient unless a term survives at advantage 0, which the KL in the loss does. PPO's GAE
    advantages are per token and not 0 there."""
    if cfg.algorithm == "ppo" or not cfg.skip_zero_variance_backward or cfg.kl.coef > 0 and cfg.kl.mode == "loss":
        return None
    zero_var_P = group_outcomes(outcomes, batch.group_size)[2]
    return ~zero_var_P[(batch.episode_ids() + first_episode) // batch.group_size]


def score_weights(batch: RLBatch, train_rows: torch.Tensor | None) -> torch.Tensor | None:
    """(N,) `RLBatch.score_weight_B`: which rows the trainer scores, and how many rows each stands for.

    The rows that train are all scored (weight 1). The others, a zero-variance group's, are needed
    only by diagnostics (entropy, the sampler/trainer mismatch): a group's samples are independent
    draws for the same prompt, so its first episode stands for all G (weight G; the rest 0, not
    scored). That removes (G-1)/G of their forward while the entropy stays a weighted estimate of
    the whole batch's. Steps that run the reference forward score every row (``kl/ref`` is over
    all of them), as does every step of a loss that trains every row (None)."""
    if train_rows is None:
        return None
    stands_for_group = batch.episode_ids() % batch.group_size == 0
    return torch.where(train_rows, 1.0, torch.where(stands_for_group, float(batch.group_size), 0.0))


def sync_weights(run: RLRun, version: int | None = None) -> None:
    """Hand the policy's weights to the engine as the next version, checksummed: the full weights,
    or only the LoRA adapter for vLLM servers. vLLM and SGLang are also handed the trainer's
    log-probs of a probe sequence, which the servers' must match (they have no trustworthy
    checksum: `posttrain.rollout.vllm`).

    The weights leave the shards in buckets (``rollout.sync_bucket_mb``) for the engine's
    `RolloutEngine.load_version`, with their digest: every colocated rank's engine (a broadcast per
    bucket), or rank 0's engine, which moves them its own way (copied in, safetensors shards for
    servers, a broadcast over the weight group to Ray replicas, one dict through the object store
    or the engine process's pipe)."""
    run.version = run.version + 1 if version is None else version
    backend = run.cfg.rollout.backend
    adapter_only = backend == "vllm" and run.cfg.model.lora.enabled
    probe = None
    if backend in ("vllm", "sglang"):  # a collective when sharded, so before the stream
        ids = probe_ids(run.tokenizer)
        probe = (ids, run.policy.probe_logprobs(ids))
    dtype = run.precision.current if run.precision is not None else None  # rollout.precision_fallback
    if run.colocated:
        stream_to_ranks(run.engine, run.policy.export_buckets(run.cfg.rollout.sync_bucket_mb), run.world, run.version,
                        dtype)
        return
    sent = WeightsDigest()
    buckets = _digested(run.policy.export_buckets(run.cfg.rollout.sync_bucket_mb, adapter=adapter_only), sent)
    if not run.world.main:
        _drain(buckets)  # rank 0 is gathering them: every rank takes part
    load = lambda: _hand_over(run.engine, buckets, run.version, sent, probe, dtype)  # noqa: E731
    share_step(run, load) if run.world.distributed else load()  # a refused sync on rank 0 stops every rank


def stream_to_ranks(engine: RolloutEngine, buckets, world: World, version: int, dtype: str | None = None) -> None:
    """Every rank's engine takes rank 0's buckets as they leave the shards: one broadcast per bucket
    and dtype, each rank copying it in before the next, then rank 0's checksum of what it sent."""
    sent = WeightsDigest()
    engine.load_version(_broadcast_each(_digested(buckets, sent), world), version,
                        lambda: world.broadcast_object(sent.hexdigest() if world.main else None), dtype=dtype)


def _broadcast_each(buckets, world: World):
    for bucket in buckets:
        received = broadcast_weights(bucket, world)
        del bucket  # before the next bucket is gathered: one at a time
        yield received
        del received


def _hand_over(engine: RolloutEngine | None, buckets, version: int, sent: WeightsDigest, probe,
               dtype: str | None = None) -> None:
    """Rank 0: the engine takes the buckets (held in ``dtype`` when given); the stream is drained
    whatever happens (the other ranks are gathering it with us)."""
    try:
        if engine is not None:
            engine.load_version(buckets, version, sent.hexdigest, probe, dtype=dtype)
    finally:
        _drain(buckets)


def _digested(buckets, digest):
    for bucket in buckets:
        digest.update(bucket)
        yield bucket
        del bucket  # not held while the next one is gathered


def _drain(buckets) -> None:
    for _ in buckets:
        pass


PROBE_TEXT = "The probe: 17 + 25 = 42, and a quick brown fox jumps over the lazy dog."


def probe_ids(tokenizer, length: int = 32) -> list[int]:
    """A fixed token sequence whose log-probs tell whether a server holds the trainer's weights."""
    ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    return (ids * (length // max(len(ids), 1) + 1))[:length]


def encode_prompts(tokenizer, examples: list[dict], use_chat_template: bool,
                   thinking: bool | None = None) -> list[list[int]]:
    from posttrain.data.chat import encode_prompt

    return [encode_prompt(tokenizer, ex["prompt"], use_chat_template, thinking) for ex in examples]


def load_prompt_records(path: str) -> list[dict]:
    from posttrain.data.records import load_prompt_examples

    return [ex.as_dict() for ex in load_prompt_examples(path)]


def setup(cfg: RLConfig) -> RLRun:
    """Load and check everything before the run directory is touched (bad input writes nothing)."""
    from posttrain.verifiers import build_reward, code

    quiet_transformers()
    world = init_world(cfg.model.device)
    check_world(cfg, world)
    seed_everything(cfg.seed)
    check_model_path(cfg.model.path)
    train_examples = load_prompt_records(cfg.data.path)
    eval_examples = load_prompt_records(cfg.data.eval_path)[: cfg.data.eval_max_prompts] \
        if cfg.data.eval_path else []
    judge = None
    if cfg.judge.urls:
        from posttrain.verifiers.judge import Judge

        judge = Judge(cfg.judge)
    verifier = build_reward(cfg.verifier, format_weight=cfg.format_weight, judge=judge,
                            format_spec=cfg.format_reward)
    code.configure(cfg.sandbox, cfg.runtime, cfg.ray)  # where code is judged; the pool starts on first use
    if cfg.rollout.backend != "torch" and cfg.rollout.urls:
        check_servers(cfg.rollout.urls, dialect=server_dialect(cfg))  # every rank, before any model loads
    tokenizer = load_tokenizer(cfg.model.path, chat_template=
                               "env.name (environments render their turns with it)" if cfg.env.name else
                               "data.use_chat_template=true (set it to false for plain-text prompts)"
                               if cfg.data.use_chat_template else None)
    model_cfg = dataclasses.replace(cfg.model, device=str(world.device))
    model = load_model(model_cfg)
    disable_dropout(model)  # old, new and reference log-probs must come from the same function
    model = shard_model(model, world, activation_checkpointing=cfg.model.activation_checkpointing)
    ref = None
    if cfg.kl.coef > 0 or cfg.kl.track:
        ref_cfg = dataclasses.replace(model_cfg, path=cfg.kl.ref_path or cfg.model.path)
        ref = load_model(ref_cfg, trainable=False, key="kl.ref_path" if cfg.kl.ref_path else "model.path")
        disable_dropout(ref)
        ref = shard_model(ref, world)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    updates = cfg.num_steps * cfg.ppo_epochs * cfg.mini_batches
    policy = Policy(model, optimizer, build_scheduler(optimizer, cfg.optim, updates),
                    temperature=cfg.rollout.temperature, grad_clip=cfg.optim.grad_clip,
                    micro_batch_tokens=cfg.micro_batch_tokens, ref_model=ref, world=world,
                    chunked_head=cfg.chunked_head, pack_rows=cfg.pack_rows,
                    reuse_score_forward=cfg.algorithm != "ppo" and cfg.ppo_epochs * cfg.mini_batches == 1)
    engine = build_engine(cfg, tokenizer, world)
    env = setup_env(cfg, tokenizer)
    train_prompts = {} if env else dict(enumerate(
        encode_prompts(tokenizer, train_examples, cfg.data.use_chat_template, cfg.data.thinking)))
    run = RLRun(cfg=cfg, tokenizer=tokenizer, policy=policy, engine=engine,
                source=CurriculumSource(train_examples, cfg.seed, cfg.curriculum), train_prompts=train_prompts,
                eval_examples=eval_examples,
                eval_prompts=[] if env else encode_prompts(tokenizer, eval_examples, cfg.data.use_chat_template,
                                                           cfg.data.thinking),
                verifier=verifier, loss_fn=make_loss_fn(cfg), run_dir=Path(cfg.out_dir), world=world, env=env,
                colocated=colocates(cfg, world),
                precision=PrecisionFallback(cfg.rollout.precision_fallback, cfg.rollout.engine_dtype)
                if cfg.rollout.precision_fallback.kl_threshold > 0 else None,
                behaviour=BehaviourWeights(cfg.max_staleness) if cfg.mode == "async" and cfg.max_staleness > 0 and cfg.asynchrony.mismatch_by_version
                else None)
    send_starting_weights(run)
    if cfg.algorithm == "ppo":
        from posttrain.rl.ppo import setup_ppo

        run.ppo = setup_ppo(run)
    return run


def send_starting_weights(run: RLRun) -> None:
    """Version 0 where the engine needs it: servers confirm they hold exactly the starting weights;
    with LoRA the engine loaded the base model, and the adapter's merge is version 0. Not on resume:
    the checkpoint's weights are the first sent (`maybe_resume`), and a server that still holds a
    later version of the stopped run would refuse version 0."""
    cfg = run.cfg
    if resume_point(cfg) is not None:
        return
    if cfg.model.lora.enabled and (run.engine is not None or run.world.distributed) or cfg.rollout.backend != "torch":
        sync_weights(run, version=0)


def setup_env(cfg: RLConfig, tokenizer):
    """The multi-turn environment session of ``env.name`` (None without one). The environments run
    in this process; sync mode drives the episodes' turns with blocking generate calls, async mode
    turn by turn through the engine process (`posttrain.rl.async_.controller`)."""
    if not cfg.env.name:
        return None
    from posttrain.envs.session import EnvSession

    return EnvSession(cfg.env, tokenizer)


def check_world(cfg: RLConfig, world: World) -> None:
    """What a run under torchrun needs: a whole group for every rank, the sync driver."""
    if not world.distributed:
        return
    if cfg.prompts_per_step < world.world_size:
        raise UserError(f"prompts_per_step={cfg.prompts_per_step}: fewer than the {world.world_size} processes "
                        "(each trains on whole groups, at least one)")


def trainables(run: RLRun) -> dict:
    out = {"policy": (run.policy.model, run.policy.optimizer)}
    if run.ppo is not None:
        out["critic"] = (run.ppo.critic.model, run.ppo.critic.optimizer)
    return out


def checkpoint(run: RLRun, step: int, extra: dict | None = None, prompts: dict | None = None) -> Path:
    """Every rank calls it: sharded state, the consolidated policy (and critic) folders, the run state.
    ``prompts``: the prompt source's state to save (default: its state now)."""
    prompts = run.source.state_dict() if prompts is None else prompts
    state = {"step": step, "scheduler": run.policy.scheduler.state_dict(), "prompts": prompts,
             "engine_version": run.version, **(extra or {})}
    if run.precision is not None:  # a resumed run samples in the same dtype, its quiet steps counted on
        state["precision"] = run.precision.state_dict()
    critic = {}
    if run.ppo is not None:
        state["critic_scheduler"] = run.ppo.critic.scheduler.state_dict()
        critic = {"critic": run.ppo.critic.model}
    return save_checkpoint(run.run_dir, step, trainables=trainables(run), export_model=run.policy.model,
                           tokenizer=run.tokenizer, state=state, keep_last=run.cfg.keep_last, world=run.world,
                           extra_exports=critic)


def resume_point(cfg: RLConfig) -> Path | None:
    """The checkpoint a run resumes from; None when it starts afresh."""
    return latest_checkpoint(Path(cfg.out_dir)) if cfg.resume else None


def resumed_version(run: RLRun, saved: int) -> int:
    """The version the checkpoint's weights are sent as: the saved one, unless the engine already
    holds a later one (servers the stopped run kept syncing past its last checkpoint): then the
    next after it, since servers refuse to go back and a version names one set of weights."""
    held = run.world.broadcast_object(run.engine.version if run.engine is not None else 0)
    return saved if held <= saved else held + 1


def maybe_resume(run: RLRun, printer=print) -> int:
    ckpt = resume_point(run.cfg)
    if ckpt is None:
        return 0
    if run.ppo is not None and not (ckpt / "critic" / "config.json").is_file():
        raise UserError(f"{ckpt}: checkpoint has no critic/ (not a PPO run, or a save was cut short)")
    state = load_checkpoint(ckpt, trainables=trainables(run), world=run.world)
    run.policy.scheduler.load_state_dict(state["scheduler"])
    if run.ppo is not None:
        run.ppo.critic.scheduler.load_state_dict(state["critic_scheduler"])
    run.source.load_state_dict(state["prompts"])
    if run.precision is not None:
        run.precision.load_state_dict(state.get("precision", {}))
    sync_weights(run, version=resumed_version(run, state["engine_version"]))
    if run.world.main:
        printer(f"resumed from {ckpt} (step {state['step']})")
    return state["step"]


def eval_profile(cfg: RLConfig) -> str:
    """The held-out evaluation's profile in its metric names: ``greedy``, or ``t<T>`` when sampled."""
    return "greedy" if cfg.eval_temperature == 0 else f"t{cfg.eval_temperature:g}"


def held_out_eval(run: RLRun) -> dict:
    """pass@k on the held-out prompts (greedy pass@1 by default), by the engine on rank 0 (other
    ranks: {}). Every evaluation samples with the run's seed, so on the same prompts two steps'
    figures differ by the policy's change, not by another draw of samples."""
    if not run.eval_examples or run.engine is None or not run.world.main:
        return {}
    cfg = run.cfg
    sampling = dataclasses.replace(sampling_params(cfg, cfg.seed), temperature=cfg.eval_temperature)
    if run.env is not None:
        return run.env.evaluate(run.engine, run.eval_examples, sampling, cfg.data.eval_name)
    summary = evaluate(run.engine, run.eval_prompts, run.eval_examples, run.verifier,
                       profile=eval_profile(cfg), sampling=sampling, n=cfg.eval_samples, seed=cfg.seed)
    return eval_metrics(summary, cfg.data.eval_name)


def tokens_so_far(run: RLRun, start: int) -> int:
    """Model tokens generated by the steps before ``start`` (resume), from metrics.jsonl: read by
    rank 0 after `open_run` cut the lines logged past the checkpoint, then broadcast, so that
    every rank stops a token budget at the same step (a rank reading while rank 0 rewrites the
    file could count other lines, and the ranks would then hang apart in the save's collectives)."""
    if not start:
        return 0
    tokens = sum(int(m.get("tokens/generated", 0)) for m in read_metrics(run.run_dir)) if run.world.main else 0
    return int(run.world.broadcast_object(tokens))


def drive_rl(run: RLRun, step_fn, *, config, name: str, printer=print, max_tokens: int = 0) -> dict:
    """Run (or resume) ``step_fn(run, step, timer)`` under the core's driver: held-out eval at the
    start (rank 0), every ``eval_every`` steps and at the end; checkpoints; metrics on rank 0.

    ``max_tokens`` > 0 stops the run once that many completion tokens were generated (the budget
    the study uses to compare methods); every step logs ``tokens/total``.
    """
    cfg, world = run.cfg, run.world
    start = maybe_resume(run, printer)
    logger = open_run(run.run_dir, config, start, world)
    tokens = tokens_so_far(run, start)
    first = held_out_eval(run) if start == 0 else {}
    if first and world.main:
        logger.log({"step": 0, "tokens/total": 0, **first})
    watchdog = Watchdog(printer if world.main else (lambda *_: None), zero_variance_warning=name == "rl"
                        and cfg.algorithm != "ppo")

    done = (start, copy.deepcopy(run.source.state_dict()))  # the last step trained, and its prompts' state

    def step(n: int, timer: StageTimer) -> dict:
        nonlocal tokens, done
        t0 = time.perf_counter()
        metrics = step_fn(run, n, timer)
        done = (n, copy.deepcopy(run.source.state_dict()))
        tokens += metrics["tokens/generated"]
        return metrics | {"tokens/total": tokens, "policy_version": run.version,
                          "tokens_per_s": metrics["tokens/generated"] / (time.perf_counter() - t0)}

    plan = Plan(name, cfg.num_steps, start, cfg.eval_every, cfg.save_every, cfg.logging.progress)
    try:
        return drive(plan, step, logger=logger, save=lambda n: checkpoint(run, n), evaluate=lambda: held_out_eval(run),
                     check=watchdog.check, stop=lambda n, m: 0 < max_tokens <= m["tokens/total"], world=world,
                     describe=lambda m: f"reward {m['reward/mean']:.3f} ent {m['entropy']:.3f} "
                                        f"{m['tokens_per_s']:.0f} tok/s") or first
    except EngineError:  # the rollout servers are gone: keep what was trained (the step cut short is redone)
        checkpoint(run, done[0], prompts=done[1])
        if world.main:
            printer(f"the rollout engine failed; saved a checkpoint at step {done[0]} (re-run to resume)")
        raise
    finally:
        if logger is not None:
            logger.close()


def run_sync(cfg: RLConfig, printer=print) -> dict:
    """Run (or resume) synchronous RL; returns the last step's metrics."""
    run = setup(cfg)
    try:
        return drive_rl(run, rl_step, config=cfg, name="rl", printer=printer)
    finally:
        if run.engine is not None and hasattr(run.engine, "close"):
            run.engine.close()  # Ray replicas and launched servers would outlive the run
