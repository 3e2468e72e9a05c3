"""The NIS-Agent runner (DESIGN section 9): manager + search worker, context-isolated filter,
isolation-based stepwise validation, every model call recorded as a trajectory."""

from .config import FILTER_MODES, PRESETS, VALIDATION_MODES, RunSettings
from .recorder import Recorder
from .run import is_correct, load_questions, normalize, run_one, run_questions, summarize, token_table
from .search import BM25Search, HTTPSearch, SearchConfigError, SearchResult, make_search

__all__ = ["FILTER_MODES", "PRESETS", "VALIDATION_MODES", "RunSettings", "Recorder", "is_correct", "load_questions",
           "normalize", "run_one", "run_questions", "summarize", "token_table", "BM25Search", "HTTPSearch",
           "SearchConfigError", "SearchResult", "make_search"]
