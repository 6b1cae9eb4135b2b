"""The hold a weight push puts on new completion requests when it needs the servers to itself.

A vLLM server started with LoRA on cannot compute the probe's prompt log-probs beside decoding
requests (`VLLMDialect.probe_alone`). While such a push runs, new requests wait here, and the push
first waits for the requests already on the wire to come back. Waiting here rather than in the
server's pause matters: a request sent just before the pause is queued by the server and would run
beside the probe after the resume.
"""

from __future__ import annotations

import contextlib
import threading


class RequestGate:
    """Completion requests pass through `sending`; a push that needs the servers alone holds it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._held = False
        self.posting = 0
        """Completion requests on the wire now."""

    @contextlib.contextmanager
    def sending(self):
        """Around one completion request: it waits while a push holds the gate, and is counted
        while it is on the wire."""
        with self._cond:
            self._cond.wait_for(lambda: not self._held)
            self.posting += 1
        try:
            yield
        finally:
            with self._cond:
                self.posting -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, hold: bool):
        """Around a push: with ``hold``, new requests wait until it ends, and it starts once the
        requests on the wire are back. Without, requests go on."""
        if not hold:
            yield
            return
        with self._cond:
            self._held = True
            self._cond.wait_for(lambda: self.posting == 0)
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()
