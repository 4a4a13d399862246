"""Recommendation pipelines: two-tower retrieval over an ANN index, filter, ranking, top-k.

See docs/recommend.md.
"""
