"""The organiser: placing exchanges in the topic tree, labels, summaries, consolidation."""
