"""Context counterfactuals (seeds 002 and 004): context policies, refiners, per-step capture, summaries.

See docs/counterfactual.md. ``policies`` (mask_observations, ircot, refine_latest, user policies),
``refiners`` (BM25 extractive, any callable, OpenAI-compatible endpoint), ``run`` (per-step capture,
resumable), ``summary`` (across trajectories, with confidence intervals).
"""
