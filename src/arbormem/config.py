"""Settings: constructor arguments > environment (``ARBORMEM_*``) > defaults.

Nested groups use ``__`` in environment names, e.g. ``ARBORMEM_LLM__BASE_URL``. Thresholds
below are calibrated for the bundled all-MiniLM-L6-v2 embedder; ``docs/architecture.md`` says
how.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class LLMSettings(BaseModel):
    """An optional OpenAI-compatible chat endpoint. Unset base_url/model = offline."""

    base_url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = None
    timeout: float = 30.0
    max_retries: int = 2
    concurrency: int = 4
    # Seconds the LLM step of one recall may take in all (building the directory, the call,
    # waiting for a free connection). Past it the recall goes on with the offline ranking and
    # the call is abandoned; a user never waits for a slow model longer than this. 1.2 s keeps
    # recall interactive (issue 23: <= 1.5 s added at p95 with a slow local model; applying a
    # plan that arrives in time takes the rest). A hosted model answering a planner prompt in
    # well under a second fits; a slow local one is simply not waited for.
    recall_deadline: float = Field(default=1.2, gt=0)
    # Seconds one call of a role may take, by role (labeler, segmenter, router, veto, detail,
    # planner, ...): ARBORMEM_LLM__TIMEOUTS='{"labeler": 60}' or ARBORMEM_LLM__TIMEOUTS__LABELER=60.
    # A role not named here gets ``timeout``. A timed-out call is never retried.
    timeouts: dict[str, float] = Field(default_factory=dict)
    # Seconds the LLM calls of one ``organize`` run (re-segmentation + labels) may take in all;
    # the run stops when they are spent and the rest waits for the next run.
    organize_budget: float = Field(default=120.0, gt=0)
    # Seconds a prompt that timed out or got an invalid answer is not sent again (0: resend).
    failure_ttl: float = Field(default=3600.0, ge=0)
    # Circuit breaker across calls: after this many endpoint failures in a row (errors,
    # timeouts, missed deadlines; not bad answers) calls are skipped for the cooldown, then one
    # probe call decides whether the endpoint is back. 0 turns it off.
    breaker_failures: int = Field(default=3, ge=0)
    breaker_cooldown: float = Field(default=30.0, ge=0)

    @field_validator("timeouts")
    @classmethod
    def _positive_timeouts(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [role for role, seconds in v.items() if not seconds > 0]
        if bad:
            raise ValueError(f"role timeouts must be > 0 seconds: {', '.join(sorted(bad))}")
        return v


class TreeSettings(BaseModel):
    """Placement of exchanges in the topic tree (see docs/architecture.md, "Placement")."""

    # A theme with more children than this gets sub-themes (its children grouped by
    # similarity); the top level is grouped only past ``root_children``.
    max_children: int = Field(default=8, ge=3, le=64)
    root_children: int = Field(default=32, ge=3, le=4096)
    # Segmentation (organize/tree.py, docs/tree.md): the open topic's newest exchange and the
    # next one stay in the topic when their average link (mean cosine, MiniLM) to the rest of
    # it is at least this; otherwise a new topic starts at the newest exchange.
    continue_threshold: float = 0.22
    # ... but a short reply (at most ``reply_words`` words: "Monday at 11.", "yes please")
    # continues at this lower link: its vector is too thin to tell a shift (docs/tree.md).
    reply_threshold: float = 0.15
    reply_words: int = 6
    # Judge the newest exchange together with the next one (one exchange of lag).
    lookahead: bool = False
    # With an embedder that has a trained shift head (the bundled MiniLM: organize/shift.py),
    # the head decides instead, within a session: a new topic starts where its probability
    # that the exchange opens one passes ``shift_threshold`` (docs/tree.md, "The shift head").
    # False keeps the link rule above for every embedder. (Not with ``lookahead``.)
    shift_head: bool = True
    shift_threshold: float = Field(default=0.60, ge=0.0, le=1.0)
    # ... or above ``shift_spike_at`` and ``shift_spike`` times the median of the session's
    # judgements so far (a spike: the head's calibration differs from one style of
    # conversation to another; docs/tree.md). 0 turns the spike test off.
    shift_spike: float = Field(default=2.0, ge=0.0)
    shift_spike_at: float = Field(default=0.3, ge=0.0, le=1.0)
    # With the head, a user message of at least ``link_words`` words also leaves the open
    # topic when its average link to it falls below ``link_floor`` (0 words: the head alone)
    link_words: int = Field(default=10, ge=0)
    link_floor: float = 0.20
    # ... and a message of any length whose average link to the open topic is below
    # ``unlinked_floor`` leaves it when the head gives at least ``unlinked_p`` (a short switch
    # that shares nothing with the topic: "Do we have to tell the neighbours?" after hot-sauce
    # labels; docs/tree.md, "Unlinked switches"). A floor of 0 turns it off.
    unlinked_floor: float = Field(default=0.10, ge=0.0)
    unlinked_p: float = Field(default=0.25, ge=0.0, le=1.0)
    # ... but neither of these two link rules judges a conversation in short lines: when the
    # replies of the exchange and the two before it (same session) average fewer than
    # ``terse_replies`` words (people chatting, a terse booking system), the head alone decides.
    # A low link is routine there (docs/tree.md, "Terse conversations"). 0: the rules always judge.
    terse_replies: int = Field(default=12, ge=0)
    # With the head, an exchange it gives at least ``return_p`` also leaves the open topic when
    # the topic it links to best is another subject's from an earlier session (another
    # top-level branch), at ``return_margin`` above both the theme threshold and its link to
    # the open topic: a return mid-session (docs/tree.md, "Returns mid-session"). 0 turns it off.
    return_margin: float = Field(default=0.15, ge=0.0)
    return_p: float = Field(default=0.15, ge=0.0, le=1.0)
    # With the head, a message that adds another request ("Also, can I...", "one more thing",
    # "while I have you"; organize/tree.py ``adds_request``) leaves the open topic when the
    # head gives it at least ``request_p`` (docs/tree.md, "Added requests"). 1 turns it off.
    request_p: float = Field(default=0.20, ge=0.0, le=1.0)
    # With the head, a message of at most ``back_words`` words that points back at what was
    # just said ("Does it have parking?", "Is it free?") opens a topic only past
    # ``shift_threshold``: neither the spike test nor the unlinked rule judge it (docs/tree.md,
    # "Short questions that refer back"). 0 turns this off.
    back_words: int = Field(default=6, ge=0)
    # With the head, a message that opens with a command verb and points at nothing just said
    # ("set the heat to 68", "call mum"; organize/tree.py ``gives_command``) leaves the open
    # topic when the head gives it at least ``command_p`` (docs/tree.md, "Commands"). 1: off.
    command_p: float = Field(default=0.15, ge=0.0, le=1.0)
    # A new run rejoins an earlier topic (same thread) at this average link ...
    thread_threshold: float = 0.50
    # ... and joins the theme it relates to (or forms one with a lone related topic) at this.
    theme_threshold: float = 0.25
    # ... raised to this much above the user's background (the mean cosine between any two of
    # their exchanges), so a memory where everything is alike is not one theme (docs/tree.md).
    theme_margin: float = 0.10
    # Consolidation's short-returns step: a closed topic of at most `small_topic` exchanges
    # left alone at the top level joins the bigger branch it relates to best when the average
    # link reaches `small_topic_slack` below the theme threshold above (docs/tree.md, "Short
    # returns"). A slack of 0 turns the step off.
    small_topic: int = Field(default=3, ge=0)
    small_topic_slack: float = Field(default=0.12, ge=0)
    # ... and only when that branch links at least this much more than the next best: a
    # one-off question links about as weakly to several branches (docs/tree.md, "Short returns").
    small_topic_gap: float = Field(default=0.06, ge=0)
    # ... and only a topic of at least this many exchanges: one exchange alone is as often a
    # one-off question as a brief return, and their links cannot tell them apart (docs/tree.md,
    # "One exchange alone stays alone"). 1 lets a single exchange join as before.
    small_topic_min: int = Field(default=2, ge=1)
    # Consolidation's related-branches step: two top-level branches join when their average
    # link plus this weight times the words they share (organize/heuristics.shared_words)
    # reaches the theme threshold (docs/tree.md, "Related branches"). 0 turns the step off.
    related_words: float = Field(default=0.3, ge=0)
    # Consolidation's misplaced-topics step: a closed topic under a top-level theme moves to
    # the top-level branch it relates to best when that link reaches the theme threshold and
    # beats its link to the rest of its own branch; one that relates to nothing (below the
    # short returns' threshold) goes to the top level (docs/tree.md, "Misplaced topics").
    rehome_topics: bool = True
    # With an embedder that embeds short phrases meaningfully (``Embedder.names_phrases``: the
    # bundled MiniLM), a theme's title is the candidate phrase nearest its centroid among the
    # best-scored few (organize/title_vectors.py, docs/titles.md). False: counts alone.
    title_vectors: bool = True
    # Nearest topics (by centroid) considered when homing a run.
    home_candidates: int = Field(default=24, ge=1, le=1000)
    # A gap this long between exchanges (or a new session id) always closes the open topic
    # (the next run may still go home to it as the same thread).
    session_gap_hours: float = 3.0
    # A topic stops growing at this many exchanges, so packets stay small.
    max_topic_size: int = 24


class RecallSettings(BaseModel):
    """Defaults of ``Memory.recall``."""

    max_tokens: int = 1024
    recent: int = 2
    # The recent exchanges never take more than this share of the budget.
    recent_share: float = 0.05
    # Candidates taken from each index (dense and lexical) before fusion.
    candidates: int = 200
    # Weights measured on the LoCoMo development split with `arbormem eval locomo` and the
    # ranking ablation in docs/recall.md; all are generic signals, none refers to the data.
    lexical_weight: float = 1.0    # fused = z(dense) + w * z(BM25) (0.7 before stemming)
    neighbour_weight: float = 0.3  # + w * the best adjacent same-session exchange's score
    neighbours: int = 40           # strongest hits whose missing neighbours are fetched
    topic_lift: float = 0.5        # + lift * the exchange's topic relevance (0..1)
    time_boost: float = 0.5        # + boost inside the query's resolved time window
    dated_boost: float = 3.0       # ... instead, when the query names a day ("on 3 June, 2023")
    topic_share: float = 1.0       # most of the budget one topic may take
    # Exact terms: a query term that is identifier-like (an order number, a long number, a
    # code mixing letters and digits) or rare in the user's memory (in at most exact_max_df
    # exchanges) lifts the exchanges whose own messages hold it by w x the share of such terms
    # they hold: one verbatim hit must not rank below dense noise (issue 19).
    exact_weight: float = 6.0
    exact_max_df: int = 0          # rare words count from here down (0: identifiers only)
    exact_max_hits: int = 50       # an identifier in more exchanges than this lifts none
    coverage_weight: float = 3.0   # + w * share of the query's terms found in one message
    coverage_depth: int = 60       # how many of the best exchanges the coverage step reads
    feedback_weight: float = 0.8   # + w * z(BM25 of the best exchanges' distinctive terms)
    feedback_docs: int = 10        # best exchanges whose terms make the feedback query
    feedback_terms: int = 20       # terms in the feedback query
    feedback_keep: int = 20        # best exchanges that keep their places ahead of the rest
    feedback_depth: int = 60       # exchanges below those that feedback re-scores
    # A query that names some participants of a multi-party chat (messages with `name`) gets
    # only their lines from the exchanges below the best ones, which stay whole until they
    # have taken this share of the budget (0.2-0.33 is one plateau for all questions; 0.2
    # holds more of a list question's scattered evidence: docs/recall.md, step 11).
    speaker_focus: bool = True
    speaker_focus_share: float = 0.2
    # Relevance floor (issue 18; docs/recall.md, "Relevance floor"): a candidate's relevance is
    # its dense cosine + relevance_coverage x the share of the query's terms one of its messages
    # holds. A query whose best candidate is below min_relevance gets no exchange beyond the
    # recent window (and search() no hit); one that reaches it gets every candidate above
    # floor_share x min_relevance, by the usual ranking. Calibrated by
    # scripts/calibrate_relevance.py for the bundled MiniLM (Embedder.relevance_floor); None
    # takes the embedder's calibrated floor (none for an uncalibrated model: off), 0 turns the
    # floor off (budget filling).
    min_relevance: float | None = Field(default=None, ge=0)
    relevance_coverage: float = Field(default=0.3, ge=0)
    floor_share: float = Field(default=0.33, ge=0, le=1)


class Limits(BaseModel):
    """Bounds on what one call may store (docs/robustness.md, "Bounds"). Past any of them the
    call raises ``ValidationError`` and stores nothing; the HTTP server derives its body
    limits from them. ``Settings.max_message_chars`` bounds one message's text."""

    # Messages in one exchange (an agent turn with tool calls and outputs is one exchange).
    max_messages: int = Field(default=1_000, ge=1)
    # Characters of text over all messages of one exchange: what is embedded, indexed and
    # counted. Keeps any one exchange well inside the token counter's and the model's reach.
    max_exchange_chars: int = Field(default=400_000, ge=1)
    # The exchange's messages as stored (JSON, UTF-8): text plus non-text content parts and
    # any other message keys (tool calls, ...).
    max_exchange_bytes: int = Field(default=2 * 1024 * 1024, ge=1)
    # An exchange's metadata as stored (JSON, UTF-8).
    max_metadata_bytes: int = Field(default=1024 * 1024, ge=1)
    # Nesting of metadata and of message values (a dict or list inside another is one level).
    max_json_depth: int = Field(default=32, ge=1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ARBORMEM_", env_nested_delimiter="__", extra="ignore"
    )

    db: str = "arbormem.db"
    database_url: str | None = None
    embedder: str = "local"
    torch_threads: int = Field(default=1, ge=1)
    embed_batch_size: int = Field(default=64, ge=1)
    max_message_chars: int = Field(default=200_000, ge=1)
    # Where ``complete()`` embeds and places the exchange (docs/architecture.md, "Background
    # placement"): "inline" in the call (it returns the exchange with its topic), or
    # "background": the call stores the reply durably and returns, and a worker thread embeds
    # and places completed exchanges in batches; every read of the tree or indexes waits for
    # the user's queue first. ARBORMEM_PLACEMENT=background.
    placement: Literal["inline", "background"] = "inline"
    # Most exchanges one background batch embeds and places (a read waits for at most the
    # batch in progress, then places the rest itself).
    placement_batch: int = Field(default=64, ge=1)
    # Seconds ``close()`` waits for the worker to place what is queued; what is left stays
    # queued in the store and is placed on the next use of the memory.
    placement_close_timeout: float = Field(default=30.0, ge=0)
    limits: Limits = Limits()
    llm: LLMSettings = LLMSettings()
    tree: TreeSettings = TreeSettings()
    recall: RecallSettings = RecallSettings()
