"""``arbormem check``: verify a SQLite memory's derived data against its transcript, and repair.

The verbatim transcript (the ``exchanges`` rows) is the source of truth; the tree, vectors,
full-text entries and term statistics are derived from it. ``check_user`` reads one user's
rows with raw SQL (so it sees exactly what is on disk, not what the store's caches believe)
and reports every disagreement as a typed ``Problem``:

- every completed exchange has a topic that exists, belongs to the user and is a leaf, unless
  it is queued for background placement (``backlog.py``): a completed exchange with no topic,
  no vector and no full-text entry is counted in ``UserCheck.queued``, not reported (a
  queued exchange with some of them is);
- leaf sizes and spans equal their member exchanges; inner sizes equal the sum of their
  children; inner spans cover the children's; parents exist; one root; no cycles; fan-out
  within ``max_children`` (``root_children`` at the top);
- every completed exchange has exactly one vector and one full-text entry, and no index entry
  points to a missing row or to a pending or failed exchange; a merged topic's alias vectors
  (``<topic>~<part>``, organize/aliases.py) belong to a leaf that lists the part, and
  every listed part has one;
- every row reads back (kind ``row``): exchanges' messages and metadata are strict JSON (no
  NaN/Infinity, which SQLite's JSON functions refuse: one such row made every recall of its
  user fail), text columns are valid text, times parse and lie in the accepted range
  (``validate.MIN_TIME``..``MAX_TIME``; past it date arithmetic overflows), the organiser's
  marks are an object; topics' JSON columns and times, and the change log's details, too.
  Such rows predate the validation layer or were written around it; a repair cannot rebuild
  them (the transcript is never modified) and leaves the user unrepaired: fix or delete the
  row by hand.

``repair_user`` rebuilds all derived data of a user from the transcript in one transaction:
the tree is placed again exchange by exchange through the write path (``ingest.py``), stored vectors are
reused when their dimension is right and missing ones are embedded. LLM labels, consolidation
merges and links are derived data too and are lost by a repair (the organiser makes them
again); the transcript is never touched.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .errors import ConfigError

if TYPE_CHECKING:
    from .memory import Memory
    from .store.sqlite import SQLiteStore

ProblemKind = Literal["tree", "vector", "text", "status", "termstats", "row"]


@dataclass(frozen=True)
class Problem:
    """One disagreement between the transcript and its derived data."""

    kind: ProblemKind
    item_id: str
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.item_id}: {self.message}"


@dataclass(frozen=True)
class UserCheck:
    """The result of checking one user."""

    user_id: str
    exchanges: int
    completed: int
    topics: int
    problems: tuple[Problem, ...]
    repaired: bool = False
    #: Completed exchanges queued for background placement (no topic, vector or text entry
    #: yet): not a problem; the next use of the memory places them.
    queued: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class CheckReport:
    """The result of checking (and maybe repairing) a memory file."""

    path: str
    users: tuple[UserCheck, ...] = field(default_factory=tuple)
    integrity: str = "ok"

    @property
    def ok(self) -> bool:
        return self.integrity == "ok" and all(u.ok for u in self.users)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "ok": self.ok, "integrity": self.integrity,
            "users": [
                {**{k: v for k, v in dataclasses.asdict(u).items() if k != "problems"},
                 "ok": u.ok, "problems": [dataclasses.asdict(p) for p in u.problems]}
                for u in self.users
            ],
        }


def _sqlite(memory: Memory) -> SQLiteStore:
    from .store.sqlite import SQLiteStore

    store = memory.store
    if not isinstance(store, SQLiteStore):
        raise ConfigError("arbormem check works on SQLite memories only")
    return store


def _raw(memory: Memory) -> sqlite3.Connection:
    return _sqlite(memory).raw_connection()


def _strict_json(raw: object, want: type) -> str | None:
    """Why ``raw`` is not a strict JSON value of type ``want`` (None when it is)."""
    if not isinstance(raw, str):
        return f"is {type(raw).__name__}, not JSON text"

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value = json.loads(raw, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        return f"is not valid JSON ({str(exc)[:80]})"
    if not isinstance(value, want):
        return f"is JSON {type(value).__name__}, not {want.__name__}"
    return None


def _time_problem(raw: object, required: bool) -> str | None:
    from .validate import MAX_TIME, MIN_TIME

    if raw is None:
        return "is missing" if required else None
    if not isinstance(raw, str):
        return f"is {type(raw).__name__}, not an ISO time"
    try:
        value = datetime.fromisoformat(raw)
        utc = (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    except (ValueError, OverflowError) as exc:
        return f"{raw[:40]!r} is not a usable time ({exc})"
    if not MIN_TIME <= utc <= MAX_TIME:
        return f"{raw[:40]} is outside {MIN_TIME.date()}..{MAX_TIME.date()} UTC"
    return None


def _row_problems(conn: sqlite3.Connection, user_id: str) -> list[Problem]:
    """Rows that would make a read of the user fail (see the module docstring)."""
    from .store.base import MARKS_KEY

    out: list[Problem] = []
    for xid, messages, metadata, user_at, assistant_at, user_text, assistant_text in conn.execute(
        "SELECT id, messages, metadata, user_at, assistant_at, user_text, assistant_text "
        "FROM exchanges WHERE user_id = ?", (user_id,),
    ):
        why = {"messages": _strict_json(messages, list), "metadata": _strict_json(metadata, dict),
               "user_at": _time_problem(user_at, True), "assistant_at": _time_problem(assistant_at, False),
               "user_text": None if isinstance(user_text, str) else "is not text",
               "assistant_text": None if isinstance(assistant_text, str) else "is not text"}
        if why["metadata"] is None:
            marks = json.loads(metadata).get(MARKS_KEY)
            if marks is not None and not isinstance(marks, dict):
                why["metadata"] = f"holds {MARKS_KEY!r} that is not an object"
        out += [Problem("row", xid, f"exchange {col} {msg}") for col, msg in why.items() if msg]
    for tid, keywords, terms, meta, first_at, last_at in conn.execute(
        "SELECT id, keywords, terms, meta, first_at, last_at FROM topics WHERE user_id = ?", (user_id,),
    ):
        why = {"keywords": _strict_json(keywords, list), "terms": _strict_json(terms, dict),
               "meta": _strict_json(meta, dict), "first_at": _time_problem(first_at, False),
               "last_at": _time_problem(last_at, False)}
        out += [Problem("row", tid, f"topic {col} {msg}") for col, msg in why.items() if msg]
    for cid, at, detail in conn.execute("SELECT id, at, detail FROM changes WHERE user_id = ?", (user_id,)):
        why = {"at": _time_problem(at, True), "detail": _strict_json(detail, dict)}
        out += [Problem("row", cid, f"change {col} {msg}") for col, msg in why.items() if msg]
    return out


# Long: one read of every table of the user, then each invariant in turn over those rows;
# split, the rows would have to be passed to a dozen helpers that share them.
def check_user(memory: Memory, user_id: str) -> UserCheck:
    """Check one user's tree and indexes against the transcript (read-only)."""
    conn = _raw(memory)
    max_children = memory.settings.tree.max_children
    problems: list[Problem] = _row_problems(conn, user_id)

    def bad(kind: ProblemKind, item: str, msg: str) -> None:
        problems.append(Problem(kind, item, msg))

    ex_rows = conn.execute(
        "SELECT rid, id, seq, status, topic_id FROM exchanges WHERE user_id = ? ORDER BY seq",
        (user_id,),
    ).fetchall()
    topics = {
        r[0]: {"rid": r[1], "kind": r[2], "parent": r[3], "start": r[4], "end": r[5], "size": r[6],
               "user": r[7], "meta": r[8]}
        for r in conn.execute(
            "SELECT id, rid, kind, parent_id, start_seq, end_seq, size, user_id, meta FROM topics "
            "WHERE user_id = ?", (user_id,),
        )
    }
    # Queued for background placement: completed with none of topic, vector and text entry.
    vec_ids = {r[0] for r in conn.execute(
        "SELECT item_id FROM vectors WHERE user_id = ? AND kind = 'exchange'", (user_id,))}
    from .store.sqlite import uid_token

    uid = uid_token(user_id)
    fts_rows = [r[0] for r in conn.execute("SELECT rowid FROM exchange_fts WHERE uid = ?", (uid,))]
    fts_rids = set(fts_rows)
    queued = {r[1] for r in ex_rows
              if r[3] == "completed" and r[4] is None and r[1] not in vec_ids and r[0] not in fts_rids}
    completed = [r for r in ex_rows if r[3] == "completed" and r[1] not in queued]
    kids: dict[str, list[str]] = defaultdict(list)
    for tid, t in topics.items():
        if t["parent"] is not None:
            kids[t["parent"]].append(tid)

    # -- exchanges -> leaves ----------------------------------------------------------------
    members: dict[str, list[int]] = defaultdict(list)
    for _rid, xid, seq, _status, topic_id in completed:
        if topic_id is None:
            bad("tree", xid, "completed exchange has no topic")
            continue
        leaf = topics.get(topic_id)
        if leaf is None:
            bad("tree", xid, f"topic {topic_id} does not exist for this user")
            continue
        if leaf["kind"] != "topic" or kids.get(topic_id):
            bad("tree", xid, f"topic {topic_id} is not a leaf")
        members[topic_id].append(seq)
    for _rid, xid, _seq, status, topic_id in ex_rows:
        if status != "completed" and topic_id is not None:
            bad("status", xid, f"{status} exchange is placed in topic {topic_id}")

    # -- the tree ---------------------------------------------------------------------------
    roots = [tid for tid, t in topics.items() if t["parent"] is None]
    if topics and len(roots) != 1:
        bad("tree", user_id, f"{len(roots)} roots (expected 1)")
    for tid, t in topics.items():
        if (t["kind"] == "root") != (t["parent"] is None):
            bad("tree", tid, f"{t['kind']} node with parent {t['parent']}")
        if t["parent"] is not None and t["parent"] not in topics:
            bad("tree", tid, f"parent {t['parent']} does not exist for this user")
        limit = memory.settings.tree.root_children if t["kind"] == "root" else max_children
        if len(kids.get(tid, ())) > limit:
            bad("tree", tid, f"fan-out {len(kids[tid])} > {limit}")
        if t["kind"] == "topic":
            seqs = members.get(tid, [])
            if t["size"] != len(seqs):
                bad("tree", tid, f"leaf size {t['size']} but {len(seqs)} completed exchanges")
            if seqs and (t["start"], t["end"]) != (min(seqs), max(seqs)):
                bad("tree", tid, f"leaf span {t['start']}..{t['end']} but exchanges "
                                 f"{min(seqs)}..{max(seqs)}")
        else:
            children = [topics[c] for c in kids.get(tid, ())]
            if t["kind"] == "theme" and not children:
                bad("tree", tid, "theme without children")
            if t["size"] != sum(c["size"] for c in children):
                bad("tree", tid, f"size {t['size']} but children sum to "
                                 f"{sum(c['size'] for c in children)}")
            starts = [c["start"] for c in children if c["start"] is not None]
            ends = [c["end"] for c in children if c["end"] is not None]
            if starts and (t["start"] is None or t["start"] > min(starts)
                           or t["end"] is None or t["end"] < max(ends)):
                bad("tree", tid, f"span {t['start']}..{t['end']} does not cover its children "
                                 f"{min(starts)}..{max(ends)}")
    # Depth of every node, with a cycle guard (topics sit at the depth their subject needs).
    for tid in topics:
        depth, cur, seen = 0, tid, set()
        while topics.get(cur, {}).get("parent") is not None and cur not in seen:
            seen.add(cur)
            cur = topics[cur]["parent"]
            depth += 1
        if cur in seen:
            bad("tree", tid, "parent chain has a cycle")

    # -- vectors ----------------------------------------------------------------------------
    from .organize.aliases import alias_id, alias_owner, is_alias
    from .store.state import TopicMeta

    def aliases_of(tid: str, t: dict[str, Any]) -> set[str]:
        if '"aliases"' not in t["meta"]:  # TopicMeta.aliases' key: skips parsing every unmerged topic
            return set()
        try:
            parts = TopicMeta.decode(json.loads(t["meta"])).aliases
        except (ValueError, AttributeError, TypeError):  # reported as a row problem
            return set()
        return {alias_id(tid, str(p)) for p in parts}

    have_alias: set[str] = set()
    by_id = {r[1]: r for r in ex_rows}
    dims: set[int] = set()
    have_vec: set[str] = set()
    for kind, item_id, blob in conn.execute(
        "SELECT kind, item_id, vec FROM vectors WHERE user_id = ?", (user_id,)
    ):
        dims.add(len(blob) // 4)
        if kind == "exchange":
            ex = by_id.get(item_id)
            if ex is None:
                bad("vector", item_id, "vector of a missing exchange")
            elif ex[3] != "completed":
                bad("status", item_id, f"{ex[3]} exchange has a vector")
            have_vec.add(item_id)
        elif is_alias(item_id):
            # A merged topic's part (organize/aliases.py): valid while the survivor is a
            # leaf that lists the part.
            owner = topics.get(alias_owner(item_id))
            if owner is None or owner["kind"] != "topic":
                bad("vector", item_id, "alias vector of a missing topic")
            elif item_id not in aliases_of(alias_owner(item_id), owner):
                bad("vector", item_id, "alias vector of a part its topic does not list")
            have_alias.add(item_id)
        elif item_id not in topics or topics[item_id]["kind"] == "root":
            bad("vector", item_id, "vector of a missing topic")
    for tid, t in topics.items():
        for a in aliases_of(tid, t) - have_alias:
            bad("vector", a, f"topic {tid} lists a part with no alias vector")
    if len(dims) > 1:
        bad("vector", user_id, f"vectors of several dimensions {sorted(dims)}")
    for r in completed:
        if r[1] not in have_vec:
            bad("vector", r[1], "completed exchange has no vector")

    # -- full text (rowid = exchanges.rid / topics.rid; fts_rows read above) ---------------------
    rid_of = {r[0]: r for r in ex_rows}
    seen_rows: set[int] = set()
    for rowid in fts_rows:
        if rowid in seen_rows:
            bad("text", str(rowid), "exchange has more than one full-text entry")
        seen_rows.add(rowid)
        ex = rid_of.get(rowid)
        if ex is None:
            bad("text", str(rowid), "full-text entry of a missing exchange")
        elif ex[3] != "completed":
            bad("status", ex[1], f"{ex[3]} exchange has a full-text entry")
    for r in completed:
        if r[0] not in seen_rows:
            bad("text", r[1], "completed exchange has no full-text entry")
    topic_rids = {t["rid"] for t in topics.values()}
    for (rowid,) in conn.execute("SELECT rowid FROM topic_fts WHERE uid = ?", (uid,)):
        if rowid not in topic_rids:
            bad("text", str(rowid), "full-text entry of a missing topic")

    # -- sequence counter ---------------------------------------------------------------------
    row = conn.execute("SELECT last_seq FROM user_state WHERE user_id = ?", (user_id,)).fetchone()
    top = max((r[2] for r in ex_rows), default=0)
    if ex_rows and (row is None or row[0] < top):
        bad("status", user_id, f"sequence counter {row[0] if row else None} below max seq {top}")

    return UserCheck(user_id=user_id, exchanges=len(ex_rows), completed=len(completed) + len(queued),
                     topics=len(topics), problems=tuple(problems), queued=len(queued))


def repair_user(memory: Memory, user_id: str) -> None:
    """Rebuild a user's tree, vectors, full-text entries and term statistics from the
    transcript, in one transaction (all or nothing). Pending and failed exchanges are taken
    out of every index; the transcript rows keep their ids, sequence numbers and texts."""
    store = _sqlite(memory)
    exchanges = list(store.iter_exchanges(user_id))
    done = [e for e in exchanges if e.status == "completed"]
    # Reuse stored vectors of the right dimension; embed the rest outside the transaction.
    kept = store.get_vectors(user_id, "exchange", [e.id for e in done])
    dim = memory.embedder.dim if any(e.id not in kept for e in done) else None
    if dim is not None:
        kept = {k: v for k, v in kept.items() if v.shape == (dim,) and np.isfinite(v).all()}
    missing = [e for e in done if e.id not in kept]
    if missing:
        fresh = memory.writer.embed([e.text for e in missing])
        kept.update({e.id: np.asarray(v, dtype=np.float32) for e, v in zip(missing, fresh, strict=True)})
    with store.transaction(user_id):
        store.clear_derived(user_id, max((e.seq for e in exchanges), default=0))
        # Placed again through the write path, as one unit (one tree session, flushed once).
        unit = memory.writer.unit(user_id)
        for ex in done:
            unit.add(dataclasses.replace(ex, topic_id=None), kept[ex.id], update=True)
        unit.finish()
        store.log_change(user_id, "repair", user_id, {"exchanges": len(done)})


def check(memory: Memory, *, user_id: str | None = None, repair: bool = False) -> CheckReport:
    """Check every user (or one), repairing the users with problems when ``repair`` is set;
    a repaired user is checked again and reported with ``repaired=True``."""
    conn = _raw(memory)
    integrity = ";".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
    users = [user_id] if user_id is not None else [
        r[0] for r in conn.execute(
            "SELECT user_id FROM exchanges UNION SELECT user_id FROM topics "
            "UNION SELECT user_id FROM vectors ORDER BY 1"
        )
    ]
    out: list[UserCheck] = []
    for u in users:
        result = check_user(memory, u)
        # Unreadable rows cannot be rebuilt from a transcript that is itself unreadable.
        if repair and not result.ok and not any(p.kind == "row" for p in result.problems):
            repair_user(memory, u)
            result = dataclasses.replace(check_user(memory, u), repaired=True)
        out.append(result)
    return CheckReport(path=str(getattr(memory.store, "path", "")), users=tuple(out),
                       integrity=integrity)


def embedder_spec(stored: str | None) -> str | None:
    """The ``make_embedder`` spec for an embedder recorded as ``NAME:DIM`` in a memory's meta
    (None when it cannot be rebuilt without help: pass ``--embedder``)."""
    if not stored:
        return None
    name = stored.rsplit(":", 1)[0]
    if name.startswith("hash-"):
        return "hash:" + name[len("hash-"):]
    return None


def report_json(report: CheckReport) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False)
