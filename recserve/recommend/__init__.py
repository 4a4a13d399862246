"""Recommendation pipelines: two-tower retrieval over an ANN index, a filter, ranking, top-k (docs/recommend.md)."""
