"""API Gateway HTTP API in front of the api function: one `$default` route, one `$default` stage."""

from __future__ import annotations

import json

import jsii
from aws_cdk import RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import InfraConfig
from infra.nag import acknowledge

# Access log fields: who called what and how it went. Never bodies (prompts) or auth headers.
ACCESS_LOG_FORMAT = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod",
    "path": "$context.path",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "latency": "$context.responseLatency",
    "integrationLatency": "$context.integrationLatency",
    "integrationStatus": "$context.integrationStatus",
    "integrationError": "$context.integrationErrorMessage",
    "errorMessage": "$context.error.message",
}


@jsii.implements(apigwv2.IAccessLogSettings)
class _AccessLogSettings:
    def __init__(self, log_group: logs.ILogGroup) -> None:
        self._destination = apigwv2.LogGroupLogDestination(log_group)

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigw.AccessLogFormat:
        return apigw.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FORMAT))


class HttpApiFront(Construct):
    """HTTP API whose every route goes to the api function (FastAPI routes inside)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        function: lambda_.IFunction,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, construct_id)
        self.http_api = apigwv2.HttpApi(
            self,
            "HttpApi",
            api_name=f"{config.stage}-batchinfer",
            description=f"batchinfer {config.stage}: OpenAI- and Anthropic-compatible batch API",
            # Catch-all `$default` route: FastAPI does the routing, 404s and 405s itself.
            default_integration=integrations.HttpLambdaIntegration("Api", function),
            # Our own `$default` stage below, because the implicit one cannot take access-log settings.
            create_default_stage=False,
        )
        access_logs = logs.LogGroup(
            self,
            "AccessLogs",
            retention=log_retention,
            removal_policy=RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY,
        )
        self.stage = apigwv2.HttpStage(
            self,
            "DefaultStage",
            http_api=self.http_api,
            stage_name="$default",
            auto_deploy=True,
            access_log_settings=_AccessLogSettings(access_logs),
            throttle=apigwv2.ThrottleSettings(
                rate_limit=config.api_throttle_rate_limit, burst_limit=config.api_throttle_burst_limit
            ),
        )
        # Optional custom domain: a base URL that outlives the API (the execute-api id changes if the API is
        # ever replaced). DNS stays with the operator: point the name at the DomainTarget output.
        self.domain: apigwv2.DomainName | None = None
        if config.domain_name and config.certificate_arn:
            self.domain = apigwv2.DomainName(
                self,
                "Domain",
                domain_name=config.domain_name,
                certificate=acm.Certificate.from_certificate_arn(self, "Certificate", config.certificate_arn),
                endpoint_type=apigwv2.EndpointType.REGIONAL,
                security_policy=apigwv2.SecurityPolicy.TLS_1_2,
            )
            apigwv2.ApiMapping(self, "Mapping", api=self.http_api, domain_name=self.domain, stage=self.stage)
            # The execute-api URL keeps working as well; keep it for checks, publish the domain.
        self._domain_name = config.domain_name
        acknowledge(
            self.http_api,
            "AwsSolutions-APIG4",
            "The service authenticates every request itself with hashed API keys (Authorization: Bearer or "
            "X-Api-Key), as the OpenAI and Anthropic SDKs send them; an API Gateway authorizer cannot "
            "serve both schemes and would add a second key store.",
        )

    @property
    def url(self) -> str:
        """Base URL for clients: the custom domain's when set, else the `$default` stage's (no stage path)."""
        if self.domain is not None:
            return f"https://{self._domain_name}"
        return self.http_api.api_endpoint
