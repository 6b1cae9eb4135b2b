"""Configuration of `posttrain rl`, owned section by section by the components it configures."""

from __future__ import annotations

import dataclasses
import re

from posttrain.algos.policy import POLICY_LOSSES
from posttrain.config import ConfigValueError
from posttrain.distributed.cluster import RUNTIMES, RayConfig
from posttrain.envs.config import EnvConfig
from posttrain.models.hf import DTYPES, ModelConfig
from posttrain.rollout import SamplingParams
from posttrain.rollout.vllm_servers import VLLMConfig
from posttrain.rl.async_.config import AsyncConfig
from posttrain.rl.curriculum import CurriculumConfig
from posttrain.sandbox.worker import SandboxConfig
from posttrain.tracking import LoggingConfig
from posttrain.core.optim import OptimConfig
from posttrain.verifiers.judge import JudgeConfig

ALGORITHMS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo")
# Each algorithm's default way of turning per-token losses into a scalar.
DEFAULT_AGGREGATION = {"grpo": "seq_mean_token_mean", "dr_grpo": "seq_mean_token_sum_norm",
                       "rloo": "token_mean", "reinforce_pp": "token_mean", "ppo": "token_mean"}


@dataclasses.dataclass(kw_only=True)
class PrecisionFallbackConfig:
    kl_threshold: float = 0.0
    """0 = off. When a step's ``mismatch/kl`` exceeds this, the engine holds the next version in
    float32 and samples the following steps in it; logged as ``rollout/precision`` (bits of the dtype
    the engine held for the step). Needs a 16-bit ``engine_dtype``; any engine posttrain runs (in
    process, the async engine process, Ray replicas, ``posttrain serve``: set ``engine_dtype`` to
    the server's ``--dtype``), not vLLM or SGLang, which cannot change dtype at run time."""
    quiet_steps: int = 5
    """Consecutive float32 steps whose ``mismatch/kl`` stays at or under ``kl_threshold`` before the
    engine goes back to ``engine_dtype`` (a gap that persists in float32 is not precision's, so the
    engine stays up until it clears)."""

    def __post_init__(self):
        if self.kl_threshold < 0:
            raise ConfigValueError("kl_threshold", "must be >= 0 (0 = off)")
        if self.quiet_steps < 1:
            raise ConfigValueError("quiet_steps", "must be >= 1")


@dataclasses.dataclass(kw_only=True)
class RolloutConfig:
    group_size: int = 8
    """Completions sampled per prompt (G); advantages are computed within each group."""
    max_new_tokens: int = 64
    """Longest completion; longer ones are cut (finish reason `length`)."""
    temperature: float = 1.0
    """Sampling temperature; the trainer scores tokens at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling; 1.0 = off."""
    top_k: int = 0
    """Top-k sampling; 0 = off."""
    stop: list[str] = dataclasses.field(default_factory=list)
    """Stop strings (end-of-sequence tokens always stop)."""
    engine_dtype: str = "float32"
    """dtype of the engine's own copy of the weights: float32, bfloat16 or float16 (16-bit shows real
    sampler/trainer mismatch against the float32 trainer; both run on the CPU). backend=torch
    (in-process, colocated, Ray replicas, the async engine process); a server holds the weights in
    its own dtype (``posttrain serve --dtype bfloat16``)."""
    precision_fallback: PrecisionFallbackConfig = dataclasses.field(default_factory=PrecisionFallbackConfig)
    """Sample in float32 while the sampler/trainer gap is large (docs/rl.md, "Precision")."""
    backend: str = "torch"
    """torch (the in-process TorchEngine), openai (`posttrain serve` servers at `urls`;
    docs/rollout.md), vllm (vLLM servers: at `urls`, or started by the run with `vllm.launch`;
    docs/vllm.md) or sglang (SGLang servers at `urls`; docs/vllm.md)."""
    urls: list[str] = dataclasses.field(default_factory=list)
    """backend=openai|vllm|sglang: the servers, e.g. [http://host:8000, http://host:8001]; each prompt's
    group goes to one of them."""
    vllm: VLLMConfig = dataclasses.field(default_factory=VLLMConfig)
    """backend=vllm: servers to launch, their flags, and how closely a sync must match (docs/vllm.md)."""
    weights_dir: str = ""
    """backend=openai: a folder every server can read; each new version is written to
    weights_dir/v{version}/ and loaded by the servers. Empty = OUT_DIR/rollout_weights."""
    request_timeout_s: float = 600.0
    """backend=openai: longest wait for one completion request before it is retried elsewhere;
    runtime=ray: longest wait for a replica's answer before the run stops naming the replica."""
    sync_timeout_s: float = 600.0
    """backend=openai: longest wait for a server to load a new version of the weights; runtime=ray:
    for a replica to start or to acknowledge new weights."""
    replicas: int = 1
    """runtime=ray: engine replicas (Ray actors); each prompt's group goes to one of them."""
    replica_cpus: float = 1.0
    """runtime=ray: CPUs each replica reserves (also its torch thread count, at least 1)."""
    replica_gpus: float = 0.0
    """runtime=ray: GPUs each replica reserves; > 0 puts the replica's engine on cuda."""
    retries: int = 2
    """backend=openai: further tries of a failed request, each on another server when there is one;
    after the last its samples are INFRA_FAIL (masked, counted in outcomes/INFRA_FAIL_frac)."""
    retry_backoff_s: float = 1.0
    """backend=openai: wait before the first retry, doubled before each next one."""
    colocate: bool = True
    """Under torchrun (sync mode, backend=torch, runtime=local, no environment): every rank holds
    its own engine and generates its own whole groups, with the full weights broadcast to it after
    each update; false: rank 0 alone generates the step (docs/rl.md)."""
    ray_weights: str = "auto"
    """runtime=ray: how new weights reach the replicas. ``stream``: broadcast bucket by bucket over a
    gloo group of the trainer and the replicas, no full copy anywhere (sync mode); ``object_store``:
    one put of the whole state dict per version, which replicas load when their queued requests are
    done, so the trainer never waits for them; ``auto``: stream in sync mode, the object store in
    async mode (docs/ray.md)."""
    sync_bucket_mb: float = 512.0
    """Weight sync streams the full weights out of the trainer's shards in buckets of about this
    many MiB (a layer's LoRA weights stay together): rank 0 holds one bucket at a time, each
    colocated rank receives one broadcast per bucket and dtype, and servers get one safetensors
    shard per bucket (docs/topologies.md)."""

    def __post_init__(self):
        if self.group_size < 1:
            raise ConfigValueError("group_size", "must be >= 1")
        if self.max_new_tokens < 1:
            raise ConfigValueError("max_new_tokens", "must be >= 1")
        if self.temperature <= 0:
            raise ConfigValueError("temperature", "must be > 0 for RL sampling")
        if self.engine_dtype not in DTYPES:
            raise ConfigValueError("engine_dtype", f"must be one of {', '.join(DTYPES)}")
        if self.backend not in ("torch", "openai", "vllm", "sglang"):
            raise ConfigValueError("backend", "must be torch, openai, vllm or sglang")
        if self.backend in ("openai", "sglang") and not self.urls:
            raise ConfigValueError("urls", f"backend={self.backend} needs at least one server, "
                                           "e.g. [http://localhost:8000]")
        if self.backend == "vllm" and bool(self.urls) == bool(self.vllm.launch):
            # blame the key the user set: urls when both are set, backend when neither is
            raise ConfigValueError("urls" if self.urls else "backend", "backend=vllm: set exactly one of "
                                   "rollout.urls (running servers) or rollout.vllm.launch=N (servers the run starts)")
        if not all(u.startswith(("http://", "https://")) for u in self.urls):
            raise ConfigValueError("urls", f"each must start with http:// or https://, got {self.urls}")
        for key in ("request_timeout_s", "sync_timeout_s", "sync_bucket_mb"):
            if getattr(self, key) <= 0:
                raise ConfigValueError(key, "must be > 0")
        if self.retries < 0 or self.retry_backoff_s < 0:
            raise ConfigValueError("retries" if self.retries < 0 else "retry_backoff_s", "must be >= 0")
        if self.replicas < 1:
            raise ConfigValueError("replicas", "must be >= 1")
        if self.ray_weights not in ("auto", "stream", "object_store"):
            raise ConfigValueError("ray_weights", "must be auto, stream or object_store")
        if self.replica_cpus <= 0 or self.replica_gpus < 0:
            raise ConfigValueError("replica_cpus" if self.replica_cpus <= 0 else "replica_gpus",
                                   "must be > 0" if self.replica_cpus <= 0 else "must be >= 0")


@dataclasses.dataclass(kw_only=True)
class RLDataConfig:
    path: str = ""
    """Training prompts: JSONL / Parquet / HF folder of {"prompt", "answer", ...} records. Required."""
    eval_path: str = ""
    """Held-out prompts in the same format; empty = no held-out eval during training."""
    use_chat_template: bool = True
    """Render prompts with the tokenizer's chat template (with the assistant generation prompt)."""
    thinking: bool | None = None
    """The chat template's ``enable_thinking`` for every prompt (train and held-out): true renders
    a thinking prompt, false a non-thinking one (Qwen3's empty ``<think></think>``), null the
    template's default. Needs use_chat_template."""
    eval_max_prompts: int = 200
    """Evaluate on at most this many held-out prompts."""
    eval_name: str = "heldout"
    """The evaluated set's name in its metrics, ``eval/<eval_name>/<profile>/pass@k``: e.g. ``train_fixed``
    when eval_path is a fixed draw of training problems, tracked to see the training task learnt."""

    def __post_init__(self):
        if not re.fullmatch(r"[a-z0-9_]+", self.eval_name):
            raise ConfigValueError("eval_name", "must be lowercase letters, digits and _ (it names metrics)")


@dataclasses.dataclass(kw_only=True)
class KLConfig:
    coef: float = 0.0
    """Weight of the KL penalty to the frozen reference; 0 = no reference model is loaded."""
    estimator: str = "k3"
    """k1, k2 or k3 (Schulman's estimators). In the loss, k3's gradient is the forward KL's
    KL(π_ref‖π) and k2's the reverse KL's KL(π‖π_ref); k1's is zero in expectation, so k1 is refused
    with mode=loss (docs/rl.md)."""
    mode: str = "loss"
    """loss (a KL term added to the policy loss) or reward (PPO: subtracted from each token's
    reward; GRPO family: coef × the sample's summed KL subtracted from its reward)."""
    ref_path: str = ""
    """Reference model folder; empty = the starting policy (model.path)."""
    track: bool = True
    """With coef=0, still load the frozen reference to log `kl/ref` (drift from the start) on the
    first step and every `track_every` steps. Turn off to save the memory of a second model."""
    track_every: int = 10
    """With coef=0 and track on: run the reference forward (and log `kl/ref`) on step 1 and every N
    steps; 1 = every step (one extra no-grad forward per step). With coef > 0 it runs every step."""

    def __post_init__(self):
        if self.coef < 0:
            raise ConfigValueError("coef", "must be >= 0")
        if self.track_every < 1:
            raise ConfigValueError("track_every", "must be >= 1")
        if self.estimator not in ("k1", "k2", "k3"):
            raise ConfigValueError("estimator", "must be k1, k2 or k3")
        if self.mode not in ("loss", "reward"):
            raise ConfigValueError("mode", "must be loss or reward")
        if self.estimator == "k1" and self.mode == "loss" and self.coef > 0:
            raise ConfigValueError("estimator", "k1 in the loss has zero expected gradient on-policy "
                                   "(E[∇ log π] = 0), so the penalty would be noise; use k3 or k2 with "
                                   "mode=loss, or k1 with mode=reward")


CORRECTION_KNOBS = {"truncated": {"level": "token", "cap": 2.0}, "mis": {"level": "token", "cap": 2.0},
                    "rejection": {"level": "token", "low": 0.5, "high": 2.0}, "icepop": {"low": 0.5, "high": 2.0},
                    "geo_mask": {"geo_low": 0.99, "geo_high": 1.01}, "k3_mask": {"k3_max": 0.01},
                    "none": {"level": "token"}}
"""The knobs each correction reads, with their defaults; a knob set for a kind that does not read it
is refused (it would do nothing), whatever its value."""
CORRECTION_KINDS = ("auto", *CORRECTION_KNOBS)
_ALL_KNOBS = ("level", "cap", "low", "high", "geo_low", "geo_high", "k3_max")


@dataclasses.dataclass(kw_only=True)
class CorrectionConfig:
    kind: str = "auto"
    """Sampler-vs-trainer importance correction (`posttrain.algos.IS_CORRECTIONS`, sources in
    docs/algos.md), per unit (token, or sequence with level=sequence) with ratio ρ: truncated (TIS:
    min(ρ, cap)), mis (the published MIS: ρ where ρ <= cap, 0 above), rejection (1 inside [low,
    high], 0 outside: verl's pure rejection), icepop (per token: ρ inside [low, high], 0 outside),
    geo_mask (1 for sequences whose geometric-mean ratio is inside [geo_low, geo_high], else 0),
    k3_mask (1 for sequences whose mean per-token k3 is at most k3_max, else 0) or none. auto:
    truncated wherever importance weights enter the loss (sync; async with policy_loss=pg or
    asynchrony.decoupled_ppo), none where they do not (async's default: the PPO ratio is taken
    against the sampler's log-probs and its clip bounds stale samples). The resolved kind and its
    knobs are what config.yaml records; a knob the kind does not read is refused."""
    level: str | None = None
    """truncated, mis, rejection, none: token or sequence (product of token ratios); default token."""
    cap: float | None = None
    """truncated, mis: the cap C (>= 1); default 2."""
    low: float | None = None
    """rejection, icepop: lower bound on the ratio; default 0.5."""
    high: float | None = None
    """rejection, icepop: upper bound on the ratio; default 2 (IcePop's paper: low=0.5, high=5)."""
    geo_low: float | None = None
    """geo_mask: lower bound on a sequence's geometric-mean ratio; default 0.99."""
    geo_high: float | None = None
    """geo_mask: upper bound on a sequence's geometric-mean ratio; default 1.01."""
    k3_max: float | None = None
    """k3_mask: largest mean per-token k3 (ρ - 1 - log ρ) a kept sequence may have; default 0.01."""

    def __post_init__(self):
        if self.kind == "masked":
            raise ConfigValueError("kind", "masked is now named for what it computes: rejection (weight 1 "
                                   "inside [low, high]) or mis (the published MIS: ρ where ρ <= cap, 0 above)")
        if self.kind not in CORRECTION_KINDS:
            raise ConfigValueError("kind", f"must be one of {', '.join(CORRECTION_KINDS)}")
        if self.kind != "auto":
            self.check_knobs()

    def knobs_set(self) -> list[str]:
        """The knobs given a value (in the YAML, an override, or a resolved config.yaml)."""
        return [k for k in _ALL_KNOBS if getattr(self, k) is not None]

    def knobs(self) -> dict:
        """The knobs ``kind`` reads, each as set or its default."""
        return {k: default if getattr(self, k) is None else getattr(self, k)
                for k, default in CORRECTION_KNOBS[self.kind].items()}

    def check_knobs(self) -> None:
        """Refuse a knob ``kind`` does not read, whatever its value (it would do nothing), and
        check the values of those it reads."""
        reads = CORRECTION_KNOBS[self.kind]
        unused = [k for k in self.knobs_set() if k not in reads]
        if unused:
            raise ConfigValueError(unused[0], f"has no effect with kind={self.kind} (it reads "
                                   f"{', '.join(reads) or 'nothing'})")
        v = self.knobs()
        if v.get("level", "token") not in ("token", "sequence"):
            raise ConfigValueError("level", "must be token or sequence")
        if v.get("cap", 1.0) < 1.0:
            raise ConfigValueError("cap", "must be >= 1")
        if "low" in v and not 0 < v["low"] <= v["high"]:
            raise ConfigValueError("low", "need 0 < low <= high")
        if self.kind == "icepop" and not v["low"] <= 1.0 <= v["high"]:
            raise ConfigValueError("low", "icepop needs low <= 1 <= high (a ratio of 1 is always kept)")
        if "geo_low" in v and not 0 < v["geo_low"] <= 1.0 <= v["geo_high"]:
            raise ConfigValueError("geo_low", "need 0 < geo_low <= 1 <= geo_high")
        if v.get("k3_max", 1.0) <= 0:
            raise ConfigValueError("k3_max", "must be > 0")

    def resolve(self) -> None:
        """Record the knobs ``kind`` reads with their values (what config.yaml then shows)."""
        self.check_knobs()
        for k, value in self.knobs().items():
            setattr(self, k, value)

    def options(self) -> dict:
        """The keyword arguments of ``kind``'s `IS_CORRECTIONS` entry."""
        renamed = {"geo_low": "low", "geo_high": "high", "k3_max": "max_kl"}
        return {renamed.get(k, k): value for k, value in self.knobs().items()}


@dataclasses.dataclass(kw_only=True)
class DynamicSamplingConfig:
    enabled: bool = False
    """Over-sample prompts until the step has `prompts_per_step` groups whose rewards differ."""
    max_rounds: int = 4
    """Give up filling the batch after this many generation rounds per step (and say why)."""


@dataclasses.dataclass(kw_only=True)
class CriticConfig:
    path: str = ""
    """algorithm=ppo: value model folder (a causal LM, or a reward-model checkpoint whose head is
    reused); empty = a copy of the starting policy with a fresh value head."""
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=0,
                                                                               schedule="constant"))
    """Optimizer of the critic."""
    value_clip: float = 0.2
    """Clip of the value update around the values at sampling time; 0 = no clipping."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda (1 = Monte Carlo returns, 0 = one-step TD)."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0, std 1 over the step's tokens."""

    def __post_init__(self):
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigValueError(key, "must be in [0, 1]")
        if self.value_clip < 0:
            raise ConfigValueError("value_clip", "must be >= 0")


@dataclasses.dataclass(kw_only=True)
class RewardModelConfig:
    path: str = ""
    """algorithm=ppo: a `posttrain rm` checkpoint scoring each rollout; empty = the verifier is the reward."""
    weight: float = 1.0
    """Weight of the reward model's score in the training reward."""
    verifier_weight: float = 0.0
    """Weight of the verifier's reward next to the reward model's (it is logged as reward/gold either way)."""


@dataclasses.dataclass(kw_only=True)
class RLLoggingConfig(LoggingConfig):
    samples_per_step: int = 4
    """Rollouts of each step written to OUT_DIR/samples.jsonl (prompt and completion text, reward,
    outcome class and reason, finish reason, tokens): the best and the worst sample of each of
    the step's first groups, so a pass and a fail appear side by side (docs/rl.md); 0 = off."""

    def __post_init__(self):
        super().__post_init__()
        if self.samples_per_step < 0:
            raise ConfigValueError("samples_per_step", "must be >= 0 (0 = off)")


@dataclasses.dataclass(kw_only=True)
class RLConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy to train (LoRA or full)."""
    data: RLDataConfig = dataclasses.field(default_factory=RLDataConfig)
    """Prompts."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """Sampling."""
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(lr=1e-5, warmup_steps=0,
                                                                               schedule="constant"))
    """Optimizer of the policy."""
    kl: KLConfig = dataclasses.field(default_factory=KLConfig)
    """KL penalty to a frozen reference."""
    correction: CorrectionConfig = dataclasses.field(default_factory=CorrectionConfig)
    """Off-policy correction between the sampler's and the trainer's log-probs."""
    dynamic_sampling: DynamicSamplingConfig = dataclasses.field(default_factory=DynamicSamplingConfig)
    """Skip zero-variance groups by over-sampling."""
    logging: RLLoggingConfig = dataclasses.field(default_factory=RLLoggingConfig)
    """Mirrors of metrics.jsonl, and the rollouts written each step."""
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    """The learned value model of algorithm=ppo."""
    reward_model: RewardModelConfig = dataclasses.field(default_factory=RewardModelConfig)
    """A learned reward model combined with the verifier (algorithm=ppo)."""
    algorithm: str = "grpo"
    """Advantage estimator: grpo, dr_grpo, rloo, reinforce_pp, or ppo (GAE with a learned critic)."""
    policy_loss: str = "ppo_clip"
    """ppo_clip (clipped surrogate), pg (plain policy gradient), gspo (one clipped, length-normalised
    ratio per sequence; Zheng et al. 2025) or cispo (REINFORCE weighted by a clipped, detached ratio;
    MiniMax-M1 2025). docs/rl.md."""
    aggregation: str = ""
    """token_mean, seq_mean_token_mean or seq_mean_token_sum_norm; empty = the algorithm's default
    (seq_mean_token_mean with policy_loss=gspo, whose objective is a mean over sequences)."""
    clip_low: float = 0.2
    """PPO lower clip (ratio >= 1 - clip_low)."""
    clip_high: float = 0.28
    """PPO upper clip (ratio <= 1 + clip_high); above clip_low = DAPO clip-higher."""
    dual_clip: float = 0.0
    """Dual-clip bound c for negative advantages (e.g. 3.0); 0 = off."""
    gspo_clip_low: float = 3e-4
    """policy_loss=gspo: the sequence ratio's lower clip (s >= 1 - gspo_clip_low); GSPO's paper value."""
    gspo_clip_high: float = 4e-4
    """policy_loss=gspo: the sequence ratio's upper clip (s <= 1 + gspo_clip_high); GSPO's paper value."""
    cispo_clip_low: float = 1.0
    """policy_loss=cispo: the IS weight is at least 1 - cispo_clip_low; 1 = no lower bound (MiniMax-M1)."""
    cispo_clip_high: float = 0.28
    """policy_loss=cispo: the IS weight is at most 1 + cispo_clip_high."""
    verifier: str = "arithmetic"
    """Reward: a registered verifier (arithmetic, math, code, format), package.module:function, or
    judge (a judge model grades with a rubric: the judge section)."""
    judge: JudgeConfig = dataclasses.field(default_factory=JudgeConfig)
    """A judge model on OpenAI-compatible servers: the reward with verifier=judge, or added to the
    verifier's with judge.weight when judge.urls is set (docs/envs.md, "Judge rewards")."""
    format_weight: float = 0.0
    """Weight of the format reward added to the verifier's (e.g. 0.05)."""
    format_reward: str = "format"
    """The format reward ``format_weight`` weighs: ``format`` (a closed ``<think>`` block, then an
    ``Answer:`` line or a code block), ``code_format`` (a closed ``<think>`` block, then
    syntactically valid Python), or any verifier name or import path."""
    prompts_per_step: int = 8
    """Prompts per RL step (each sampled group_size times)."""
    num_steps: int = 50
    """RL steps (one generation round + updates + weight sync each)."""
    ppo_epochs: int = 1
    """Passes over each step's rollouts."""
    mini_batches: int = 1
    """Optimizer steps per epoch (the step's rollouts split into this many mini-batches)."""
    micro_batch_tokens: int = 8192
    """Padded tokens (rows × longest row) per forward/backward: a memory knob that does not change
    the math. When a step's rollouts fit in one micro-batch and it takes one update, the scoring
    forward is the one the update differentiates (the policy runs once per step)."""
    chunked_head: bool = True
    """Apply the output head and the log-softmax a chunk of positions at a time, recomputed in
    backward, so no (B, T, V) logits exist: at long completions and large vocabularies the logits
    are most of an update's memory (docs/rl.md, "Memory"). Same numbers. Models whose head cannot
    move out of the forward (soft-capped logits, a LoRA or sharded head) keep full logits."""
    pack_rows: bool = True
    """Run a micro-batch's rows end to end in one sequence, attention kept inside each row, instead
    of padded to the longest (docs/rl.md, "Memory"): a batch of 50- and 2,000-token samples no
    longer pays for padding. Same numbers. Used when it runs fewer positions than the forward that
    runs each shared prompt once; models with soft-capped attention (Gemma 2) stay padded."""
    skip_zero_variance_backward: bool = True
    """GRPO family: the rows of zero-variance groups (advantage exactly 0) are scored without
    autograd and left out of the backward; exact, so only for debugging turn it off. Never with
    the KL in the loss (kl.coef > 0, kl.mode=loss), whose term does not vanish at advantage 0."""
    eval_every: int = 10
    """Held-out pass@1 every N steps (and at start and end); 0 = start and end only."""
    eval_samples: int = 1
    """Samples per held-out prompt. 1 with eval_temperature 0 is greedy pass@1 (profile ``greedy``);
    n > 1 at a temperature logs the sampled pass@k for k = 1, 2, 4, ... n (profile ``t<T>``, e.g.
    ``t1``): a finer measure of a small change than greedy's one pass or fail per problem. Each
    evaluation draws with the run's seed, so two steps' figures differ by the policy, not the draw."""
    eval_temperature: float = 0.0
    """Sampling temperature of the held-out evaluation; 0 = greedy."""
    save_every: int = 25
    """Checkpoint every N steps (and at the end); 0 = end only."""
    keep_last: int = 2
    """Checkpoints to keep."""
    seed: int = 0
    """Seed for prompt order, sampling and init."""
    out_dir: str = "runs/rl"
    """Run directory."""
    resume: bool = True
    """Continue from the last checkpoint in out_dir when there is one."""
    mode: str = "sync"
    """sync (generate, then train, in turn) or async (the engine generates ahead in its own process)."""
    max_staleness: int = 1
    """async: no trained sample is more than this many policy versions old (0 reproduces sync)."""
    force_no_correction: bool = False
    """async: allow correction.kind=none, i.e. train on stale samples without importance weights."""
    asynchrony: AsyncConfig = dataclasses.field(default_factory=AsyncConfig)
    """Engine process, timeouts, self-test and PPO anchoring of async mode."""
    curriculum: CurriculumConfig = dataclasses.field(default_factory=CurriculumConfig)
    """Pass-rate curriculum: favour prompts with intermediate pass rates, retire solved ones."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """Multi-turn environment the episodes run in (env.name empty = single-turn prompts; docs/envs.md)."""
    runtime: str = "local"
    """local (engine in this process tree) or ray (rollout.replicas engine actors on a Ray cluster;
    docs/ray.md)."""
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    """The Ray cluster of runtime=ray."""
    sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)
    """Limits of the code sandbox (verifier=code; docs/sandbox.md); with runtime=ray, sandbox.replicas > 0
    judges on that many sandbox actors of sandbox.cpus CPUs each (the verifier farm; docs/ray.md)."""

    def __post_init__(self):
        if self.verifier == "judge" and not self.judge.urls:
            raise ConfigValueError("judge.urls", "verifier=judge needs the judge model's servers, "
                                                 "e.g. [http://localhost:8000]")
        if self.algorithm not in ALGORITHMS:
            raise ConfigValueError("algorithm", f"must be one of {', '.join(ALGORITHMS)}")
        if self.reward_model.path and self.algorithm != "ppo":
            raise ConfigValueError("reward_model.path", "a reward model is used by algorithm=ppo only")
        if self.policy_loss not in POLICY_LOSSES:
            raise ConfigValueError("policy_loss", f"must be one of {', '.join(POLICY_LOSSES)}")
        for key in ("clip_low", "clip_high", "gspo_clip_low", "gspo_clip_high", "cispo_clip_high"):
            if getattr(self, key) < 0:
                raise ConfigValueError(key, "must be >= 0")
        if not 0 <= self.cispo_clip_low <= 1:
            raise ConfigValueError("cispo_clip_low", "must be in [0, 1] (1 = no lower bound)")
        if self.aggregation and self.aggregation not in DEFAULT_AGGREGATION.values():
            raise ConfigValueError("aggregation", "must be token_mean, seq_mean_token_mean or "
                                   "seq_mean_token_sum_norm")
        self.check_eval()
        for key in ("prompts_per_step", "num_steps", "ppo_epochs", "mini_batches", "micro_batch_tokens"):
            if getattr(self, key) < 1:
                raise ConfigValueError(key, "must be >= 1")
        if self.prompts_per_step * self.rollout.group_size % self.mini_batches:
            raise ConfigValueError("mini_batches", "must divide prompts_per_step * rollout.group_size")
        if self.mode not in ("sync", "async"):
            raise ConfigValueError("mode", "must be sync or async")
        if self.runtime not in RUNTIMES:
            raise ConfigValueError("runtime", f"must be one of {', '.join(RUNTIMES)}")
        self.check_precision_fallback()
        if self.runtime == "ray" and self.rollout.backend != "torch":
            raise ConfigValueError("runtime", f"ray places TorchEngine replicas; with rollout.backend="
                                   f"{self.rollout.backend} use runtime=local")
        if self.max_staleness < 0:
            raise ConfigValueError("max_staleness", "must be >= 0")
        if self.mode == "async" and self.rollout.ray_weights == "stream":
            raise ConfigValueError("rollout.ray_weights", "stream is for mode=sync: in async mode the trainer would "
                                   "wait at every sync for each replica's requests in flight (use auto or object_store)")
        if self.mode == "async" and self.rollout.backend == "vllm" and self.rollout.vllm.sleep_during_update:
            raise ConfigValueError("rollout.vllm.sleep_during_update", "sync mode only: asleep, a server "
                                   "generates nothing while the trainer trains, which is all async overlaps")
        if self.data.thinking is not None and not self.data.use_chat_template:
            raise ConfigValueError("data.thinking", "needs data.use_chat_template=true (enable_thinking is a "
                                   "chat template switch)")
        if self.data.thinking is not None and self.env.name:
            raise ConfigValueError("data.thinking", "has no effect with env.name: an environment renders its "
                                   "own turns (leave data.thinking null)")
        if self.env.name and not self.data.use_chat_template:
            raise ConfigValueError("data.use_chat_template", "false is not supported with env.name: an episode's "
                                   "turns are rendered by the model's chat template (roles, tool replies)")
        self.check_correction()

    def check_eval(self) -> None:
        if self.eval_samples < 1:
            raise ConfigValueError("eval_samples", "must be >= 1")
        if self.eval_temperature < 0:
            raise ConfigValueError("eval_temperature", "must be >= 0 (0 = greedy)")
        if self.eval_samples > 1 and self.eval_temperature == 0:
            raise ConfigValueError("eval_samples", "greedy decoding gives every sample the same answer; set "
                                   "eval_temperature > 0 for sampled pass@k, or eval_samples=1")
        if self.env.name and (self.eval_samples > 1 or self.eval_temperature > 0):
            raise ConfigValueError("eval_samples" if self.eval_samples > 1 else "eval_temperature",
                                   "an environment's held-out evaluation is one greedy episode per example")

    def check_precision_fallback(self) -> None:
        r = self.rollout
        if r.precision_fallback.kl_threshold == 0:
            return
        if r.engine_dtype == "float32":
            raise ConfigValueError("rollout.precision_fallback.kl_threshold", "has no effect: "
                                   "rollout.engine_dtype is already float32 (set bfloat16 or float16)")
        if r.backend in ("vllm", "sglang"):
            raise ConfigValueError("rollout.precision_fallback.kl_threshold", f"{r.backend} holds the dtype its "
                                   f"server started with and cannot change it at run time (use rollout.backend="
                                   f"torch or openai, or set kl_threshold=0)")

    @property
    def importance_weighted(self) -> bool:
        """Whether sampler->trainer importance weights enter the loss. Not in async mode with a
        ratio anchored on the sampler (decoupled_ppo off, a clipped loss): the ratio *is* the
        weight there, and its clip is what bounds a stale sample (`posttrain.rl.losses`)."""
        return not (self.mode == "async" and not self.asynchrony.decoupled_ppo and self.policy_loss != "pg")

    def check_correction(self) -> None:
        """Resolve ``correction.kind: auto``, and refuse correction knobs that would do nothing."""
        c = self.correction
        if not self.importance_weighted:
            changed = ["kind"] * (c.kind not in ("auto", "none")) + c.knobs_set()
            if changed:
                raise ConfigValueError(f"correction.{changed[0]}", "has no effect in async mode with "
                                       "asynchrony.decoupled_ppo=false: the PPO ratio is taken against the "
                                       "sampler's log-probs and its clip bounds stale samples; leave correction "
                                       "at its defaults, or set asynchrony.decoupled_ppo=true to weight the loss")
            if self.force_no_correction:
                raise ConfigValueError("force_no_correction", "has no effect: no importance weights enter the "
                                       "loss here (async, ratio anchored on the sampler)")
            c.kind = "none"
            return
        if c.kind == "auto":
            c.kind = "truncated"
        c.resolve()
        if self.force_no_correction and not (self.mode == "async" and c.kind == "none"):
            raise ConfigValueError("force_no_correction", "only allows correction.kind=none in async mode")
        if self.mode == "async" and c.kind == "none" and not self.force_no_correction:
            raise ConfigValueError("correction.kind", "none is refused in async mode: samples up to "
                                   "max_staleness versions old, from a sampler whose numerics differ from "
                                   "the trainer's, need importance correction or runs silently diverge; "
                                   "use another kind (truncated, mis, ...), or set force_no_correction=true to accept that")

    @property
    def aggregation_mode(self) -> str:
        if self.aggregation:
            return self.aggregation
        return "seq_mean_token_mean" if self.policy_loss == "gspo" else DEFAULT_AGGREGATION[self.algorithm]


def sampling_params(cfg: RLConfig, seed: int) -> SamplingParams:
    """The engine's sampling parameters of ``cfg.rollout``, with a per-request seed."""
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=list(r.stop), seed=seed)
