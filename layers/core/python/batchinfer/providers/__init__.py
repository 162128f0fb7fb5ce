"""Providers: the only code that touches httpx; one module per backend protocol."""
