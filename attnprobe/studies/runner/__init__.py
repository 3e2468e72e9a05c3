"""The NIS-Agent runner (DESIGN section 9): manager + search worker, context-isolated filter,
isolation-based stepwise validation, every model call recorded as a trajectory."""

from attnprobe.agents.filter import FilterDecision, filter_action, parse_filter_reply
from attnprobe.agents.recorder import Recorder
from attnprobe.agents.search import BM25Search, HTTPSearch, SearchConfigError, SearchResult, make_search
from attnprobe.studies.runner.config import FILTER_MODES, PRESETS, VALIDATION_MODES, RunSettings
from attnprobe.studies.runner.job import RunnerJob, run_questions
from attnprobe.studies.runner.run import run_one, summarize, token_table

__all__ = ["FILTER_MODES", "PRESETS", "VALIDATION_MODES", "RunSettings", "FilterDecision", "filter_action",
           "parse_filter_reply", "Recorder", "RunnerJob", "run_one", "run_questions",
           "summarize", "token_table", "BM25Search", "HTTPSearch", "SearchConfigError", "SearchResult", "make_search"]
