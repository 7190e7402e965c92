from rollwire.testing.store import redis_server

__all__ = ["redis_server"]
