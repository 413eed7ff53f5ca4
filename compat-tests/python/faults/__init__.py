"""The fault harness (issue 26): real tessera nodes in network namespaces,
nemeses from a seed, queue and transactional workloads, and a checker over
what is read back after healing. Run it with ``./scripts/faults.sh``;
docs/RELIABILITY.md says what each part does."""
