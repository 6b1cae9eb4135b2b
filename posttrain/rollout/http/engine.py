"""`HTTPEngine`: a rollout engine that samples on OpenAI-compatible servers (``posttrain serve``,
vLLM, SGLang) and hands them new weights through a shared folder.

It is put together from parts, each in its own module beside this one:

* `transport` — the bearer token, the readiness check every server passes when the engine starts
  (one that does not answer raises `ServerUnreachable`, exit status 1 from the CLI), and the routes
  of ``posttrain serve``; the *dialect* of vLLM and SGLang is `posttrain.rollout.vllm` and
  `posttrain.rollout.sglang`;
* `pool` — which servers are in the rotation, which one a request goes to, and servers that stop
  answering: out of the rotation, relaunched when this engine launched them, `ServersDown` when
  none is left;
* `completions` — one request per prompt (``n`` = the group size), retried on other servers, the
  answers read into `Rollouts` (token ids and sampler log-probs as the server reports them);
* `weight_sync` — the sync protocol: the version folder, every server asked to load it and to
  confirm it (our server by checksum, vLLM and SGLang by the version read back and a probe);
* `gate` — the hold a push puts on new requests when it needs the servers alone (vLLM with LoRA);
* `submit` — async RL's ``submit`` / ``poll``.

Async RL (the `EngineHandle` interface): each submitted call runs in a thread like a `generate`,
tagged with the version the client held when it was sent. A weight push does not wait for those
requests: vLLM pauses them (``mode=keep``; when a decoding one freezes is the server's), reloads,
and preempts them so they resume under the new weights, recomputing their caches (their sampler
log-probs stay those of whatever weights drew each token). So a sample's tokens come from its
tagged version or newer, and the staleness bound, which counts the tag, holds for every token.
"""

from __future__ import annotations

from typing import Callable

import httpx
import torch

from posttrain.rollout.http.completions import Completions
from posttrain.rollout.http.gate import RequestGate
from posttrain.rollout.http.pool import ServerPool
from posttrain.rollout.http.submit import Submissions
from posttrain.rollout.http.transport import PosttrainDialect, auth_headers, base_url, check_servers
from posttrain.rollout.http.weight_sync import WeightSync
from posttrain.rollout.protocol import Buckets, Generated, Lost, Probe
from posttrain.rollout.types import Rollouts, SamplingParams

class HTTPEngine:
    """Rollout engine over OpenAI-compatible servers (see the module docstring).

    ``tokenizer`` decodes the completion texts from the token ids (as `TorchEngine` stores them:
    special tokens skipped, cut right after a stop string); without one the servers' texts are
    used. ``eos_ids`` tell an end-of-sequence stop from a stop-string stop (default: the
    tokenizer's EOS). ``model`` is the requests' "model" field (left out when None: the server's
    only model). ``weights_dir`` is needed by the weight syncs only; ``model_files`` is a model
    folder whose config files are copied next to each version's weights. ``dialect`` is how the
    servers are spoken to (default: `PosttrainDialect`); with ``adapter_config`` (peft's
    adapter_config.json as a dict) the syncs take a LoRA adapter's tensors and write them as peft
    does; ``servers`` (with ``stop()`` and ``restart(index)``) were launched for this engine: they
    are relaunched when they die (at most ``max_relaunches`` times) and stopped by `close`.
    ``api_key`` (default ``$POSTTRAIN_API_KEY``) goes with every request as a bearer token.
    """

    def __init__(self, urls: list[str], *, weights_dir: str | None = None, tokenizer=None,
                 eos_ids: list[int] | None = None, model: str | None = None, model_files: str | None = None,
                 request_timeout_s: float = 600.0, sync_timeout_s: float = 600.0, retries: int = 2,
                 retry_backoff_s: float = 1.0, max_inflight: int = 64, keep_versions: int = 2, dialect=None,
                 adapter_config: dict | None = None, servers=None, api_key: str | None = None,
                 max_relaunches: int = 2, printer=print):
        if retries < 0 or retry_backoff_s < 0 or max_inflight < 1 or keep_versions < 1:
            raise ValueError("retries and retry_backoff_s must be >= 0, max_inflight and keep_versions >= 1")
        self.urls = [base_url(u) for u in urls]
        self.dialect = dialect or PosttrainDialect()
        self.servers = servers
        held = check_servers(self.urls, dialect=self.dialect, api_key=api_key)
        headers = auth_headers(api_key)  # sent on every request; /health needs none
        sync_client = httpx.Client(timeout=sync_timeout_s, headers=headers)
        self.pool = ServerPool(self.urls, sync_client, servers=servers, max_relaunches=max_relaunches,
                               printer=printer)
        self.gate = RequestGate()
        self.weights = WeightSync(self.pool, self.gate, self.dialect, sync_client, version=min(held),
                                  weights_dir=weights_dir, model_files=model_files, adapter_config=adapter_config,
                                  keep_versions=keep_versions)  # min: what every server holds at least
        self.pool.rejoin = self.weights.rejoin
        eos = eos_ids if eos_ids is not None else [getattr(tokenizer, "eos_token_id", None)]
        client = httpx.Client(timeout=request_timeout_s, limits=httpx.Limits(max_connections=max_inflight),
                              headers=headers)
        self.completions = Completions(self.pool, self.gate, self.dialect, client, tokenizer=tokenizer,
                                       eos_ids={int(e) for e in eos if e is not None}, model=model, retries=retries,
                                       retry_backoff_s=retry_backoff_s, max_inflight=max_inflight)
        every_try_s = (request_timeout_s + retry_backoff_s * 2 ** retries) * (retries + 1)
        self.submissions = Submissions(max_inflight, every_try_s)

    verifies_every_sync = True
    """A sync returns only once every server confirmed the version (checksum or probe)."""

    @property
    def version(self) -> int:
        """The newest version every server in the rotation confirmed."""
        return self.weights.version

    @property
    def live(self) -> int:
        """Servers in the rotation."""
        return self.pool.live

    @property
    def restarts(self) -> int:
        """Servers relaunched (`EngineHandle.restarts`)."""
        return self.pool.restarts

    @property
    def stats(self) -> dict[str, int]:
        """Completion requests sent, retried, and failed on every try."""
        return self.completions.stats

    def close(self) -> None:
        self.submissions.close()
        self.completions.client.close()
        self.weights.client.close()
        if self.servers is not None:
            self.servers.stop()

    # -------------------------------------------------------------------------------- generation

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> Rollouts:
        """``n`` samples of each prompt, one request per prompt; samples of prompt i at i*n .. i*n+n-1."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("no prompts given, or an empty prompt")
        return self.completions.generate(prompts, n, sampling, self.version, lost_if_failed=False)

    # ------------------------------------------------------------------ async RL (EngineHandle)

    def submit(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> int:
        """Start a `generate` in the background, tagged with the version held now; its answer comes
        from `poll` (a `Generated`, or `Lost` when no server could answer it)."""
        version = self.version
        return self.submissions.submit(
            lambda: self.completions.generate(prompts, n, sampling, version, lost_if_failed=True))

    def poll(self, wait: bool) -> list[Generated | Lost]:
        return self.submissions.poll(wait)

    def wait_synced(self) -> None:
        """Nothing to wait for: a sync returns once every server confirmed."""

    @property
    def idle_s(self) -> float:
        return self.submissions.idle_s

    # ----------------------------------------------------------------------------------- weights

    def load_version(self, buckets: Buckets, version: int, digest: Callable[[], str],
                     probe: Probe | None = None, dtype: str | None = None) -> None:
        """`RolloutEngine.load_version`: the parts written as they arrive, then every server must
        confirm the sender's ``digest()`` (our server hashes the files it read) or, on vLLM and
        SGLang, the version read back and the ``probe``; `WeightSyncError` names every server that
        did not. ``dtype``: our servers hold the version in it and say so (vLLM and SGLang cannot)."""
        self.weights.load(buckets, version, digest, probe, dtype)

    def load_weights(self, weights: dict[str, torch.Tensor], version: int, checksum: str,
                     probe: Probe | None = None) -> None:
        """`load_version` of one dict whose checksum is known."""
        self.weights.load([weights], version, lambda: checksum, probe)

    def load_buckets(self, buckets: Buckets, version: int, probe: Probe | None = None) -> None:
        """`load_version` without the sender's digest: the servers confirm that of what was written."""
        self.weights.load(buckets, version, None, probe)

    def asleep(self):
        """The servers sleep inside the block (vLLM: accelerator memory freed for the trainer)."""
        return self.weights.asleep()
