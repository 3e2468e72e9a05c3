"""Search backends: an offline BM25 index over the bundled corpus and a pluggable HTTP search API.

Both return :class:`SearchResult` lists and fetch page text for ``visit_page``. Nothing here runs
model-written code: queries and URLs are plain strings, patterns are matched literally.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
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
    """What a result records of its BM25 corpus: None for the shipped one (as every earlier version recorded
    it, so shipped results stay done), else the corpus's content (:func:`attnprobe.io.content_hash`, also
    for ``ATTNPROBE_CORPUS``): a corpus changed in place is another input, the same one moved is not."""
    from attnprobe.resources import data_path

    path = Path(corpus) if corpus else default_corpus_path()
    if not corpus and path == data_path("corpus", "docs.jsonl"):
        return None
    return content_hash(path)


def _snippet(text: str, n: int = 170) -> str:
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
            out.append(SearchResult(d["title"], d["url"], _snippet(d["text"])))
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
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read(self.max_bytes).decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as exc:
            raise AttnprobeError(f"search API {self.url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            raise AttnprobeError(f"search API {self.url}: {exc}") from None

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
        return [SearchResult(html_to_text(t), u, _snippet(html_to_text(s))) for t, u, s in items[:k] if u]

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


def make_search(kind: str = "bm25", corpus: str | Path | None = None) -> SearchBackend:
    if kind == "bm25":
        return BM25Search(corpus)
    if kind == "http":
        return HTTPSearch()
    raise ValueError(f"unknown search backend {kind!r}; use 'bm25' or 'http'")


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
