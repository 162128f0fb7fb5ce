"""The HTTP API (FastAPI): thin routes over the service modules."""
