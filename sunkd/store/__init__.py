"""Event log and read models over SQLAlchemy (PostgreSQL in production, SQLite embedded)."""
