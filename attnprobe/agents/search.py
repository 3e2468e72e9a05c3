"""Search backends: an offline BM25 index over the bundled corpus, a pluggable HTTP search API and a client
for a Search-R1 / FlashRAG retrieval server (``POST /retrieve``, the retriever seed 004 ran).

All return :class:`SearchResult` lists and fetch page text for ``visit_page``. Nothing here runs
model-written code: queries and URLs are plain strings, patterns are matched literally.
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Protocol

from attnprobe.errors import AttnprobeError
from attnprobe.io import content_hash, located_error, read_jsonl

log = logging.getLogger(__name__)


class SearchConfigError(AttnprobeError):
    """The search backend is not configured (missing key, URL or corpus)."""


@dataclass
class SearchResult:
    title: str
    url: str
    snippet: str
    text: str | None = None  # the whole passage as the backend gave it (own newlines kept), where it gives one


class SearchBackend(Protocol):
    name: str

    def search(self, query: str, k: int) -> list[SearchResult]: ...

    def fetch(self, url: str) -> str | None: ...


def default_corpus_path() -> Path:
    """The shipped corpus (trajectories/corpus/docs.jsonl; override with ATTNPROBE_CORPUS)."""
    env = os.environ.get("ATTNPROBE_CORPUS")
    if env:
        return Path(env)
    from attnprobe.resources import data_path

    return data_path("corpus", "docs.jsonl")


def corpus_identity(corpus: str | Path | None) -> str | None:
    """What a result records of its corpus: None for the shipped one (as every earlier version recorded
    it, so shipped results stay done), a retrieval server's URL as given, else the corpus's content
    (:func:`attnprobe.io.content_hash`, also for ``ATTNPROBE_CORPUS``): a corpus changed in place is another
    input, the same one moved is not."""
    from attnprobe.resources import data_path

    if corpus and str(corpus).startswith(("http://", "https://")):
        return str(corpus)
    path = Path(corpus) if corpus else default_corpus_path()
    if not corpus and path == data_path("corpus", "docs.jsonl"):
        return None
    return content_hash(path)


def short_snippet(text: str, n: int = 170) -> str:
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    cut = text[:n].rsplit(" ", 1)[0]
    return cut + " ..."


class BM25Search:
    """Offline search over a JSONL corpus of {id, title, url, text} documents (bm25s, numpy only)."""

    name = "bm25"

    def __init__(self, corpus: str | Path | None = None):
        path = Path(corpus) if corpus else default_corpus_path()
        if not path.exists():  # anything else (a folder, a FIFO) is named by read_jsonl
            raise SearchConfigError(f"search corpus not found: {path} (set ATTNPROBE_CORPUS or pass --corpus)")
        self.path = path
        self.docs: list[dict] = []
        for lineno, doc in read_jsonl(path, error=located_error(SearchConfigError)):
            for key in ("title", "url", "text"):
                if not isinstance(doc.get(key), str):
                    raise SearchConfigError(f"{path}, line {lineno}: field '{key}' must be a string")
            self.docs.append(doc)
        if not self.docs:
            raise SearchConfigError(f"search corpus {path} is empty")
        self.by_url = {d["url"]: d for d in self.docs}
        import bm25s

        self._bm25s = bm25s
        self.index = bm25s.BM25()
        tokens = bm25s.tokenize([f"{d['title']} {d['text']}" for d in self.docs], stopwords="en",
                                show_progress=False)
        self.index.index(tokens, show_progress=False)

    def search(self, query: str, k: int = 4) -> list[SearchResult]:
        q = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not q.vocab or not any(len(x) for x in q.ids):
            return []
        k = min(k, len(self.docs))
        ids, scores = self.index.retrieve(q, k=k, show_progress=False)
        out = []
        for i, s in zip(ids[0], scores[0]):
            if s <= 0:
                continue
            d = self.docs[int(i)]
            out.append(SearchResult(d["title"], d["url"], short_snippet(d["text"])))
        return out

    def fetch(self, url: str) -> str | None:
        d = self.by_url.get(url.strip()) or self.by_url.get(url.strip().rstrip("/"))
        return f"{d['title']}\n\n{d['text']}" if d else None


class _TextExtractor(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "noscript"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "noscript") and self._skip:
            self._skip -= 1
        if tag in ("p", "div", "br", "li", "h1", "h2", "h3", "tr"):
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_to_text(raw: str) -> str:
    parser = _TextExtractor()
    parser.feed(raw)
    text = html.unescape("".join(parser.parts))
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


# provider -> (default endpoint, needs key)
HTTP_PROVIDERS = {
    "serper": ("https://google.serper.dev/search", True),
    "brave": ("https://api.search.brave.com/res/v1/web/search", True),
    "searxng": (None, False),
    "generic": (None, False),
}


class HTTPSearch:
    """A web search API, configured by environment variables.

    ATTNPROBE_SEARCH_PROVIDER  serper | brave | searxng | generic (default: serper)
    ATTNPROBE_SEARCH_URL       endpoint (required for searxng and generic)
    ATTNPROBE_SEARCH_KEY       API key (required for serper and brave)

    ``generic`` sends GET <url>?q=<query>&k=<k> and expects {"results": [{"title", "url", "snippet"}]}.
    Pages for ``visit_page`` are fetched over http(s) and reduced to plain text.
    """

    name = "http"

    def __init__(self, provider: str | None = None, *, url: str | None = None, key: str | None = None,
                 timeout: float = 20.0, max_bytes: int = 2_000_000):
        self.provider = provider or os.environ.get("ATTNPROBE_SEARCH_PROVIDER", "serper")
        if self.provider not in HTTP_PROVIDERS:
            raise SearchConfigError(f"unknown search provider {self.provider!r}; use one of {', '.join(HTTP_PROVIDERS)}"
                                    " (ATTNPROBE_SEARCH_PROVIDER)")
        default_url, needs_key = HTTP_PROVIDERS[self.provider]
        self.url = url or os.environ.get("ATTNPROBE_SEARCH_URL") or default_url
        self.key = key if key is not None else os.environ.get("ATTNPROBE_SEARCH_KEY", "")
        if needs_key and not self.key:
            raise SearchConfigError(f"the {self.provider} search API needs a key: set ATTNPROBE_SEARCH_KEY "
                                    "(or use --search bm25 for the offline corpus)")
        if not self.url:
            raise SearchConfigError(f"the {self.provider} search API needs an endpoint: set ATTNPROBE_SEARCH_URL")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.allow_private = os.environ.get("ATTNPROBE_ALLOW_PRIVATE_URLS") == "1"

    def _get_json(self, req: urllib.request.Request) -> dict:
        return request_json(req, timeout=self.timeout, max_bytes=self.max_bytes, what=f"search API {self.url}")

    def search(self, query: str, k: int = 4) -> list[SearchResult]:
        if self.provider == "serper":
            req = urllib.request.Request(self.url, data=json.dumps({"q": query, "num": k}).encode(),
                                         headers={"X-API-KEY": self.key, "Content-Type": "application/json"})
            data = self._get_json(req)
            items = [(r.get("title", ""), r.get("link", ""), r.get("snippet", "")) for r in data.get("organic", [])]
        elif self.provider == "brave":
            req = urllib.request.Request(f"{self.url}?{urllib.parse.urlencode({'q': query, 'count': k})}",
                                         headers={"X-Subscription-Token": self.key, "Accept": "application/json"})
            data = self._get_json(req)
            items = [(r.get("title", ""), r.get("url", ""), r.get("description", ""))
                     for r in (data.get("web") or {}).get("results", [])]
        else:
            params = {"q": query, "format": "json"} if self.provider == "searxng" else {"q": query, "k": k}
            headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
            req = urllib.request.Request(f"{self.url}?{urllib.parse.urlencode(params)}", headers=headers)
            data = self._get_json(req)
            items = [(r.get("title", ""), r.get("url", ""), r.get("snippet") or r.get("content", ""))
                     for r in data.get("results", [])]
        return [SearchResult(html_to_text(t), u, short_snippet(html_to_text(s))) for t, u, s in items[:k] if u]

    def fetch(self, url: str) -> str | None:
        """The page as text, or None when it cannot be fetched. The model writes these URLs, so only
        public addresses are opened (also after redirects) unless ATTNPROBE_ALLOW_PRIVATE_URLS=1."""
        if urllib.parse.urlparse(url).scheme not in ("http", "https"):
            return None
        allow = self.allow_private
        if not allow and (why := private_address(url)):
            log.warning("visit_page refused %s: %s (set ATTNPROBE_ALLOW_PRIVATE_URLS=1 to allow)", url, why)
            return None
        opener = urllib.request.build_opener(_PublicRedirects(allow))
        req = urllib.request.Request(url, headers={"User-Agent": "attnprobe-runner/0.1"})
        try:
            with opener.open(req, timeout=self.timeout) as resp:
                raw = resp.read(self.max_bytes).decode("utf-8", errors="replace")
        except (urllib.error.URLError, TimeoutError, ValueError, OSError) as exc:
            log.info("visit_page could not fetch %s: %s", url, exc)
            return None
        return html_to_text(raw) if "<" in raw else raw


def request_json(req: urllib.request.Request, *, timeout: float, max_bytes: int, what: str):
    """The JSON body of ``req``'s reply; an HTTP error, a refused connection, a timeout or a body that is not
    JSON is an :class:`AttnprobeError` naming ``what`` (the same policy for every search backend)."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read(max_bytes).decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as exc:
        raise AttnprobeError(f"{what}: HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError, json.JSONDecodeError) as exc:
        raise AttnprobeError(f"{what}: {exc}") from None


def private_address(url: str) -> str | None:
    """Why ``url`` must not be fetched (its host resolves to a loopback, private, link-local, reserved
    or multicast address, or does not resolve), or None for a public address."""
    import ipaddress
    import socket

    host = urllib.parse.urlparse(url).hostname
    if not host:
        return "no host"
    try:
        infos = socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        return f"host does not resolve ({exc})"
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        for attr in ("is_loopback", "is_link_local", "is_unspecified", "is_multicast", "is_reserved", "is_private"):
            if getattr(ip, attr):
                return f"{host} resolves to {ip} ({attr[3:].replace('_', '-')})"
    return None


class _PublicRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to a public address (a public page must not bounce us to localhost)."""

    def __init__(self, allow_private: bool):
        self.allow_private = allow_private

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if not self.allow_private and (why := private_address(newurl)):
            raise urllib.error.URLError(f"redirect to {newurl} refused: {why}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


# ------------------------------------------------------------------ the Search-R1 / FlashRAG retrieval server
# A client for a Search-R1 / FlashRAG retrieval server: the retriever seed 004's agents ran (E5 over the
# 2018 Wikipedia dump, served by ``search_r1/search/retrieval_server.py`` of PeterGriffinJin/Search-R1).
#
# The server's protocol (``retrieval_server.py``: ``QueryRequest`` and ``retrieve_endpoint``)::
#
#     POST /retrieve   {"queries": ["q1", ...], "topk": 3, "return_scores": true}
#     -> {"result": [[{"document": {"id": "...", "contents": "\"Title\"\ntext..."}, "score": 0.87}, ...], ...]}
#
# one list per query, best first (with ``return_scores`` false a list holds the documents themselves). Search-R1
# asks exactly that (``search_r1/llm_agent/generation.py``, ``_batch_search``: ``"return_scores": True``) and
# reads a passage as its ``contents``: the first line is the title, the rest the text, joined again with
# ``\n`` (``_passages2string``: ``title = content.split("\n")[0]``, ``text = "\n".join(content.split("\n")[1:])``).
# This client does the same, so the passage's own newlines and the title line as the corpus has it (wiki-18:
# in double quotes) reach the agent unchanged; :func:`attnprobe.studies.loop.prompts.ircot_passages` then
# writes ``Doc i(Title: title) text``.
#
# Errors are handled as for the other search backends (:func:`attnprobe.agents.search.request_json`): a refused
# connection, a timeout, an HTTP error or a reply that is not the shape above is an ``AttnprobeError`` naming
# the server, and the work item fails (``errors.jsonl``) rather than seeing an empty observation.


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a corpus ``contents`` string, as Search-R1's ``_passages2string`` splits it."""
    lines = contents.split("\n")
    return lines[0], "\n".join(lines[1:])


class RetrieverSearch:
    """``search(query, k)`` = one ``POST /retrieve`` for ``[query]`` with ``topk`` k and ``return_scores``
    true; ``retrieve(queries, k)`` sends a batch in one request. ``fetch(url)`` returns a passage this
    client has returned before (``url`` is ``retriever:<document id>``) as ``title\\n\\ntext``: the server
    has no page to open."""

    name = "retriever"

    def __init__(self, url: str | None, *, timeout: float = 20.0, max_bytes: int = 50_000_000):
        if not url:
            raise SearchConfigError("the retriever needs the retrieval server's URL: pass --corpus "
                                    "http://HOST:PORT/retrieve (Search-R1's retrieval_server.py)")
        parts = urllib.parse.urlparse(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SearchConfigError(f"retrieval server URL must be http(s)://HOST:PORT[/retrieve], not {url!r}")
        if parts.path in ("", "/"):  # the server's one endpoint
            url = urllib.parse.urlunparse(parts._replace(path="/retrieve"))
        self.url = url
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._docs: dict[str, str] = {}  # url -> contents of every passage returned so far (fetch)
        self._lock = threading.Lock()

    def body(self, queries: list[str], k: int) -> dict:
        """The request body Search-R1 sends (generation.py ``_batch_search``)."""
        return {"queries": list(queries), "topk": k, "return_scores": True}

    def retrieve(self, queries: list[str], k: int) -> list[list[SearchResult]]:
        what = f"retrieval server {self.url}"
        req = urllib.request.Request(self.url, data=json.dumps(self.body(queries, k)).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        data = request_json(req, timeout=self.timeout, max_bytes=self.max_bytes, what=what)
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise AttnprobeError(f"{what}: expected {{\"result\": [one list per query]}} for {len(queries)} "
                                 f"queries, got {json.dumps(data)[:200]}")
        return [[self._passage(item, what) for item in hits[:k]] for hits in result]

    def _passage(self, item, what: str) -> SearchResult:
        doc = item.get("document") if isinstance(item, dict) and "document" in item else item
        contents = doc.get("contents") if isinstance(doc, dict) else None
        if not isinstance(contents, str):
            raise AttnprobeError(f"{what}: a passage without a 'contents' string: {json.dumps(item)[:200]}")
        doc_id = doc.get("id")
        key = str(doc_id) if doc_id is not None else hashlib.sha256(contents.encode()).hexdigest()[:16]
        url = f"retriever:{key}"
        with self._lock:
            self._docs[url] = contents
        title, text = split_contents(contents)
        return SearchResult(title, url, short_snippet(text), text)

    def search(self, query: str, k: int = 3) -> list[SearchResult]:
        return self.retrieve([query], k)[0]

    def fetch(self, url: str) -> str | None:
        with self._lock:
            contents = self._docs.get(url.strip())
        if contents is None:
            return None
        title, text = split_contents(contents)
        return f"{title}\n\n{text}"


SEARCH_KINDS = ("bm25", "http", "retriever")
SEARCH_HELP = ("bm25 = the offline corpus (default); http = a web search API (ATTNPROBE_SEARCH_*); retriever = a "
               "Search-R1/FlashRAG retrieval server, its URL given as --corpus (http://HOST:PORT/retrieve)")
CORPUS_HELP = ("bm25: the JSONL corpus (default: trajectories/corpus/docs.jsonl; results record its content hash, "
               "not its path: a changed corpus reruns, a moved one does not); retriever: the retrieval server's URL")


_SEARCH: dict[tuple, SearchBackend] = {}  # one search index per process (Ray replicas build their own)


def shared_search(kind: str = "bm25", corpus: str | Path | None = None) -> SearchBackend:
    """:func:`make_search`, built once per process for each (kind, corpus) and kept: a BM25 index is built
    once for every job of a study or run that this process (or Ray replica) runs. A bm25 corpus changed in
    place is another key (its :func:`corpus_identity`), so it is indexed again."""
    key = (kind, corpus, corpus_identity(corpus) if kind == "bm25" else None)
    if key not in _SEARCH:
        _SEARCH[key] = make_search(kind, corpus)
    return _SEARCH[key]


def make_search(kind: str = "bm25", corpus: str | Path | None = None) -> SearchBackend:
    """The search backend ``kind`` (:data:`SEARCH_KINDS`); ``corpus`` says where its passages come from: the
    JSONL file for bm25, the server's URL for retriever."""
    if kind == "bm25":
        return BM25Search(corpus)
    if kind == "http":
        return HTTPSearch()
    if kind == "retriever":
        return RetrieverSearch(str(corpus) if corpus else None)
    raise ValueError(f"unknown search backend {kind!r}; use one of {', '.join(SEARCH_KINDS)}")


def find_lines(text: str, pattern: str, limit: int = 8) -> list[str]:
    """Sentences/lines of ``text`` containing ``pattern`` literally (case-insensitive); if none, those
    containing any of its words. Never compiles model-written regular expressions."""
    pieces = [p.strip() for p in re.split(r"(?<=[.!?])\s+|\n", text) if p.strip()]
    needle = pattern.strip().lower()
    if not needle:
        return []
    hits = [p for p in pieces if needle in p.lower()]
    if not hits:
        words = [w for w in re.findall(r"\w+", needle) if len(w) > 2]
        hits = [p for p in pieces if any(w in p.lower() for w in words)]
    return hits[:limit]
