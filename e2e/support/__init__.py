"""What the end-to-end tests and the benchmarks share: the cluster, the operator process, the
real nodes, the fake Hub and leaders, spec helpers. No test module imports another."""
