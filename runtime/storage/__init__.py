"""Storage: the table models (SQLModel, one schema definition) and the SQLite backend."""
