"""How `HTTPEngine` hands its servers new weights: a version folder, then every live server asked
to load it and to confirm.

The weights are written into ``weights_dir/v{version}/`` as they arrive: one safetensors shard per
part, with ``model.safetensors.index.json`` when there are several, or, for a LoRA adapter,
``adapter_model.safetensors`` + ``adapter_config.json`` (`posttrain.rollout.weights_folder`:
written in a temporary folder, then renamed, so a server never sees half a file). Then every live
server loads it, in parallel, the way its dialect says (``push``): ``posttrain serve`` must echo the
version and the checksum of what it read; vLLM and SGLang are paused, reloaded, versioned and
resumed, and verified by the version read back and by their log-probs of a probe sequence. A
server that does not confirm while it still answers ``/health`` fails the sync with
`WeightSyncError` naming it and its answer, so no rollout is ever attributed to weights a server did
not confirm; one that no longer answers leaves the rotation instead (`ServerPool`). One push at a
time, the trainer's or a relaunched server's; the newest is kept for servers that come back. The
``keep_versions`` newest folders are kept.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import httpx

from posttrain.rollout.http.gate import RequestGate
from posttrain.rollout.http.pool import ServerPool
from posttrain.rollout.http.transport import one_line
from posttrain.rollout.protocol import Buckets, Probe
from posttrain.rollout.types import WeightsDigest, WeightSyncError
from posttrain.rollout.weights_folder import prune_versions, write_version


class WeightSync:
    """New weights for the servers of ``pool`` (see the module docstring). ``client`` speaks to them
    about syncs; ``gate`` holds completion requests back when the dialect needs the servers alone
    for a push; ``version`` is what every server holds at least when this starts."""

    def __init__(self, pool: ServerPool, gate: RequestGate, dialect, client: httpx.Client, *, version: int,
                 weights_dir: str | None = None, model_files: str | None = None,
                 adapter_config: dict | None = None, keep_versions: int = 2):
        self.pool, self.gate, self.dialect, self.client = pool, gate, dialect, client
        self.version = version
        self.weights_dir = Path(weights_dir) if weights_dir else None
        self.model_files, self.adapter_config, self.keep_versions = model_files, adapter_config, keep_versions
        self._lock = threading.Lock()  # one push at a time: the trainer's, or a relaunched server's
        self._last: tuple | None = None  # (folder, version, checksum, probe, dtype) of the newest version
        self._written: list[Path] = []

    def load(self, buckets: Buckets, version: int, digest: Callable[[], str] | None, probe: Probe | None,
             dtype: str | None = None) -> None:
        """Write the version's folder as the parts arrive, then `push_all`. The checksum the servers
        confirm is the sender's ``digest()`` (asked for once every part is written), or without one
        that of what was written."""
        folder, written = self._write(buckets, version, WeightsDigest() if digest is None else None)
        self.push_all(folder, written if digest is None else digest(), version, probe, dtype)

    def push_all(self, folder: Path, checksum: str, version: int, probe: Probe | None,
                 dtype: str | None = None) -> None:
        """Every live server loads ``folder`` as ``version`` (held in ``dtype`` when given: our
        server only) and confirms it; `WeightSyncError` names every one that answers but did not. A
        relaunched server rejoins with the newest push, dtype included."""
        push = (str(folder), version, checksum, probe, dtype)
        with self._lock, self.gate.alone(self._alone()):
            live = self.pool.live_urls()
            with ThreadPoolExecutor(max_workers=max(len(live), 1)) as threads:
                answers = list(threads.map(lambda u: self._push(u, *push), live))
            refused = [f"{url}: {why}" for url, why in zip(live, answers) if why and self.pool.check_alive(url)]
            if refused:
                raise WeightSyncError(f"version {version} (checksum {checksum[:12]}) was not confirmed by "
                                      f"{len(refused)} of {len(live)} rollout servers: " + "; ".join(refused))
            if not self.pool.live and not self.pool.relaunching:
                raise self.pool.down()
            # with a relaunch under way the version stands: the relaunched server rejoins with it
            self.version, self._last = version, push
        self._prune(folder)

    def rejoin(self, url: str) -> int:
        """A relaunched server takes the newest version and joins the rotation again, both under the
        push lock: no push of the trainer's lands between the two. Returns the version."""
        with self._lock, self.gate.alone(self._alone()):
            why = self._push(url, *self._last) if self._last is not None else ""
            if why:
                raise WeightSyncError(why)
            self.pool.back(url)
        return self.version

    @contextlib.contextmanager
    def asleep(self):
        """The servers sleep inside the block (their accelerator memory freed for the trainer) and
        wake at its end, before the next push: dialects with ``sleep``/``wake`` only (vLLM)."""
        asked = []  # a sleep that failed may have put its server to sleep all the same: woken too
        try:
            for url in self.pool.live_urls():
                asked.append(url)
                self.dialect.sleep(self.client, url)
            yield
        finally:
            for url in asked:
                self.dialect.wake(self.client, url)

    def _alone(self) -> bool:
        """Whether a push needs the servers to itself (`VLLMDialect.probe_alone`, which the
        readiness check may switch on)."""
        return getattr(self.dialect, "probe_alone", False)

    def _push(self, url: str, folder: str, version: int, checksum: str, probe, dtype: str | None) -> str:
        try:  # only our server's dialect takes a dtype (the config refuses a fallback on vLLM or SGLang)
            return self.dialect.push(self.client, url, folder, version, checksum, probe,
                                     **({"dtype": dtype} if dtype is not None else {}))
        except httpx.HTTPError as e:
            return f"no answer ({one_line(e) or type(e).__name__})"

    def _write(self, buckets, version: int, digest: WeightsDigest | None) -> tuple[Path, str | None]:
        if self.weights_dir is None:
            raise WeightSyncError("HTTPEngine has no weights_dir: weights cannot be handed to the servers")
        return write_version(self.weights_dir, buckets, version, digest, adapter_config=self.adapter_config,
                             model_files=self.model_files)

    def _prune(self, current: Path) -> None:
        """Keep the ``keep_versions`` folders written last (the current one included)."""
        self._written = [p for p in self._written if p != current] + [current]
        prune_versions(self.weights_dir, set(self._written[-self.keep_versions:]))
