"""Bulkheads: every background loop isolates each item. An exception injected into one batch's step (one
lease's recovery, one webhook event's relay or delivery, one model's claim) is logged with the item's id and
counted, and the loop goes on: other accounts' batches validate, run, finalize and expire on time. A batch
whose sweep raises run after run ends failed with `internal_error`, its requests accounted for."""

from __future__ import annotations

import json
import logging

import pytest

from batchinfer.observability import Bulkhead
from batchinfer.operations.openai import batches
from batchinfer.records import WebhookEvent
from batchinfer.scheduling.dispatcher import Dispatcher
from batchinfer.scheduling.policy import walk_order
from batchinfer.service.accounts import authenticate
from batchinfer.service.background import finalize, sweep, webhooks
from batchinfer.service.background.sweep import sweep_once
from batchinfer.service.steering import spending_cap
from local.lambda_runtime import invoke, sqs_event
from tests.faults.harness import (
    GLM,
    QWEN,
    account_counters,
    configure,
    get_batch,
    pump,
    receive,
    results_by_custom_id,
    run_queued,
    set_budgets,
    submit,
    submit_file,
)
from tests.helpers import chat_request, new_key
from tests.invariants import assert_ledger_consistent

BACKGROUND = "batchinfer.background"
pytestmark = pytest.mark.background_failures


class Injected(RuntimeError):
    """The fault a test puts into one item's step."""


def raising_for(item_id: str, real):  # noqa: ANN001, ANN201 - wraps whatever step it is given
    """`real`, but raising for the batch `item_id` (its first argument after svc names it, by id or item)."""
    calls = {"raised": 0}

    def step(svc, target, *args, **kwargs):  # noqa: ANN001, ANN202
        named = target if isinstance(target, str) else target.get("id") or target.get("batch_id")
        if named == item_id:
            calls["raised"] += 1
            raise Injected(f"injected into {item_id}")
        return real(svc, target, *args, **kwargs)

    step.calls = calls
    return step


def failures_logged(caplog, item_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == BACKGROUND and getattr(r, "item_id", None) == item_id]


def user(svc):  # noqa: ANN001, ANN201
    _, key = new_key(svc)
    return authenticate(svc, key)


# --- The sweeper's per-batch steps ----------------------------------------------------------------------------


def test_a_batch_whose_validation_raises_fails_after_the_set_tries_while_other_accounts_batches_go_on(
        svc, sim_control, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger=BACKGROUND)
    configure(svc, file_batches_enabled=True, sweep_failures_to_fail=3, lease_seconds=3600,
              batch_completion_window_seconds=600)
    late_who = user(svc)
    late = submit(svc, late_who, [chat_request(f"late-{i}", f"late {i}") for i in range(4)])  # its window: 600 s
    configure(svc, batch_completion_window_seconds=24 * 3600)
    broken_who, file_who, plain_who = user(svc), user(svc), user(svc)
    broken = submit_file(svc, broken_who, [chat_request(f"b-{i}", f"broken {i}") for i in range(5)])
    in_file = [chat_request(f"f-{i}", f"file {i}", model=QWEN) for i in range(6)]
    from_file = submit_file(svc, file_who, in_file)
    plain_requests = [chat_request(f"p-{i}", f"plain {i}", model=QWEN) for i in range(5)]
    plain = submit(svc, plain_who, plain_requests)
    validate = raising_for(broken, sweep.validate_file_batch)
    monkeypatch.setattr(sweep, "validate_file_batch", validate)

    sweep_once(svc)  # 1st failure of the broken batch; the other file batch is validated in the same run
    assert get_batch(svc, broken)["status"] == "validating" and get_batch(svc, broken)["step_failures"] == 1
    assert not get_batch(svc, from_file).get("awaiting_validation") and get_batch(svc, from_file)["total"] == 6
    (logged,) = failures_logged(caplog, broken)
    assert logged.step == "validation" and logged.loop == "sweeper" and logged.error_type == "Injected"
    assert "in step\n" in logged.getMessage()  # where it was raised: the injected step's frame
    assert f"injected into {broken}" not in logged.getMessage()  # not what it said: it may quote input

    svc.clock.advance(601)  # the late batch's window closes before any of it ran
    sweep_once(svc)  # 2nd failure; the late batch expires on time all the same
    assert get_batch(svc, late)["status"] == "expired"
    assert get_batch(svc, broken)["step_failures"] == 2

    Dispatcher(svc).pass_once()
    run_queued(svc)
    sweep_once(svc)  # 3rd failure: the broken batch ends failed; the others finish in the same run
    assert validate.calls["raised"] == 3
    failed = get_batch(svc, broken)
    assert failed["status"] == "failed"
    obj = batches.batch_object(failed)
    assert obj["error"]["code"] == "internal_error" and "validation" in obj["error"]["message"]
    assert obj["errors"]["data"][0]["code"] == "internal_error"
    assert get_batch(svc, from_file)["status"] == "completed"
    assert get_batch(svc, plain)["status"] == "completed"
    for batch_id, who, requests in ((broken, broken_who, []), (late, late_who, None), (from_file, file_who, in_file),
                                    (plain, plain_who, plain_requests)):
        assert_ledger_consistent(svc, batch_id, who, None if requests is None else [r["custom_id"] for r in requests])
    assert account_counters(svc, broken_who.account_id)["unfinished_batches"] == 0  # its slot given back
    sweep_once(svc)
    assert validate.calls["raised"] == 3  # an ended batch is not walked again


def test_a_running_batch_whose_sweep_keeps_raising_ends_failed_with_its_requests_accounted_for(
        svc, sim_control, monkeypatch):
    configure(svc, sweep_failures_to_fail=3, lease_seconds=3600)
    set_budgets(svc, {GLM: 3})
    who, other_who = user(svc), user(svc)
    requests = [chat_request(f"r-{i}", f"running {i}") for i in range(10)]
    broken = submit(svc, who, requests)
    other_requests = [chat_request(f"o-{i}", f"other {i}", model=QWEN) for i in range(4)]
    other = submit(svc, other_who, other_requests)
    dispatcher = Dispatcher(svc)
    assert dispatcher.pass_once() == 3 + 4  # three of the broken batch (its budget), all of the other's
    run_queued(svc)
    real = spending_cap.reached
    reached = raising_for(broken, real)
    monkeypatch.setattr(spending_cap, "reached", reached)

    sweep_once(svc)
    sweep_once(svc)
    assert get_batch(svc, broken)["step_failures"] == 2
    assert get_batch(svc, other)["status"] == "completed"  # finalized in the first of those runs
    monkeypatch.setattr(spending_cap, "reached", real)
    sweep_once(svc)  # a run whose steps all go through: the tally starts again
    assert "step_failures" not in get_batch(svc, broken)
    monkeypatch.setattr(spending_cap, "reached", reached)
    sweep_once(svc)
    sweep_once(svc)
    assert get_batch(svc, broken)["status"] == "in_progress"  # two in a row, not three
    sweep_once(svc)

    final = get_batch(svc, broken)
    assert final["status"] == "failed" and final["error"]["code"] == "internal_error"
    assert "spending cap" in final["error"]["message"]
    assert_ledger_consistent(svc, broken, who, [r["custom_id"] for r in requests])
    results = results_by_custom_id(svc, who, broken)
    assert {c for c, r in results.items() if r["status"] == "completed"} == {"r-0", "r-1", "r-2"}
    assert {r["error"]["code"] for c, r in results.items() if r["status"] == "failed"} == {"batch_failed"}
    assert batches.batch_object(final)["request_counts"] == {"total": 10, "completed": 3, "failed": 7}
    assert_ledger_consistent(svc, other, other_who, [r["custom_id"] for r in other_requests])

    # Once the cause is gone, a retry in place runs what it never started, its failure and tally forgotten.
    monkeypatch.setattr(spending_cap, "reached", real)
    retried, _ = batches.retry_batch(svc, who, broken, {}, None)
    assert retried["status"] == "in_progress" and retried["error"] is None and retried["errors"] is None
    assert "step_failures" not in get_batch(svc, broken)
    again = pump(svc, broken)
    assert again["status"] == "completed" and batches.batch_object(again)["request_counts"]["completed"] == 10
    assert_ledger_consistent(svc, broken, who, [r["custom_id"] for r in requests])


def test_a_batch_whose_result_files_cannot_be_written_ends_failed_without_them(svc, sim_control, monkeypatch):
    configure(svc, file_batches_enabled=True, sweep_failures_to_fail=2)
    who, other_who = user(svc), user(svc)
    requests = [chat_request(f"w-{i}", f"written {i}") for i in range(4)]
    broken = submit_file(svc, who, requests)
    other_requests = [chat_request(f"x-{i}", f"other {i}", model=QWEN) for i in range(3)]
    other = submit_file(svc, other_who, other_requests)
    write = raising_for(broken, finalize.write)
    monkeypatch.setattr(finalize, "write", write)

    final = pump(svc, broken)

    assert final["status"] == "failed" and final["error"]["code"] == "internal_error"
    assert "finalization" in final["error"]["message"]
    assert final.get("output_file_id") is None and final.get("error_file_id") is None
    obj = batches.batch_object(final)
    assert obj["errors"]["data"][0]["code"] == "internal_error"
    assert obj["request_counts"] == {"total": 4, "completed": 4, "failed": 0}  # everything it ran is kept
    assert_ledger_consistent(svc, broken, who, [r["custom_id"] for r in requests])
    done = pump(svc, other)
    assert done["status"] == "completed" and done["output_file_id"]
    assert_ledger_consistent(svc, other, other_who, [r["custom_id"] for r in other_requests])


def test_the_walk_takes_a_batch_whose_step_raised_last(svc, sim_control, monkeypatch):
    configure(svc, sweep_failures_to_fail=100)
    broken = submit(svc, user(svc), [chat_request("a", "a")])
    others = {submit(svc, user(svc), [chat_request(f"{i}", "b")]) for i in range(3)}
    monkeypatch.setattr(spending_cap, "reached", raising_for(broken, spending_cap.reached))
    walked: list[list[str]] = []
    real = sweep._sweep_batch

    def watched(svc, batch_id, *args, **kwargs):  # noqa: ANN001, ANN202
        walked[-1].append(batch_id)
        return real(svc, batch_id, *args, **kwargs)

    monkeypatch.setattr(sweep, "_sweep_batch", watched)
    for _ in range(4):
        walked.append([])
        sweep_once(svc)
    assert all(set(run) == others | {broken} for run in walked)
    assert [run[-1] for run in walked[1:]] == [broken] * 3  # after its first failure, always last
    assert len({tuple(run) for run in walked[1:]}) > 1  # and the others' start moves from run to run


# --- Lease recovery, webhook relays and deliveries, the dispatcher's models -------------------------------------


def test_a_lease_whose_recovery_raises_is_passed_over_and_the_others_are_recovered(svc, sim_control, monkeypatch,
                                                                                  caplog):
    caplog.set_level(logging.ERROR, logger=BACKGROUND)
    configure(svc, lease_seconds=60)
    who, other_who = user(svc), user(svc)
    broken = submit(svc, who, [chat_request("l-0", "lost")])
    other = submit(svc, other_who, [chat_request("m-0", "lost", model=QWEN)])
    assert Dispatcher(svc).pass_once() == 2
    for model in (GLM, QWEN):  # the messages are lost: their leases run out
        for message in receive(svc, model):
            svc.queues.sqs.delete_message(QueueUrl=svc.queues.urls[model], ReceiptHandle=message["ReceiptHandle"])
    svc.clock.advance(61)
    real = sweep._recover_group

    def recover(svc, group):  # noqa: ANN001, ANN202
        if group["batch_id"] == broken:
            raise Injected("injected into a lease")
        return real(svc, group)

    monkeypatch.setattr(sweep, "_recover_group", recover)
    assert sweep.recover_leases(svc) == 1  # the other batch's request; the broken one's is passed over
    (logged,) = [r for r in caplog.records if r.name == BACKGROUND]
    assert logged.loop == "lease recovery" and logged.item_id.startswith(f"BATCH#{broken}|")
    assert get_batch(svc, other)["open"] == 1 and get_batch(svc, other)["in_flight"] == 0  # back to wait
    assert get_batch(svc, broken)["in_flight"] == 1  # still held: its lease stays due

    monkeypatch.setattr(sweep, "_recover_group", real)
    assert sweep.recover_leases(svc) == 1  # a later run recovers it
    for batch_id, owner, custom_id in ((broken, who, "l-0"), (other, other_who, "m-0")):
        assert pump(svc, batch_id)["status"] == "completed"
        assert_ledger_consistent(svc, batch_id, owner, [custom_id])


def _events(svc, n: int) -> list[dict]:
    account, _ = new_key(svc)
    now = svc.now()
    events = [WebhookEvent.new(event_id=f"evt_{i}", account_id=account["id"], event_type="batch.completed",
                               batch_id=f"batch_{i}", url=None, now=now, relay_at=now, keep_until=now + 3600)
              for i in range(n)]
    for event in events:
        svc.table.transact([WebhookEvent.create(svc.table, event)])
    return events


def test_a_webhook_event_whose_relay_raises_is_passed_over_and_the_others_are_sent(svc, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger=BACKGROUND)
    events = _events(svc, 3)
    sent: list[dict] = []
    real = svc.queues.send_webhook

    def send(message: dict, delay: int = 0) -> None:
        if message["sk"] == events[1]["sk"]:
            raise Injected("injected into a relay")
        sent.append(message)
        real(message, delay)

    monkeypatch.setattr(svc.queues, "send_webhook", send)
    assert webhooks.relay_due(svc) == 2
    assert sorted(m["sk"] for m in sent) == sorted(e["sk"] for e in (events[0], events[2]))
    (logged,) = [r for r in caplog.records if r.name == BACKGROUND]
    assert logged.loop == "webhook relay" and logged.item_id.endswith(events[1]["sk"])


def test_a_webhook_delivery_that_raises_fails_only_its_own_record(svc, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger=BACKGROUND)
    events = _events(svc, 3)
    real = webhooks.Webhook

    class Broken(real):
        @staticmethod
        def get(t, account_id):  # noqa: ANN001, ANN205
            raise Injected("injected into a delivery")

    calls = {"n": 0}

    class OneBroken(real):
        @staticmethod
        def get(t, account_id):  # noqa: ANN001, ANN205
            calls["n"] += 1
            if calls["n"] == 2:
                return Broken.get(t, account_id)
            return real.get(t, account_id)

    monkeypatch.setattr(webhooks, "Webhook", OneBroken)
    messages = [{"MessageId": f"m-{i}", "ReceiptHandle": f"r-{i}", "Body": json.dumps({"pk": e["pk"], "sk": e["sk"]})}
                for i, e in enumerate(events)]
    answer = invoke("webhooks", sqs_event("arn:aws:sqs:us-east-1:000000000000:webhooks", messages))

    assert len(answer["batchItemFailures"]) == 1  # only the record whose delivery raised comes back
    statuses = sorted(svc.table.get(e["pk"], e["sk"])["status"] for e in events)
    assert statuses.count("skipped") == 2  # the others were handled (their account has no webhook)
    (logged,) = [r for r in caplog.records if r.name == BACKGROUND]
    assert logged.loop == "webhook delivery" and logged.step == "delivery"


def test_a_model_whose_claim_raises_does_not_stop_the_other_models_dispatch(svc, sim_control, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger=BACKGROUND)
    who, other_who = user(svc), user(svc)
    stuck = submit(svc, who, [chat_request(f"g-{i}", "glm") for i in range(2)])
    other_requests = [chat_request(f"q-{i}", "qwen", model=QWEN) for i in range(3)]
    other = submit(svc, other_who, other_requests)
    real = Dispatcher.claim

    def claim(self, model, *args, **kwargs):  # noqa: ANN001, ANN202
        if model.id == GLM:
            raise Injected("injected into a claim")
        return real(self, model, *args, **kwargs)

    monkeypatch.setattr(Dispatcher, "claim", claim)
    dispatcher = Dispatcher(svc)
    assert dispatcher.pass_once() == 3  # every request of the other model, none of the broken one
    (logged,) = [r for r in caplog.records if r.name == BACKGROUND]
    assert logged.loop == "dispatcher" and logged.item_id == f"model:{GLM}" and logged.step == "claim"
    assert [m.id for m in walk_order(svc.catalog.runnable, lambda m: f"model:{m.id}", svc.failed_last, 0)][-1] \
        == GLM  # the next pass takes it last
    monkeypatch.setattr(Dispatcher, "claim", real)
    assert pump(svc, other)["status"] == "completed"
    assert_ledger_consistent(svc, other, other_who, [r["custom_id"] for r in other_requests])
    assert pump(svc, stuck)["status"] == "completed"  # once its claims go through again


def test_a_bulkhead_lets_a_non_exception_through():
    with pytest.raises(KeyboardInterrupt), Bulkhead("sweeper", "batch_x", "validation"):
        raise KeyboardInterrupt


def test_a_message_batch_whose_sweep_keeps_raising_ends_with_its_requests_accounted_for(svc, sim_control,
                                                                                      monkeypatch):
    from batchinfer.operations.anthropic import message_batches
    from tests.faults.test_message_batches import message_entry, submit_messages

    configure(svc, sweep_failures_to_fail=3, lease_seconds=3600)
    set_budgets(svc, {GLM: 2})
    who = user(svc)
    entries = [message_entry(f"k-{i}", f"message {i}") for i in range(7)] + [message_entry("bad", "x", model="nope")]
    broken = submit_messages(svc, who, entries)
    dispatcher = Dispatcher(svc)
    assert dispatcher.pass_once() == 2
    run_queued(svc)  # k-0, k-1 succeeded
    assert dispatcher.pass_once() == 2  # k-2, k-3 queued when the batch fails: they never start
    monkeypatch.setattr(spending_cap, "reached", raising_for(broken, spending_cap.reached))
    for _ in range(3):
        sweep_once(svc)
    assert get_batch(svc, broken)["stop"] == "fail"
    final = pump(svc, broken)  # the queued messages find the batch stopped; the sweep settles it

    assert final["status"] == "failed" and final["error"]["code"] == "internal_error"
    assert_ledger_consistent(svc, broken, who, [e["custom_id"] for e in entries])
    obj = message_batches.message_batch_object(final, "")
    assert obj["processing_status"] == "ended"
    assert obj["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 6, "canceled": 0, "expired": 0}
