"""``attnprobe study masking`` as a study: options (:class:`MaskingOptions`) -> its two stages (capture, then
the masking counterfactuals) -> ``study.json`` and ``study.md`` (:data:`~attnprobe.studies.masking.study.MASKING`, a study run by :func:`attnprobe.execution.study.run_study`)."""

from attnprobe.studies.masking.layout import MaskingLayout
from attnprobe.studies.masking.study import MASKING, SEED002, MaskingOptions, MaskingStudy, study_markdown

__all__ = ["MASKING", "MaskingLayout", "MaskingOptions", "MaskingStudy", "SEED002", "study_markdown"]
