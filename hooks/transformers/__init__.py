"""transformers capture backend: a registered attention function (``attention``) and the chunked
prefill plus the :class:`~attnprobe_hooks.backend.CaptureBackend` implementation (``backend``).

Nothing is imported here, so ``import attnprobe_hooks.transformers`` stays cheap.
"""
