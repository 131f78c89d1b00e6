"""Store backends: Redis (and Redis-API servers) and SQLite."""
