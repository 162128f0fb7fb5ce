"""A batch's priority among its account's batches (an extension beyond the OpenAI and Anthropic APIs), through
the real API handler: given on create (inline, from a file, a Message Batch), shown on the batch, changed
while it runs, refused in each API's envelope; and what it changes in the claims the dispatcher makes."""

from __future__ import annotations

from batchinfer.layout import model_budget_key
from batchinfer.records import Lane
from tests.helpers import anthropic_error, error, finish, new_key, ok, settings, tiny
from tests.integration.test_files import create_from, jsonl, line, upload
from tests.integration.test_message_batches import V1, Messages, entry

GLM = "glm-5.3-flash"
ALLOWED = "'high', 'normal' or 'low'"


def lane_priorities(svc, model: str = GLM) -> dict[str, str | None]:
    lanes, _ = Lane.in_turn(svc.table, model, None, 100)
    return {lane["batch_id"]: lane.get("priority") for lane in lanes}


def test_inline_priority_is_stored_shown_and_changed_while_it_runs(api, svc):
    _, key = new_key(svc)
    plain = api.created(key, [tiny(i) for i in range(3)])
    assert plain["priority"] == "normal"
    urgent = api.created(key, [tiny(i) for i in range(3)], priority="high")
    assert urgent["priority"] == "high"
    assert ok(api("GET", f"/v1/batches/{urgent['id']}", key))["priority"] == "high"
    listed = {b["id"]: b["priority"] for b in ok(api("GET", "/v1/batches", key))["data"]}
    assert listed == {plain["id"]: "normal", urgent["id"]: "high"}
    assert lane_priorities(svc) == {plain["id"]: "normal", urgent["id"]: "high"}

    lowered = ok(api("POST", f"/v1/batches/{urgent['id']}/priority", key, json_body={"priority": "low"}))
    assert lowered["id"] == urgent["id"] and lowered["priority"] == "low"
    assert ok(api("GET", f"/v1/batches/{urgent['id']}", key))["priority"] == "low"
    assert lane_priorities(svc)[urgent["id"]] == "low"  # the next claim sees it

    # Once it has ended, its priority no longer changes.
    assert finish(svc, urgent["id"])["status"] == "completed"
    error(api("POST", f"/v1/batches/{urgent['id']}/priority", key, json_body={"priority": "high"}), 409,
          "has ended", code="batch_ended")
    assert ok(api("GET", f"/v1/batches/{urgent['id']}", key))["priority"] == "low"


def test_a_bad_priority_is_a_400_naming_it_and_the_allowed_values(api, svc):
    _, key = new_key(svc)
    for bad in ("urgent", "HIGH", 1, ["high"], ""):
        err = error(api.create(key, [tiny(0)], priority=bad), 400, "priority", ALLOWED, param="priority")
        assert "priority must be one of" in err["message"], err
    assert ok(api("GET", "/v1/batches", key))["data"] == []  # nothing stored
    batch = api.created(key, [tiny(0)], priority=None)  # null: the default
    assert batch["priority"] == "normal"
    path = f"/v1/batches/{batch['id']}/priority"
    for body in ({"priority": "urgent"}, {"priority": None}, {}, {"priority": "high", "other": 1}):
        error(api("POST", path, key, json_body=body), 400)
    err = error(api("POST", path, key, json_body={"priority": "urgent"}), 400, param="priority")
    assert err["message"].startswith("priority: ") and ALLOWED in err["message"], err
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key))["priority"] == "normal"


def test_another_accounts_batch_or_an_unknown_one_is_404(api, svc):
    _, key = new_key(svc)
    _, other = new_key(svc)
    batch = api.created(key, [tiny(0)])
    for who, batch_id in ((other, batch["id"]), (key, "batch_" + "0" * 32)):
        error(api("POST", f"/v1/batches/{batch_id}/priority", who, json_body={"priority": "high"}), 404,
              code="batch_not_found")
    assert ok(api("GET", f"/v1/batches/{batch['id']}", key))["priority"] == "normal"


def test_a_batch_from_a_file_keeps_its_priority_through_validation(api, svc):
    settings(svc, file_batches_enabled=True)
    _, key = new_key(svc)
    uploaded = ok(upload(api, key, jsonl(line("a"), line("b"))))
    error(create_from(api, key, uploaded["id"], priority="soon"), 400, ALLOWED, param="priority")
    created = ok(create_from(api, key, uploaded["id"], priority="low"))
    assert created["status"] == "validating" and created["priority"] == "low"
    # Changed before its lines are checked: its lanes, made at validation, take the new one.
    assert ok(api("POST", f"/v1/batches/{created['id']}/priority", key,
                  json_body={"priority": "high"}))["priority"] == "high"
    from batchinfer.records import Batch
    from batchinfer.service.creating.intake import validate_file_batch
    assert validate_file_batch(svc, Batch.get(svc.table, created["id"])) == "validated"
    assert lane_priorities(svc) == {created["id"]: "high"}
    assert finish(svc, created["id"])["status"] == "completed"
    assert ok(api("GET", f"/v1/batches/{created['id']}", key))["priority"] == "high"


def test_message_batches_take_a_priority_on_create_and_change_it_under_both_base_urls(api, svc):
    settings(svc, message_batches_enabled=True)
    _, key = new_key(svc)
    _, other_key = new_key(svc)
    for messages in (Messages(api, key), Messages(api, key, version=V1, prefix="")):
        batch = ok(messages("POST", json_body={"requests": [entry("q-0"), entry("q-1")], "priority": "high"}))
        assert batch["priority"] == "high" and batch["type"] == "message_batch"
        assert ok(messages("GET", f"/{batch['id']}"))["priority"] == "high"
        assert lane_priorities(svc)[batch["id"]] == "high"
        changed = ok(messages("POST", f"/{batch['id']}/priority", json_body={"priority": "low"}))
        assert changed["priority"] == "low" and changed["processing_status"] == "in_progress"
        assert lane_priorities(svc)[batch["id"]] == "low"
        anthropic_error(messages("POST", f"/{batch['id']}/priority", json_body={"priority": "later"}), 400,
                        "invalid_request_error", "priority", ALLOWED)
        anthropic_error(Messages(api, other_key)("POST", f"/{batch['id']}/priority", json_body={"priority": "low"}),
                        404, "not_found_error")
        finish(svc, batch["id"])
        anthropic_error(messages("POST", f"/{batch['id']}/priority", json_body={"priority": "high"}), 409,
                        "conflict_error", "has ended")
    plain = ok(Messages(api, key).create([entry("q-0")]))
    assert plain["priority"] == "normal"
    anthropic_error(Messages(api, key)("POST", json_body={"requests": [entry("q-0")], "priority": 2}), 400,
                    "invalid_request_error", "priority", ALLOWED)


# --- What priority changes in the claims -----------------------------------------------------------------

def claimed_by_batch(svc, after: str | None = None) -> dict[str, int]:
    """One claim pass of a fresh dispatcher (its turn after the lane of batch `after`, if given): how many
    first attempts each batch got."""
    from batchinfer.scheduling.dispatcher import Dispatcher

    model = svc.catalog.get(GLM)
    dispatcher = Dispatcher(svc)
    if after is not None:
        lanes, _ = Lane.in_turn(svc.table, GLM, None, 100)
        dispatcher.lanes.last_served[GLM] = next(lane["sk"] for lane in lanes if lane["batch_id"] == after)
    got: dict[str, int] = {}
    for unit in dispatcher.claim(model):
        got[unit["batch_id"]] = got.get(unit["batch_id"], 0) + len(unit.get("positions", [unit]))
    return got


def test_an_accounts_high_batch_takes_its_slots_before_its_large_normal_one(api, svc):
    _, key = new_key(svc)  # pro: 16 slots, the model's whole budget
    large = api.created(key, [tiny(i) for i in range(200)])
    urgent = api.created(key, [tiny(i) for i in range(30)], priority="high")
    assert claimed_by_batch(svc) == {urgent["id"]: 16}
    # Lowered below the large one, it waits for it.
    ok(api("POST", f"/v1/batches/{urgent['id']}/priority", key, json_body={"priority": "low"}))
    settings(svc, tier_limits={**svc.settings.tier_limits, "pro": 32})  # room for the account, none for the model
    assert claimed_by_batch(svc) == {}  # the model is full
    # As if the model's slots came back (the account still holds its 16, within its new limit of 32).
    svc.table.update(*model_budget_key(GLM), "SET in_flight = :z", vals={":z": 0})
    assert claimed_by_batch(svc) == {large["id"]: 16}


def test_priority_never_takes_slots_from_another_account(api, svc):
    _, key_a = new_key(svc)
    _, key_b = new_key(svc)
    made = []
    for key, priority in ((key_a, "low"), (key_b, None), (key_a, "high")):  # a second apart: the ring's order
        made.append(api.created(key, [tiny(i) for i in range(100)], priority=priority))
        base = svc.clock
        svc.clock = lambda base=base: base() + 1
    a_low, b_normal, a_high = made
    # Three lanes, 16 free slots: a quantum (8) per lane, the batches holding fewest first, ties in turn.
    # Whichever turn is A's, its high batch uses it; B gets the turn it would get with one priority.
    assert claimed_by_batch(svc, after=a_high["id"]) == {a_high["id"]: 8, b_normal["id"]: 8}
    svc.table.update(*model_budget_key(GLM), "SET in_flight = :z", vals={":z": 0})  # as if the slots came back
    settings(svc, tier_limits={**svc.settings.tier_limits, "pro": 64})
    assert claimed_by_batch(svc, after=a_low["id"]) == {b_normal["id"]: 8, a_high["id"]: 8}
