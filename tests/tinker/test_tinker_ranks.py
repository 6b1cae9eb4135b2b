"""`posttrain tinker-serve` under `torchrun --nproc-per-node 2` (gloo, FSDP2-sharded base) answers one
sequence of API requests as one process does: two clients on one base, cross-entropy and PPO
forward/backward (a request with fewer datums than ranks among them), optimizer steps, saved states
and a client loaded from one. A bad request is a 4xx, a request that fails in the worker fails on
every rank, and both ranks still train afterwards; SIGTERM stops them all.

Tolerance: the two sides differ only by float32 rounding (each rank runs half the batch; the
adapter gradients are summed over ranks in float64): log-probs, losses and metrics within 1e-5
(relative 1e-5), saved adapter and AdamW tensors within 1e-5 absolute.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from posttrain.tinker import wire
from posttrain.tinker.app import create_app
from posttrain.tinker.cli import load_base
from tests.serve.conftest import RunningServer
from tests.tinker.test_tinker_server import result as server_result

pytestmark = pytest.mark.slow

TOL = 1e-5


def result(http, handle):
    """A future's answer; two ranks in lock step may take a while on busy cores."""
    return server_result(http, handle, wait_s=24.0)


def decode(out: bytes) -> tuple[list[dict], dict]:
    """Per-datum {name: array} and the metrics of a forward/backward answer."""
    f = wire.fields(out)
    (record,) = f[2]
    entries = {wire._text(wire.fields(e), 1): wire.fields(wire.fields(e)[2][0]) for e in wire.fields(record)[2]}
    columns = {}
    for name, batched in entries.items():  # one BatchedTensor a field: the datums' data and byte offsets
        data, offsets = batched[1][0], np.frombuffer(batched[2][0], dtype="<i8")
        columns[name] = [np.frombuffer(data[a:b], dtype="<f4").copy() for a, b in zip(offsets[:-1], offsets[1:])]
    datums = [dict(zip(columns, row)) for row in zip(*columns.values())]
    return datums, {wire._text(wire.fields(e), 1): wire._double(wire.fields(e)[2][0]) for e in f[3]}


def ce_datum(tokens, weights):
    return list(tokens), {"target_tokens": np.array(list(tokens[1:]) + [7], dtype=np.int64),
                          "weights": np.array(weights, dtype=np.float32)}


def ppo_datum(tokens, logprobs, advantages):
    return list(tokens), {"target_tokens": np.array(list(tokens[1:]) + [7], dtype=np.int64),
                          "logprobs": np.array(logprobs, dtype=np.float32),
                          "advantages": np.array(advantages, dtype=np.float32)}


SFT = [ce_datum([3, 4, 5, 6, 7], [0, 1, 1, 1, 1]), ce_datum([9, 10, 11], [1, 0.5, 2]),
       ce_datum([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 1, 1, 1, 1, 1, 1])]
ADAM = {"learning_rate": 0.02, "eps": 1e-8, "grad_clip_norm": 5.0}


def drive(http) -> dict:
    """The sequence both servers get; what each answered, and where it saved."""
    session = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]

    def create(seq, rank, seed):
        body = {"session_id": session, "model_seq_id": seq, "base_model": "nano",
                "lora_config": {"rank": rank, "seed": seed}}
        return result(http, http.post("/api/v1/create_model", json=body))["model_id"]

    def fb(model_id, loss, data, forward_only=False, **config):
        body = wire.encode_forward_backward(model_id, 1, loss, data, forward_only=forward_only)
        for key, value in config.items():  # loss_fn_config entries (field 5), as the SDK appends them
            body += wire._len_field(5, wire._len_field(1, key.encode()) + wire._double_field(2, value))
        return decode(result(http, http.post("/api/v1/forward_backward", content=body)))

    def step(model_id):
        return result(http, http.post("/api/v1/optim_step", json={"model_id": model_id, "adam_params": ADAM}))["metrics"]

    a, b = create(0, 4, 0), create(1, 2, 1)
    seen = []
    for _ in range(2):
        seen.append(fb(a, "cross_entropy", SFT))
        seen.append(step(a))
    seen.append(fb(b, "cross_entropy", SFT[1:2]))  # one datum, two ranks: the other runs a placeholder
    seen.append(step(b))
    seen.append(step(b))  # no gradient since the last step: AdamW leaves the adapter as it is
    old = seen[-5][0]  # the log-probs a's last cross-entropy pass saw, as the sampler's
    rl = [ppo_datum(tok, lp["logprobs"] - 0.1 * i, [(-1) ** (i + j) for j in range(len(tok))])
          for i, ((tok, _), lp) in enumerate(zip(SFT, old))]
    seen.append(fb(a, "ppo", rl, forward_only=True))
    seen.append(fb(a, "ppo", rl[:2], clip_low_threshold=0.9, clip_high_threshold=1.1))  # two passes, one step
    seen.append(fb(a, "ppo", rl[2:]))
    seen.append(step(a))
    saved = {}
    for name, model_id in (("a", a), ("b", b)):
        path = result(http, http.post("/api/v1/save_weights", json={"model_id": model_id, "path": "s1"}))["path"]
        saved[name] = path.removeprefix("tinker://")
    loaded = result(http, http.post("/api/v1/load_weights", json={"session_id": session, "model_seq_id": 2,
                                                                  "path": f"tinker://{saved['a']}", "optimizer": True}))
    seen.append(fb(loaded["model_id"], "cross_entropy", SFT, forward_only=True))
    seen.append(fb(a, "cross_entropy", SFT, forward_only=True))
    return {"seen": seen, "saved": saved, "session": session, "a": a, "b": b}


def assert_same(one, two, where=""):
    if isinstance(one, dict):
        assert one.keys() == two.keys(), where
        for k in one:
            assert_same(one[k], two[k], f"{where}.{k}")
    elif isinstance(one, (list, tuple)):
        assert len(one) == len(two), where
        for i, (x, y) in enumerate(zip(one, two)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(one, np.ndarray):
        np.testing.assert_allclose(two, one, rtol=TOL, atol=TOL, err_msg=where)
    else:
        assert two == pytest.approx(one, rel=TOL, abs=TOL), where


def saved_state(root, run_path) -> dict[str, torch.Tensor]:
    folder = root / run_path
    tensors = dict(load_file(str(folder / "adapter.safetensors")))
    opt = torch.load(folder / "optimizer.pt", weights_only=True)
    for i, s in opt["optimizer"]["state"].items():
        tensors |= {f"opt.{i}.{k}": v for k, v in s.items()}
    return tensors


class Ranks:
    """`torchrun --nproc-per-node 2 -m posttrain tinker-serve` on a free loopback port (``flags``
    added to its command line)."""

    def __init__(self, root, model_dir, name="nano", flags=()):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "posttrain",
               "tinker-serve", "--root", str(root), "--model", f"{name}={model_dir}", "--port", "0", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: [self.err.append(x) for x in self.proc.stderr], daemon=True).start()

    def url(self, timeout=240.0) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            try:
                found = re.search(r" at (http://\S+) ", self.lines.get(timeout=1))
            except queue.Empty:
                continue
            if found:
                return found.group(1)
        raise AssertionError("the 2-rank server never came up:\n" + "".join(self.err)[-4000:])

    def ranks(self) -> list[int]:
        """The pids of the rank processes (torchrun's children), in rank order."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)

        def rank(pid: int) -> int:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=")[1])

        return sorted((int(p) for p in out.stdout.split()), key=rank)

    def kill(self):
        """torchrun and its ranks gone, whatever state they are in (each rank is a session of its
        own, so torchrun's process group does not hold them)."""
        if self.proc.poll() is not None:
            return
        pids = self.ranks()
        self.proc.send_signal(signal.SIGTERM)  # torchrun passes it on to the ranks
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_two_ranks_answer_as_one_process(nano_model_dir, tmp_path):
    one_root, two_root = tmp_path / "one", tmp_path / "two"
    one_root.mkdir()
    two_root.mkdir()
    ranks = Ranks(two_root, nano_model_dir)
    try:
        with RunningServer(create_app({"nano": load_base("nano", nano_model_dir, None)}, one_root, api_key=None)) as s, \
                httpx.Client(base_url=s.url, timeout=120) as http:
            one = drive(http)
        with httpx.Client(base_url=ranks.url(), timeout=120) as http:
            two = drive(http)
            assert len(ranks.ranks()) == 2
            bad_request_leaves_both_ranks_training(http, two, ranks)
            sampler_matches_the_sharded_trainer(http, two["a"])
        assert_same(one["seen"], two["seen"])
        for name in ("a", "b"):
            mine, theirs = saved_state(one_root, one["saved"][name]), saved_state(two_root, two["saved"][name])
            assert mine.keys() == theirs.keys() and len(mine) > 10
            for k in mine:
                torch.testing.assert_close(theirs[k], mine[k], rtol=0, atol=TOL, msg=k)
        # the steps moved the adapters (equal and untrained would prove nothing)
        assert one["seen"][0][1]["loss:sum"] > one["seen"][2][1]["loss:sum"]

        pids = ranks.ranks()
        ranks.proc.send_signal(signal.SIGTERM)
        ranks.proc.wait(timeout=60)
        time.sleep(0.5)
        assert not [p for p in pids if os.path.exists(f"/proc/{p}")], "a rank outlived torchrun"
    finally:
        ranks.kill()


def bad_request_leaves_both_ranks_training(http, two, ranks):
    a = two["a"]
    body = wire.encode_forward_backward(a, 1, "dro", SFT)
    r = http.post("/api/v1/forward_backward", content=body)
    assert r.status_code == 400 and "'dro' is not supported" in r.json()["error"]["message"]
    # reaches every rank and fails on each the same way (nothing to train)
    flags = {"rank": 2, "train_attn": False, "train_mlp": False, "train_unembed": False}
    failed = result(http, http.post("/api/v1/create_model", json={"session_id": two["session"], "model_seq_id": 9,
                                                                   "base_model": "nano", "lora_config": flags}))
    assert failed["category"] == "user" and "nothing to train" in failed["error"]
    missing = result(http, http.post("/api/v1/load_weights", json={"model_id": a, "optimizer": False,
                                                                    "path": "tinker://nobody/weights/none"}))
    assert "no checkpoint" in missing["error"]
    datums, _ = decode(result(http, http.post("/api/v1/forward_backward",
                                              content=wire.encode_forward_backward(a, 1, "cross_entropy", SFT))))
    assert len(datums) == 3 and ranks.proc.poll() is None and len(ranks.ranks()) == 2
    result(http, http.post("/api/v1/unload_model", json={"model_id": two["b"]}))  # on every rank
    assert decode(result(http, http.post("/api/v1/forward_backward", content=wire.encode_forward_backward(
        a, 1, "cross_entropy", SFT[:1], forward_only=True))))[0]


def sampler_matches_the_sharded_trainer(http, a):
    """Rank 0 samples from its own copy of the adapter merged into the base; the sharded ranks'
    log-probs of the sampled tokens are the sampler's."""
    sid = result(http, http.post("/api/v1/save_weights_for_sampler",
                                 json={"model_id": a, "sampling_session_seq_id": 0}))["sampling_session_id"]
    prompt = [3, 4, 5]
    out = result(http, http.post("/api/v1/asample", json={
        "sampling_session_id": sid, "num_samples": 3, "sampling_params": {"max_tokens": 6, "seed": 0},
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]}}))
    for seq in wire.fields(out)[1]:
        tokens = np.frombuffer(wire.fields(seq)[2][0], dtype="<i4").tolist()
        sampled = np.frombuffer(wire.fields(seq)[3][0], dtype="<f4")
        full = prompt + tokens
        datum = (full[:-1], {"target_tokens": np.array(full[1:]), "weights": np.ones(len(full) - 1, dtype=np.float32)})
        body = wire.encode_forward_backward(a, 1, "cross_entropy", [datum], forward_only=True)
        trained = decode(result(http, http.post("/api/v1/forward_backward", content=body)))[0][0]["logprobs"]
        assert np.abs(trained[len(prompt) - 1:] - sampled).max() < 1e-4


def test_the_other_ranks_leave_when_rank0_stops(nano_model_dir, tmp_path):
    """SIGTERM to rank 0 alone (its server stops): it tells the other rank, which exits 0."""
    ranks = Ranks(tmp_path, nano_model_dir)
    try:
        with httpx.Client(base_url=ranks.url(), timeout=120) as http:
            session = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
            a = result(http, http.post("/api/v1/create_model", json={
                "session_id": session, "model_seq_id": 0, "base_model": "nano", "lora_config": {"rank": 2}}))["model_id"]
            assert decode(result(http, http.post("/api/v1/forward_backward",
                                                 content=wire.encode_forward_backward(a, 1, "cross_entropy", SFT))))[0]
        rank0, rank1 = ranks.ranks()
        os.kill(rank0, signal.SIGTERM)
        ranks.proc.wait(timeout=60)
        time.sleep(0.5)
        err = "".join(ranks.err)
        assert "exitcode  : 143" in err and "<NO_OTHER_FAILURES>" in err, err[-3000:]  # rank 1 left with 0
        assert not os.path.exists(f"/proc/{rank1}")
    finally:
        ranks.kill()
