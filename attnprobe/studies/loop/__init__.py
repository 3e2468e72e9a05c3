"""Context policies inside the agent loop: the seeds' scaffolds (seed 002's search/open/find agent,
seed 004's IRCoT) run with masking, IRCoT variants and refiners, scored as the seeds score them.

Modules: :mod:`.questions` (question-set reader), :mod:`.context` (a setting's policies in the loop),
:mod:`.pool` (seed 002's page pool and tools), :mod:`.agents` (the two scaffolds), :mod:`.scoring` (EM and
the F.5 judge), :mod:`.metrics` (per-setting numbers, CIs, paired tests), :mod:`.job` (the study as a job),
:mod:`.study` (run it and write the tables). docs/loop.md describes them.
"""
