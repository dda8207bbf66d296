"""Benchmarks and the op / host-read counter (what makes decoding slow on a GPU, counted on any device)."""
