"""A production-ready deployment, infrastructure parts: monitoring an on-call engineer can act on (alarms that
read what the functions publish, each notifying the alarm topic, and the dashboard) and a metrics namespace per
stage that the functions emit in. Assertions on the synthesized template (see conftest for the two
deployments)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from infra.functions import WORKER
from tests.infra.conftest import (
    EDGE_TOPIC_ARN,
    FUNCTION_NAMES,
    INDEXES,
    Synth,
    env,
    function_resource,
)


def alarms_of(synth: Synth) -> dict[str, dict[str, Any]]:
    return {a["Properties"]["AlarmName"]: a["Properties"] for a in synth.resources("AWS::CloudWatch::Alarm").values()}


def metric_stats(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    """The metrics an alarm reads: its own, or those of its math expression."""
    if "MetricName" in alarm:
        return [
            {
                "Namespace": alarm["Namespace"],
                "MetricName": alarm["MetricName"],
                "Dimensions": alarm.get("Dimensions", []),
            }
        ]
    return [m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m]


def dashboard_body(synth: Synth) -> str:
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    return json.dumps(dashboard["Properties"]["DashboardBody"])


# -- metrics namespace per stage ----------------------------------------------------------------------------


def application_namespaces(synth: Synth) -> set[str]:
    found = {
        m["Namespace"]
        for alarm in alarms_of(synth).values()
        for m in metric_stats(alarm)
        if not m["Namespace"].startswith("AWS/")
    }
    body = json.loads(
        _joined(next(iter(synth.resources("AWS::CloudWatch::Dashboard").values()))["Properties"]["DashboardBody"])
    )
    found |= {
        metric[0]
        for widget in body["widgets"]
        for metric in widget.get("properties", {}).get("metrics", [])
        if metric and isinstance(metric[0], str) and not metric[0].startswith("AWS/")
    }
    return found


def _joined(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "".join(p if isinstance(p, str) else "X" for p in value["Fn::Join"][1])


def test_two_stages_synthesize_different_namespaces(synth: Synth, edge_synth: Synth) -> None:
    assert application_namespaces(synth) == {"batchinfer/dev"}
    assert application_namespaces(edge_synth) == {"batchinfer/qa"}
    for built, namespace in ((synth, "batchinfer/dev"), (edge_synth, "batchinfer/qa")):
        for name in FUNCTION_NAMES:
            assert env(built, name)["POWERTOOLS_METRICS_NAMESPACE"] == namespace, name
        built.template.has_output("MetricsNamespace", {"Value": namespace})


# -- monitoring ----------------------------------------------------------------------------------------------


def test_dynamodb_throttle_and_system_error_alarms(synth: Synth) -> None:
    alarms = alarms_of(synth)
    table = {"Ref": synth.logical_id(synth.stack.storage.table)}
    throttles = alarms["dev-batchinfer-table-throttles"]
    assert {(m["MetricName"], json.dumps(m["Dimensions"])) for m in metric_stats(throttles)} == {
        (name, json.dumps([{"Name": "TableName", "Value": table}]))
        for name in ("ReadThrottleEvents", "WriteThrottleEvents")
    }
    for index in INDEXES:
        alarm = alarms[f"dev-batchinfer-gsi-{index.replace('_', '-')}-throttles"]
        for metric in metric_stats(alarm):
            assert metric["Namespace"] == "AWS/DynamoDB"
            assert {"Name": "GlobalSecondaryIndexName", "Value": index} in metric["Dimensions"]
            assert {"Name": "TableName", "Value": table} in metric["Dimensions"]
        assert {m["MetricName"] for m in metric_stats(alarm)} == {"ReadThrottleEvents", "WriteThrottleEvents"}
        assert alarm["Threshold"] == 0 and alarm["TreatMissingData"] == "notBreaching"
    errors = alarms["dev-batchinfer-table-system-errors"]
    operations = {d["Value"] for m in metric_stats(errors) for d in m["Dimensions"] if d["Name"] == "Operation"}
    assert {m["MetricName"] for m in metric_stats(errors)} == {"SystemErrors"}
    assert operations >= {"GetItem", "PutItem", "UpdateItem", "Query", "TransactWriteItems", "BatchWriteItem"}
    body = dashboard_body(synth)
    for needle in ("ReadThrottleEvents", "WriteThrottleEvents", "GlobalSecondaryIndexName", "SystemErrors"):
        assert needle in body


def test_scheduler_alarms_watch_the_stage_s_own_schedule_group(synth: Synth) -> None:
    ((group_id, group),) = synth.resources("AWS::Scheduler::ScheduleGroup").items()
    assert group["Properties"]["Name"] == "dev-batchinfer"
    for schedule in synth.resources("AWS::Scheduler::Schedule").values():
        assert schedule["Properties"]["GroupName"] in ({"Ref": group_id}, "dev-batchinfer")
    alarms = alarms_of(synth)
    for alarm_name, metric_name in (
        ("dev-batchinfer-schedules-dropped", "InvocationDroppedCount"),
        ("dev-batchinfer-schedules-target-errors", "TargetErrorCount"),
    ):
        alarm = alarms[alarm_name]
        assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == ("AWS/Scheduler", metric_name, "Sum")
        assert alarm["Dimensions"] == [{"Name": "ScheduleGroup", "Value": "dev-batchinfer"}]
    body = dashboard_body(synth)
    assert "InvocationDroppedCount" in body and "TargetErrorCount" in body


def test_worker_duration_alarm_is_80_percent_of_its_timeout(synth: Synth) -> None:
    alarm = alarms_of(synth)["dev-batchinfer-worker-duration-p99"]
    timeout_s = function_resource(synth, "worker")[1]["Properties"]["Timeout"]
    assert timeout_s == WORKER.timeout.to_seconds()
    assert (alarm["MetricName"], alarm["ExtendedStatistic"]) == ("Duration", "p99")
    assert alarm["Threshold"] == 0.8 * timeout_s * 1000
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function_resource(synth, "worker")[0]}}]


def test_storage_layer_emf_alarms_cover_every_function(synth: Synth) -> None:
    alarms = alarms_of(synth)
    for alarm_name, metric_name in (
        ("dev-batchinfer-transaction-conflicts", "TransactionConflicts"),
        ("dev-batchinfer-condition-failures", "ConditionalCheckFailures"),
    ):
        alarm = alarms[alarm_name]
        metrics = metric_stats(alarm)
        assert {m["MetricName"] for m in metrics} == {metric_name}
        assert {m["Namespace"] for m in metrics} == {"batchinfer/dev"}
        assert {d["Value"] for m in metrics for d in m["Dimensions"] if d["Name"] == "service"} == {
            env(synth, name)["POWERTOOLS_SERVICE_NAME"] for name in FUNCTION_NAMES
        }
        assert all(len(m["Dimensions"]) == 1 for m in metrics)  # service only, as Powertools emits them
        assert alarm["TreatMissingData"] == "notBreaching"
        assert metric_name in dashboard_body(synth)


def emf_read(synth: Synth, namespace: str, service: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """(metric name, dimension set) of every metric of `service` in `namespace` that an alarm or a dashboard
    widget reads."""
    read = set()
    for alarm in alarms_of(synth).values():
        for metric in metric_stats(alarm):
            if metric["Namespace"] != namespace:  # AWS metrics: their dimension values may be tokens
                continue
            dims = frozenset((d["Name"], d["Value"]) for d in metric["Dimensions"])
            if ("service", service) in dims:
                read.add((metric["MetricName"], dims))
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    for widget in json.loads(_joined(dashboard["Properties"]["DashboardBody"]))["widgets"]:
        for metric in widget.get("properties", {}).get("metrics", []):
            if not (metric and isinstance(metric[0], str) and metric[0] == namespace):
                continue
            pairs = [part for part in metric[2:] if isinstance(part, str)]
            dims = frozenset(zip(pairs[::2], pairs[1::2], strict=True))
            if ("service", service) in dims:
                read.add((metric[1], dims))
    return read


def published_emf(stdout: str) -> dict[tuple[str, str, frozenset[tuple[str, str]]], list[float]]:
    """What the EMF lines of a function's output publish: {(namespace, metric name, dimension set): values},
    one entry per dimension set of each blob, as CloudWatch reads them."""
    found: dict[tuple[str, str, frozenset[tuple[str, str]]], list[float]] = {}
    for line in stdout.splitlines():
        try:
            blob = json.loads(line)
        except ValueError:
            continue
        if not isinstance(blob, dict) or "_aws" not in blob:
            continue
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            for names in directive["Dimensions"]:
                dims = frozenset((name, blob[name]) for name in names)
                for metric in directive["Metrics"]:
                    values = blob[metric["Name"]]
                    found.setdefault((directive["Namespace"], metric["Name"], dims), []).extend(
                        values if isinstance(values, list) else [values]
                    )
    return found


@pytest.fixture
def run_emitting(synth: Synth, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """run_emitting(function, event, **fakes): call the function's handler in-process with the service name and
    namespace its template sets and EMF printed (the tests turn it off elsewhere), the module attributes in
    `fakes` replaced; answers what its EMF lines publish."""
    from batchinfer.observability import metrics
    from local.lambda_runtime import FakeContext, load_handler

    def run(function: str, event: dict, **fakes: Any) -> dict[tuple[str, str, frozenset[tuple[str, str]]], list[float]]:
        variables = env(synth, function)
        monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
        monkeypatch.setattr(metrics, "service", variables["POWERTOOLS_SERVICE_NAME"])
        monkeypatch.setattr(metrics, "namespace", variables["POWERTOOLS_METRICS_NAMESPACE"])
        module = load_handler(function, "_emf")  # a copy of its own: its attributes are faked here
        for name, fake in fakes.items():
            monkeypatch.setattr(module, name, fake)
        metrics.clear_metrics()
        capsys.readouterr()
        module.handler(event, FakeContext(function_name=function))
        return published_emf(capsys.readouterr().out)

    return run


def test_the_worker_publishes_each_metric_with_the_dimensions_its_alarms_and_dashboard_read(
    synth: Synth, run_emitting
) -> None:
    from botocore.exceptions import ClientError

    from batchinfer.storage import dynamo
    from local.lambda_runtime import sqs_event

    model_id = "glm-5.3-flash"

    async def process_and_pull(svc: object, message: dict, seconds_left: float) -> dict:
        # What a record's writes may meet in the storage layer: a conflicting transaction, a lost condition.
        for code, reasons in (("TransactionCanceledException", ["TransactionConflict"]),
                              ("ConditionalCheckFailedException", [])):
            response: dict = {"Error": {"Code": code, "Message": "refused"}}
            if reasons:
                response["CancellationReasons"] = [{"Code": r} for r in reasons]
            with pytest.raises((dynamo.Throttled, dynamo.ConditionFailed)):
                dynamo._raise(ClientError(response, "TransactWriteItems"))
        return {"completed": 2, "failed": 1, "waiting": 1}

    body = json.dumps({"model": model_id, "batch_id": "batch_1"})
    event = sqs_event("arn:aws:sqs:us-east-1:000000000000:q",
                      [{"MessageId": "m-1", "ReceiptHandle": "r-1", "Body": body}])
    published = run_emitting("worker", event, process_and_pull=process_and_pull, services=lambda: None)

    namespace = env(synth, "worker")["POWERTOOLS_METRICS_NAMESPACE"]
    service = env(synth, "worker")["POWERTOOLS_SERVICE_NAME"]
    # What the alarms and widgets read of the worker: per function, and per model for this invocation's model.
    read = {
        (name, dims)
        for name, dims in emf_read(synth, namespace, service)
        # BackgroundItemFailures only when a record raises: see the background item failures' test.
        if dict(dims).get("model", model_id) == model_id and name != "BackgroundItemFailures"
    }
    assert {name for name, _ in read} >= {
        "RequestsCompleted", "BackendErrors", "TransactionConflicts", "ConditionalCheckFailures"
    }
    assert read <= {(name, dims) for ns, name, dims in published if ns == namespace}
    # The storage layer's counts per function, without the model; the per-model ones with it.
    assert published[(namespace, "TransactionConflicts", frozenset({("service", service)}))] == [1.0]
    assert published[(namespace, "ConditionalCheckFailures", frozenset({("service", service)}))] == [1.0]
    per_model = frozenset({("service", service), ("model", model_id)})
    assert published[(namespace, "RequestsCompleted", per_model)] == [3.0]
    assert published[(namespace, "BackendErrors", per_model)] == [2.0]


def test_the_sweeper_lag_alarm_reads_what_the_sweeper_publishes(synth: Synth, run_emitting) -> None:
    def sweep_once(svc: object, deadline: float | None = None, overdue: Any = None) -> dict:
        overdue.saw(42)  # the most overdue item this run found
        return {"recovered": 0, "settled": 0, "expired": 0, "purged": 0, "webhook_events_resent": 0}

    published = run_emitting("sweeper", {}, sweep_once=sweep_once, services=lambda: None)
    alarm = alarms_of(synth)["dev-batchinfer-sweeper-lag"]
    (metric,) = metric_stats(alarm)
    service = env(synth, "sweeper")["POWERTOOLS_SERVICE_NAME"]
    assert (metric["Namespace"], metric["MetricName"]) == ("batchinfer/dev", "SweepLagSeconds")
    assert metric["Dimensions"] == [{"Name": "service", "Value": service}]
    dims = frozenset({("service", service)})
    assert published[("batchinfer/dev", "SweepLagSeconds", dims)] == [42.0]
    # Behind: 10 min overdue in each of three 5-minute periods; no data (runs that never get that far) too.
    assert (alarm["Statistic"], alarm["Period"], alarm["EvaluationPeriods"]) == ("Maximum", 300, 3)
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 600)
    assert alarm["TreatMissingData"] == "breaching"
    assert ("SweepLagSeconds", dims) in emf_read(synth, "batchinfer/dev", service)  # on the dashboard too


@pytest.mark.background_failures
def test_the_background_item_failures_alarm_reads_what_each_loop_publishes(synth: Synth, run_emitting) -> None:
    from batchinfer.observability import Bulkhead
    from local.lambda_runtime import sqs_event

    def sweep_once(svc: object, deadline: float | None = None, overdue: Any = None) -> dict:
        for batch_id in ("batch_1", "batch_2"):  # two batches whose step raised; the sweep went on
            with Bulkhead("sweeper", batch_id, "validation"):
                raise RuntimeError("a step that raised")
        return {"recovered": 0, "settled": 0, "expired": 0, "purged": 0, "webhook_events_resent": 0}

    def deliver(svc: object, message: dict) -> str:
        if message["sk"] == "EVENT#evt_1":
            raise RuntimeError("a delivery that raised")
        return "delivered"

    async def process_and_pull(svc: object, message: dict, seconds_left: float) -> dict:
        if message["batch_id"] == "batch_1":
            raise RuntimeError("a record that raised")
        return {"completed": 1, "failed": 0, "waiting": 0}

    def records(*bodies: dict) -> dict:
        return sqs_event("arn:aws:sqs:us-east-1:000000000000:q", [
            {"MessageId": f"m-{i}", "ReceiptHandle": f"r-{i}", "Body": json.dumps(body)}
            for i, body in enumerate(bodies)])

    alarm = alarms_of(synth)["dev-batchinfer-background-item-failures"]
    metrics = metric_stats(alarm)
    assert {m["MetricName"] for m in metrics} == {"BackgroundItemFailures"}
    assert {d["Value"] for m in metrics for d in m["Dimensions"] if d["Name"] == "service"} == {
        env(synth, name)["POWERTOOLS_SERVICE_NAME"] for name in FUNCTION_NAMES
    }
    assert all(len(m["Dimensions"]) == 1 for m in metrics)
    assert (alarm["Threshold"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (0, 3, 2)
    assert alarm["TreatMissingData"] == "notBreaching"

    published = run_emitting("sweeper", {}, sweep_once=sweep_once, services=lambda: None)
    service = env(synth, "sweeper")["POWERTOOLS_SERVICE_NAME"]
    dims = frozenset({("service", service)})
    assert sum(published[("batchinfer/dev", "BackgroundItemFailures", dims)]) == 2  # one per item
    assert ("BackgroundItemFailures", dims) in emf_read(synth, "batchinfer/dev", service)  # on the dashboard too

    # A record that raises in the webhooks or worker function: counted, and only that record comes back.
    for function, fakes, bodies in (
            ("webhooks", {"deliver": deliver}, ({"pk": "ACCOUNT#a", "sk": "EVENT#evt_1"},
                                                {"pk": "ACCOUNT#a", "sk": "EVENT#evt_2"})),
            ("worker", {"process_and_pull": process_and_pull}, ({"model": "glm-5.3-flash", "batch_id": "batch_1"},
                                                                {"model": "glm-5.3-flash", "batch_id": "batch_2"}))):
        published = run_emitting(function, records(*bodies), services=lambda: None, **fakes)
        service = env(synth, function)["POWERTOOLS_SERVICE_NAME"]
        assert published[("batchinfer/dev", "BackgroundItemFailures", frozenset({("service", service)}))] == [1.0]


def test_every_alarm_notifies_the_topic_on_alarm_and_ok(synth: Synth, edge_synth: Synth) -> None:
    topic = {"Ref": synth.logical_id(synth.stack.monitoring.topic)}
    for alarm in alarms_of(synth).values():
        assert alarm["AlarmActions"] == [topic] and alarm["OKActions"] == [topic]
    # An imported topic: no topic in the stack, the alarms publish to the ARN, the email is subscribed to it.
    edge_synth.template.resource_count_is("AWS::SNS::Topic", 0)
    for alarm in alarms_of(edge_synth).values():
        assert alarm["AlarmActions"] == [EDGE_TOPIC_ARN], alarm["AlarmName"]
    edge_synth.template.has_resource_properties(
        "AWS::SNS::Subscription", {"TopicArn": EDGE_TOPIC_ARN, "Protocol": "email", "Endpoint": "ops@example.com"}
    )
    edge_synth.template.has_output("AlarmTopicArn", {"Value": EDGE_TOPIC_ARN})


# -- the functions emit in the namespace the stack watches ---------------------------------------------------


def test_observability_emits_in_the_namespace_the_stack_sets() -> None:
    code = "from batchinfer.observability import metrics; print(metrics.namespace)"
    # The child imports the package as this process does, with or without the Makefile's PYTHONPATH.
    environment = {**os.environ, "POWERTOOLS_METRICS_NAMESPACE": "batchinfer/qa",
                   "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "batchinfer/qa"


def test_the_api_latency_alarm_reads_what_the_api_publishes_and_long_polls_are_left_out(
    synth: Synth, run_emitting
) -> None:
    from tests.integration.apigw import http_event

    service = env(synth, "api")["POWERTOOLS_SERVICE_NAME"]
    key = ("batchinfer/dev", "ApiLatency", frozenset({("service", service)}))
    alarm = alarms_of(synth)["dev-batchinfer-api-latency-p99"]
    (metric,) = metric_stats(alarm)
    assert (metric["Namespace"], metric["MetricName"]) == ("batchinfer/dev", "ApiLatency")
    assert metric["Dimensions"] == [{"Name": "service", "Value": service}]
    # p99 of each 5 minutes over 10 s (in milliseconds, as the api publishes it), three periods in a row.
    assert (alarm["ExtendedStatistic"], alarm["Period"], alarm["EvaluationPeriods"]) == ("p99", 300, 3)
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 10_000)
    assert ("ApiLatency", frozenset({("service", service)})) in emf_read(synth, "batchinfer/dev", service)

    (answered,) = run_emitting("api", http_event("GET", "/health"))[key]
    assert 0 < answered < 10_000
    # A results page held with `wait` publishes no latency (refused here at once for want of a key: what
    # counts is the request, not how long it took); without `wait`, or with wait=0, it does.
    results = "/v1/batches/batch_1/results"
    assert key not in run_emitting("api", http_event("GET", results, query={"order": "finished", "wait": "20"}))
    assert key not in run_emitting("api", http_event("GET", "/v1/messages/batches/msgbatch_1/results",
                                                     query={"order": "finished", "wait": "5"}))
    assert len(run_emitting("api", http_event("GET", results, query={"order": "finished", "wait": "0"}))[key]) == 1
    assert len(run_emitting("api", http_event("GET", results))[key]) == 1
