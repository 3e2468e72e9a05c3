"""``attnprobe serve``'s real handler over a fake model, in a thread (no weights): ``generate`` emits one known
token per step, so the reply and the number of generated tokens are known exactly."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

from attnprobe.generation.server import Limits, make_server


class FakeModel:
    """``generate`` appends ``token`` ``delay`` seconds apart, asking the stopping criteria after each
    step as transformers does; ``runs`` records how many tokens each call produced."""

    device = None

    def __init__(self, token: int, delay: float = 0.0, context: int = 4096):
        self.config = SimpleNamespace(max_position_embeddings=context)
        self.token, self.delay, self.runs = token, delay, []

    def generate(self, ids, attention_mask=None, max_new_tokens=1, stopping_criteria=None, **kw):
        import torch

        out = ids
        for _ in range(max_new_tokens):
            time.sleep(self.delay)
            out = torch.cat([out, torch.tensor([[self.token]])], dim=1)
            if stopping_criteria is not None and bool(stopping_criteria(out, None).all()):
                break
        self.runs.append(out.shape[1] - ids.shape[1])
        return out


def fake(tok, delay=0.0):
    token = tok.encode(" ok", add_special_tokens=False)[0]
    return SimpleNamespace(name="fake", tokenizer=tok, model=FakeModel(token, delay))


@contextlib.contextmanager
def running(loaded, **limits):
    srv = make_server(loaded, "127.0.0.1", 0, Limits(**limits))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def wait_until(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
