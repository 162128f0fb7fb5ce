"""API function: the FastAPI app behind API Gateway (HTTP API), through Mangum."""

from aws_lambda_powertools.logging import correlation_paths
from mangum import Mangum

from batchinfer.api.app import create_app
from batchinfer.observability import logger, metrics, tracer

app = create_app()
_asgi = Mangum(app, lifespan="off")


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: object) -> dict:
    return _asgi(event, context)
