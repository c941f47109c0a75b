"""What the lexical topic index sees of a topic: its labels, the LLM's retrieval terms and
trigger while those labels hold, and a merged topic's parts' pre-merge labels
(``organize/aliases.py``)."""

from __future__ import annotations

from ..store.base import TopicRecord


def llm_labelled(node: TopicRecord) -> bool:
    """Whether the topic's labels are the LLM's: they stay until the topic changes size (then
    offline labels return and the organiser labels it again)."""
    return node.meta.label_source == "llm" and node.meta.label_size == node.size


def label_text(node: TopicRecord) -> str:
    """A topic's labels as indexed text: title, keywords, summary (one line each)."""
    return f"{node.title}\n{' '.join(node.keywords)}\n{node.summary}"


def topic_index_text(node: TopicRecord) -> str:
    """The topic's full-text entry: title, keywords and summary (and, for LLM-labelled topics,
    the retrieval terms and trigger; for a merged topic, its parts' pre-merge labels)."""
    extra = " ".join(node.meta.retrieval_terms)
    trigger = node.meta.trigger
    tail = f"\n{extra}\n{trigger}" if llm_labelled(node) and (extra or trigger) else ""
    parts = "".join(f"\n{t}" for t in node.meta.part_text.values())
    return f"{label_text(node)}{tail}{parts}"


__all__ = ["label_text", "llm_labelled", "topic_index_text"]
