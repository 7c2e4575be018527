"""Where selection starts: the sparse regime of one configuration's index geometry.

    r = Regime(k=512, compression=4, window=128)
    r.first_sparse       # 2180: the shortest prompt at which the indexer drops a key
    r.dense(2048)        # True: every key is still kept
    r.scale              # 2176 (c*k + window): what `--lengths auto` doubles around

The rule: the indexer sees one key per `compression` tokens outside a raw `window` of the
most recent tokens, and keeps its top `k` of them, so a prompt of L tokens loses a key
only when (L - window) // compression > k. DeepSeek-V3.2 is compression 1, window 0
(selection above k); DeepSeek-V4 compresses index keys 4:1 (Flash k = 512: no selection up
to 2,179 tokens with its 128-token window). `geometry_of(sources)` reads k, compression
and window from dicts a configuration's manifest entry carries (its axes, settings, the
command line's `geometry`, the server's /v1/models entry and /server_info facts), in
that order: the first that gives a value wins; `attention = "dense"` anywhere means no
regime (None). `config_regime(entry)` is that over one manifest configuration entry;
`at_or_below_k` the lengths where every key is kept. Pure data and pure functions; imports nothing of niah.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

# The keys a source may give the compression and the index window under: the command line's
# and SGLang's names, then the embedded server's (`niah serve --index-compress 4 --window W`,
# its /v1/models entry, its matrix keys and its attested facts).
COMPRESSION_KEYS = ("index_compression", "index_compress")
WINDOW_KEYS = ("index_window", "window")


@dataclass(frozen=True)
class Regime:
    """A sparse configuration's index geometry: top-k, compression ratio, raw window."""

    k: int
    compression: int = 1
    window: int = 0

    @property
    def first_sparse(self) -> int:
        """The shortest prompt length at which selection drops a key."""
        return first_sparse_length(self.k, self.compression, self.window)

    @property
    def dense_limit(self) -> int:
        """The longest prompt length at which every key is kept."""
        return self.first_sparse - 1

    @property
    def scale(self) -> int:
        """compression * k + window: k itself for V3.2's rule (what auto lengths double)."""
        return self.compression * self.k + self.window

    @property
    def plain(self) -> bool:
        """V3.2's rule: no compression, no window (selection above k)."""
        return self.compression == 1 and self.window == 0

    def dense(self, length: int) -> bool:
        return int(length) < self.first_sparse

    def words(self) -> str:
        """How the report and notes name the limit: "index_topk 512", or with compression
        "index_topk 512 at 4:1 compression, window 128 (no selection up to 2,179 tokens)"."""
        if self.plain:
            return f"index_topk {self.k}"
        extra = f", window {self.window}" if self.window else ""
        return (f"index_topk {self.k} at {self.compression}:1 compression{extra} "
                f"(dense up to {self.dense_limit:,} tokens)")

    def short(self) -> str:
        """A figure's column tag: "k=512", or "≤2179 (4:1 k=512)"."""
        return f"k={self.k}" if self.plain else f"{self.dense_limit} ({self.compression}:1 k={self.k})"


def first_sparse_length(k: int, compression: int = 1, window: int = 0) -> int:
    """The shortest prompt length L with (L - window) // compression > k."""
    if k < 1 or compression < 1 or window < 0:
        raise ValueError("k and compression must be >= 1, window >= 0")
    return compression * (k + 1) + window


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def geometry_of(sources: Iterable[dict]) -> Regime | None:
    """The regime the first sources that give each value describe (module doc); None when
    any says attention "dense" or none gives a positive index_topk."""
    sources = [s for s in sources if isinstance(s, dict)]
    if any(str(s.get("attention", "")).lower() == "dense" for s in sources):
        return None
    k = next((v for s in sources if (v := _int(s.get("index_topk")))), None)
    if not k:
        return None
    c = next((v for s in sources for key in COMPRESSION_KEYS if (v := _int(s.get(key)))), 1)
    w = next((v for s in sources for key in WINDOW_KEYS if (v := _int(s.get(key))) is not None), 0)
    return Regime(k, max(1, c), w)


def as_regime(value: "Regime | int | None") -> Regime | None:
    """A bare index_topk is V3.2's rule."""
    if value is None or isinstance(value, Regime):
        return value
    return Regime(int(value))


# -- a manifest configuration's regime --------------------------------------------------
def _sources(entry: dict) -> list[dict]:
    server = entry.get("server") or {}
    models = [m for m in ((server.get("models") or {}).get("data") or []) if isinstance(m, dict)]
    info = server.get("server_info") if isinstance(server.get("server_info"), dict) else {}
    att = info.get("niah_attestation")
    facts = att.get("facts") if isinstance(att, dict) else None
    return [entry.get("axes") or {}, entry.get("settings") or {}, entry.get("geometry") or {}, *models,
            info, facts or {}]


def config_topk(entry: dict | None) -> int | None:
    """index_topk of one manifest configuration (None: dense or unknown): its axes, matrix
    settings, or what the server said about itself (GET /v1/models, /server_info)."""
    regime = config_regime(entry)
    return regime.k if regime else None


def config_regime(entry: dict | None) -> Regime | None:
    """The sparse regime (niah.regime) of one manifest configuration: index_topk as
    config_topk finds it, with the compression and index window from the same sources
    (the command line's `geometry` between the matrix settings and the server's word)."""
    return geometry_of(_sources(entry)) if isinstance(entry, dict) else None


def at_or_below_k(lengths: Iterable[int], k: Regime | int | None) -> list[int]:
    """The lengths where every key is kept (no selection): no longer than k under V3.2's
    rule, below the regime's first sparse length otherwise."""
    regime = as_regime(k)
    return [int(n) for n in lengths if regime is not None and regime.dense(int(n))]
