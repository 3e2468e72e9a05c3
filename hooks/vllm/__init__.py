"""vLLM capture backend.

- ``backend``: the driver side (engine loading, one ``generate`` per batch of plans, merging the
  tensor-parallel shards), registered as ``"vllm"`` in :mod:`attnprobe_hooks.backend`;
- ``extension``: the worker side, the RPC surface vLLM mixes into every worker
  (``worker_extension_cls``);
- ``plan``: capture plans and the matching of an engine step's rows to them (pure, no vLLM);
- ``layers``: attention-layer discovery and per-layer facts (heads, offsets, windows).
- ``generate``: one engine that generates and captures (the generator's side, issue 40), with ``live``,
  the pure parts (which positions a generation request scores, follow-ups, retained keys).

Nothing is imported here: vLLM is optional and is imported only when the backend is used.
"""
