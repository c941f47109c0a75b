"""The write path: one unit of work that every writer uses.

``Memory.complete``/``add``/``add_many``/``import_exchanges``, ``add_document`` and the repair
of ``arbormem check`` all store exchanges the same way, through ``Writer``:

1. ``prepare`` validates an item (OpenAI-format messages, times, session, metadata) into an
   ``Exchange`` before anything is stored;
2. ``embed`` embeds outside any lock and *then* checks that the memory records this embedder
   (``check_embedder``): an embedder returning garbage raises ``EmbeddingError`` before it
   can bind a fresh memory to itself, so the memory is left unchanged;
3. inside the caller's ``store.transaction(user_id)``, a ``Unit`` places each exchange in the
   tree (``TreeSession.place``), writes its row and vector, and at ``finish`` writes the
   lexical keys of the new exchanges and their neighbours once (``lexical_keys.py``), the
   user's term statistics once, and the tree's changed nodes once.

``delete`` is the one deletion path (row, tree, every index, the neighbours' keys).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import validate as v
from .config import Settings
from .embed import Embedder
from .errors import ConfigError, ValidationError
from .lexical_keys import write_lexical_keys
from .models import Exchange
from .organize.shift import load_head
from .organize.title_vectors import phrase_vectors
from .organize.tree import TreeSession, new_id
from .store.base import Store
from .text import term_counts, terms

#: Keys an item of ``add_many`` may hold.
ITEM_KEYS = frozenset({"messages", "session_id", "at", "assistant_at", "metadata", "user_id"})
#: Store meta key of an unfinished re-embed (``reembed.py``); while it is set, reads and
#: writes refuse the memory.
REEMBED_KEY = "reembed"


def reembed_state(raw: str | None) -> dict[str, Any] | None:
    """The unfinished re-embed recorded in the store (``REEMBED_KEY``), or None."""
    if not raw:
        return None
    try:
        state = json.loads(raw)
        return {"target": str(state["target"]), "done": [str(u) for u in state["done"]]}
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"unreadable re-embed progress in store meta {REEMBED_KEY!r}: {raw!r}") from exc


class Writer:
    """Writes of one memory: validation, embedding, the embedder binding, units of work and
    deletion. ``Memory`` holds one (``Memory.writer``)."""

    def __init__(self, store: Store, embedder: Embedder, settings: Settings) -> None:
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self._lock = threading.Lock()
        self._checked = False
        #: Placement's topic-shift head for this embedder (organize/shift.py): None without one
        #: or with ``TreeSettings.shift_head`` off (the one place that setting is read).
        self.shift = load_head(embedder.shift_head) if embedder.shift_head and settings.tree.shift_head else None
        #: Titling's view of candidate phrases through this embedder (organize/title_vectors.py),
        #: shared by every unit of work of the memory; None: offline titles.
        self.phrases = phrase_vectors(embedder, settings.tree)

    # -- the embedder binding -------------------------------------------------------------------
    def check_embedder(self, *, bind: bool = True) -> None:
        """Record the embedder on first use and refuse another one later (vectors of two
        models must never share an index), or any while a re-embed is unfinished. With
        ``bind=False`` a memory that records no embedder yet is left unbound (a background
        completion stores no vector: the placement that embeds it binds)."""
        if self._checked:
            return
        with self._lock:
            spec = self.embedder.spec
            stored = self.store.get_meta("embedder")
            pending = reembed_state(self.store.get_meta(REEMBED_KEY))
            if pending is not None:
                # Some users hold vectors of the new model, others of the old one: neither
                # model may read or write until every user is done.
                raise ConfigError(
                    f"this memory is being re-embedded to {pending['target']!r} "
                    f"({len(pending['done'])} user(s) done); finish it with reembed() "
                    "(arbormem reembed) before using it"
                )
            if stored is None:
                if not bind:
                    return
                self.store.set_meta("embedder", spec)
            elif stored != spec:
                raise ConfigError(
                    f"this memory was built with embedder {stored!r}, not {spec!r}; "
                    "open it with the same embedder (or re-embed it)"
                )
            self._checked = True

    def recheck_embedder(self) -> None:
        """Forget that the binding was checked (a re-embed is starting)."""
        self._checked = False

    def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Vectors of ``texts`` (checked by the embedder), then the embedder binding: in this
        order, so a failing embedder leaves a fresh memory unbound."""
        vecs = list(self.embedder.embed(list(texts))) if texts else []
        self.check_embedder()
        return vecs

    # -- items ------------------------------------------------------------------------------------
    def prepare(self, uid: str, item: Mapping[str, Any], index: int) -> Exchange:
        """A validated completed exchange from one ``add_many`` item (``seq`` 0: allocated
        when stored). ``index`` names the item in error messages."""
        if not isinstance(item, Mapping):
            raise ValidationError(f"item {index}: must be a dict with 'messages'")
        unknown = [k for k in item if k not in ITEM_KEYS]
        if unknown:
            raise ValidationError(f"item {index}: unknown keys {sorted(map(repr, unknown))[:10]}")
        if item.get("user_id") not in (None, uid):
            raise ValidationError(f"item {index}: user_id differs from the import's user_id")
        s = self.settings
        try:
            msgs, user_text, assistant_text = v.messages(item.get("messages"), s.max_message_chars, s.limits)
            at = v.when(item.get("at"))
            assistant_at = v.when(item.get("assistant_at")) if item.get("assistant_at") is not None else at
            sid = v.session_id(item.get("session_id"))
            meta = v.metadata(item.get("metadata"), s.limits)
        except ValidationError as exc:
            raise ValidationError(f"item {index}: {exc}") from exc
        return Exchange(
            id=new_id("x"), user_id=uid, session_id=sid, seq=0, status="completed",
            messages=tuple(msgs), user_text=user_text, assistant_text=assistant_text,
            user_at=at, assistant_at=assistant_at, metadata=meta,
        )

    # -- units of work ------------------------------------------------------------------------------
    def unit(self, user_id: str) -> Unit:
        """A unit of work over the user's tree and indexes; use inside
        ``store.transaction(user_id)`` and end it with ``Unit.finish``."""
        return Unit(self, user_id)

    def write_lexical_keys(self, user_id: str, seqs: Sequence[int], known: dict[int, Exchange]) -> None:
        """Rewrite the lexical keys of the exchanges at ``seqs`` (``lexical_keys.py``)."""
        write_lexical_keys(self.store, user_id, seqs, known)

    def delete(self, ex: Exchange) -> None:
        """The one deletion path of an exchange (inside the caller's transaction): its row,
        its place in the tree (a topic or theme left empty goes), every index entry, and the
        lexical keys of its neighbours. The caller purges deleted text once at the end."""
        store = self.store
        if ex.status == "completed" and ex.topic_id:
            vec = store.get_vectors(ex.user_id, "exchange", [ex.id]).get(ex.id)
            tree = TreeSession(store, ex.user_id, self.settings.tree, phrases=self.phrases)
            # Row first: tree.remove recomputes the topic's span from its stored exchanges.
            store.delete_exchange(ex.id)
            tree.remove(ex, vec, term_counts(ex.text))
            store.add_term_df(ex.user_id, list(set(terms(ex.text))), delta=-1)
            tree.flush()
            # The neighbours' lexical keys quoted this exchange: rewrite them without it.
            self.write_lexical_keys(ex.user_id, [ex.seq - 1, ex.seq + 1], {})
        else:
            store.delete_exchange(ex.id)
        store.log_change(ex.user_id, "delete", ex.id, {"seq": ex.seq, "topic": ex.topic_id})


class Unit:
    """Completed exchanges stored together: placed and written one by one, indexed and
    flushed once (``finish``). Each lexical key is written once per unit rather than
    rewritten as each neighbour arrives, and the term statistics are updated once."""

    def __init__(self, writer: Writer, user_id: str) -> None:
        self.writer = writer
        self.user_id = user_id
        self.tree = TreeSession(writer.store, user_id, writer.settings.tree, writer.shift, writer.phrases)
        self.added: list[Exchange] = []
        self._counts: list[Mapping[str, int]] = []
        self._vecs: list[np.ndarray] = []

    def add(self, ex: Exchange, vec: np.ndarray, *, update: bool = False) -> Exchange:
        """Place ``ex`` and write its row (``update``: the row exists, as for a pending
        exchange being completed) and vector; returns it with its topic."""
        store = self.writer.store
        counts = term_counts(ex.text)
        ex = dataclasses.replace(ex, topic_id=self.tree.place(ex, vec, counts))
        if update:
            store.update_exchange(ex)
        else:
            store.insert_exchange(ex)
        # The vector is written at ``finish``, with the unit's others in one statement:
        # placement takes this unit's vectors from the tree session, never from the store.
        self._vecs.append(vec)
        self.added.append(ex)
        self._counts.append(counts)
        return ex

    @property
    def moved(self) -> Mapping[str, str]:
        """Exchanges placed earlier whose topic this unit changed (segmentation lag)."""
        return self.tree.moved

    def finish(self) -> None:
        """Write the vectors and lexical keys of the added exchanges (and their neighbours'
        keys), the term statistics and the changed tree nodes."""
        if self.added:
            self.writer.store.put_vectors(self.user_id, "exchange", [e.id for e in self.added], np.stack(self._vecs))
            self.writer.write_lexical_keys(self.user_id, sorted({e.seq + d for e in self.added for d in (-1, 0, 1)}),
                                           {e.seq: e for e in self.added})
            self.writer.store.add_term_counts(self.user_id, Counter(t for c in self._counts for t in c))
        self.tree.flush()


__all__ = ["ITEM_KEYS", "REEMBED_KEY", "Unit", "Writer", "reembed_state"]
