"""The HTTP API (FastAPI): thin routes over each batch API's operations (`operations/`) and the service's
use cases."""
