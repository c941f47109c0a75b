"""Why background placement groups its batches by length (``backlog.length_groups``).

Embeds the one-by-one texts of ``arbormem bench`` (the 300 exchanges after the first SIZE) in
chunks as a queue would hold them (unsorted), each chunk either in one call (the embedder
pads every text of a batch to the longest) or in groups of similar length, and one by one::

    python scripts/embed_grouping.py --locomo ../shared/data/locomo/26.json \\
        --locomo ../shared/data/locomo/30.json --locomo ../shared/data/locomo/41.json

Prints texts per second for each workload, chunk size and grouping.
"""

from __future__ import annotations

import time

import click


@click.command()
@click.option("--locomo", "files", multiple=True, help="LoCoMo files (the LoCoMo-derived workload).")
@click.option("--size", default=2000, show_default=True, help="Bulk size before the one-by-one texts.")
def main(files: tuple[str, ...], size: int) -> None:
    from arbormem.backlog import length_groups
    from arbormem.embed import make_embedder
    from arbormem.eval.bench import _item_text, locomo_items, synthetic_items

    workloads = {"synthetic": [_item_text(i) for i in synthetic_items(size + 300)[0][size:]]}
    if files:
        workloads["locomo"] = [_item_text(i) for i in locomo_items(list(files), size + 300)[0][size:]]
    emb = make_embedder("local")
    emb.embed(["warm up"])
    for name, texts in workloads.items():
        t0 = time.perf_counter()
        for t in texts:
            emb.embed([t])
        click.echo(f"{name}: one by one {len(texts) / (time.perf_counter() - t0):.1f}/s")
        for chunk in (64, 16):
            for grouped in (False, True):
                t0 = time.perf_counter()
                for c in range(0, len(texts), chunk):
                    part = texts[c : c + chunk]
                    groups = length_groups([len(t) for t in part]) if grouped else [list(range(len(part)))]
                    for g in groups:
                        emb.embed([part[i] for i in g])
                rate = len(texts) / (time.perf_counter() - t0)
                click.echo(f"{name}: chunks of {chunk}, {'grouped by length' if grouped else 'as they came'} "
                           f"{rate:.1f}/s")


if __name__ == "__main__":
    main()
