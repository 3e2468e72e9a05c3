"""Context counterfactuals (seeds 002 and 004): a stage the studies call, below them and above ``agents``.

See docs/counterfactual.md. The policies and refiners it applies live in :mod:`attnprobe.agents`
(``policies``, ``refiners``, ``tagtext``). Here: ``steps`` (which steps), ``run`` (original contexts,
counterfactual contexts, one capture through :func:`attnprobe.capture.api.run_prepared`, next actions,
records), ``job`` (the job and the step choice), ``study`` (the stage as a study: its one public door, :data:`~attnprobe.counterfactual.study.COUNTERFACTUAL`), ``store`` / ``records`` (the folder format),
``summary`` (across trajectories, with confidence intervals; writes summary.json / summary.md), ``report``.
"""
