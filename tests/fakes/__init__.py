"""Fakes for tests (not the real thing): tests/fakes/slurmrestd.py."""
