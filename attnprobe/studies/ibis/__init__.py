"""IBIS (Inertia Bias in Information Seeking) inside attnprobe.

The inertia-bias paper (seeds 000/001) shows that models judge the same search results worse when
the search was their own action. This subpackage reproduces that measurement and looks inside the
model while it decides:

- :mod:`.items`      the item format (task, query, results, label) and its validation;
- :mod:`.framings`   the agentic / observer / direct framings rendered as trajectories;
- :mod:`.behaviour`  next-action generation (through :mod:`attnprobe.generation`) and tolerant
  parsing of the action;
- :mod:`.attention`  capture at the decision position, attention mass per category, layer and head;
- :mod:`.stats`      McNemar exact test, Wilson and bootstrap CIs, grouped-CV AUC (scipy / scikit-learn);
- :mod:`.metrics`    metrics.json of a model folder (behaviour, flips, attention);
- :mod:`.compare`    the cross-model rows;
- :mod:`.report`     report.md / report.html and the compare outputs, from Jinja templates in templates/;
- :mod:`.layout`     the model folder's and the comparison folder's file names, paths, readers and checks.

The command line is :mod:`attnprobe.cli.ibis` (``attnprobe ibis`` and ``attnprobe compare``).

The folder layout is documented in docs/ibis.md.
"""

from attnprobe.studies.ibis.framings import (
           CATEGORIES,
           FRAMINGS,
           REMINDER,
           SYSTEM_PROMPT,
           TOOLS,
           build_framing,
           segment_categories,
)
from attnprobe.studies.ibis.items import LABELS, IbisItem, ItemError, load_items

__all__ = ["CATEGORIES", "FRAMINGS", "REMINDER", "SYSTEM_PROMPT", "TOOLS", "build_framing", "segment_categories",
           "LABELS", "IbisItem", "ItemError", "load_items"]
