"""The server in-process: uvicorn on a free loopback port in a background thread, one per test module."""

from __future__ import annotations

import socket
import threading
import time

import pytest

SERVED_NAME = "nano"


class RunningServer:
    def __init__(self, app):
        import uvicorn

        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()

    @property
    def state(self):
        return self.app.state.serve


def make_server(model_dir, **kwargs) -> RunningServer:
    """The app on ``model_dir``; reloads may read anything under the temporary folder (where the
    tests write their weights) unless ``access`` says otherwise."""
    import tempfile
    from pathlib import Path

    from posttrain.serve.app import Access, create_app, load_engine

    engine, tokenizer, checksum = load_engine(model_dir)
    kwargs.setdefault("access", Access(weights_root=Path(tempfile.gettempdir())))
    app = create_app(engine, tokenizer, served_model_name=SERVED_NAME, model_path=model_dir, checksum=checksum,
                     **kwargs)
    return RunningServer(app)


@pytest.fixture(scope="module")
def server(nano_model_dir):
    with make_server(nano_model_dir) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def tokenizer(nano_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(nano_model_dir)


@pytest.fixture(scope="module")
def reference_engine(nano_model_dir, tokenizer):
    """A second, independent TorchEngine on the same folder: what the server must reproduce."""
    from posttrain.rollout import TorchEngine

    return TorchEngine(str(nano_model_dir), tokenizer=tokenizer)
