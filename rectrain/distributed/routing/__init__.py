"""Input and output distribution: where each id goes (routes), the id all-to-all, pooled results back."""
