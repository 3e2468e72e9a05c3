"""``attnprobe study masking`` as a study: options (:class:`MaskingOptions`) -> its two stages (capture, then
the masking counterfactuals) -> ``study.json`` and ``study.md`` (:func:`run_masking_study`)."""

from attnprobe.studies.masking.layout import MaskingLayout
from attnprobe.studies.masking.study import SEED002, MaskingOptions, MaskingRun, run_masking_study, study_markdown

__all__ = ["MaskingLayout", "SEED002", "MaskingOptions", "MaskingRun", "run_masking_study", "study_markdown"]
