"""Simulators used by tests, benchmarks and the demo (never by the daemon in production)."""
