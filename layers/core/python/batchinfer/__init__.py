"""Batch inference core: domain, storage, scheduling and providers shared by every function."""
