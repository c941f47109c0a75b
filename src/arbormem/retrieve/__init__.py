"""The read path: query analysis, candidates, fusion, packing and rendering."""
