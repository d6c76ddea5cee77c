"""The measuring harness behind ``flashattn-lite`` and ``benchmarks/``: sweeps, peers, memory probes,
JSON/CSV/plots. Benchmarks never assert on time; they report it."""
