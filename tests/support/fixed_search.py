"""A search backend with known pages for scripted-agent tests: the first word of the query picks the hits
('q1' -> A, B; 'q2' -> C, B; anything else -> nothing); snippets are the first 9 characters of a page."""

from __future__ import annotations

from attnprobe.agents.search import SearchResult


class FixedSearch:
    name = "fixed"
    DOCS = {"u/a": ("A", "Alpha one. Alpha two."), "u/b": ("B", "Beta one."), "u/c": ("C", "Gamma one. Answer is 42.")}
    HITS = {"q1": ["u/a", "u/b"], "q2": ["u/c", "u/b"]}

    def search(self, query: str, k: int) -> list[SearchResult]:
        urls = self.HITS.get(query.split()[0] if query.split() else "", [])[:k]
        return [SearchResult(self.DOCS[u][0], u, self.DOCS[u][1][:9]) for u in urls]

    def fetch(self, url: str) -> str | None:
        d = self.DOCS.get(url)
        return f"{d[0]}\n\n{d[1]}" if d else None
