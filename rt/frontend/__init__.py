"""The frontend: the request table and the engine that routes results to callers."""
