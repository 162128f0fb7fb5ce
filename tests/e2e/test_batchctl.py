"""The real `./batchctl` against a running local stack, on what looks like a fresh machine: no AWS_* variable
and an empty HOME (no ~/.aws). It needs no flags and no credentials, and every error is one line.

The user commands (submit, status, list, wait, results, cancel, pause, resume, delete) run as a script would
run them: not on a terminal, so their progress is the plain periodic lines, checked here too. Most of them run
batchctl's main() in this process with the same argv, folder and environment (`ctl`): an interpreter's start-up
per call is most of what they would cost. The operator's commands, the first submission and wait, an
interrupted wait, a watch and the environment's settings run the real `./batchctl` (`batchctl`)."""

from __future__ import annotations

import _thread
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from batchinfer import cli
from batchinfer.api.app import create_app
from batchinfer.settings import Settings
from local.run import start
from local.servers import UvicornThread, free_port

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


MODEL = "glm-5.3-flash"
# A plain progress line (not a terminal), e.g.
# `batch_x: 120/1000 completed, 3 failed, 40.0 req/s, ETA 22s [in_progress]`.
PROGRESS = re.compile(r"^(batch|msgbatch)_\w+: \d+/\d+ completed, \d+ failed, (--|\d+\.\d) req/s, "
                      r"ETA (--|\d+s|\d+m\d\ds|\d+h\d\dm) \[\w+\]$")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("ctl-stack") / ".local"
    settings = Settings(table_name="e2e-ctl", bucket_name="e2e-ctl", stage="e2e-ctl", file_batches_enabled=True,
                        message_batches_enabled=True)
    port, sim_port = free_port(), free_port()
    # As `make run` does: the API's URL goes into .local/stack.json for batchctl's user commands.
    _, key, stop = start(settings, free_port(), sim_port, pollers=1, state_dir=state,
                         api_url=f"http://127.0.0.1:{port}/v1")
    api = UvicornThread(create_app(), port).start()
    yield {"base": f"{api.url}/v1", "root": api.url, "dir": state.parent, "key": key,
           "sim": f"http://127.0.0.1:{sim_port}"}
    api.stop()
    stop()


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> dict[str, str]:
    """This environment without AWS settings or credentials, and a HOME with nothing in it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "BATCH_API_")) and k not in ("TABLE_NAME", "HOME")}
    return {**env, "HOME": str(tmp_path_factory.mktemp("empty-home"))}


def batchctl(cwd: Path, env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "batchctl"), *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env, input=stdin)


# The user commands' only reading of the environment (batchinfer.cli.connection.env_defaults).
USER_ENV = ("BATCH_API_URL", "BATCH_API_KEY")
CTL_TIMEOUT_SECONDS = 60


def ctl(cwd: Path, env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """A user command as `batchctl` runs it, through batchctl's main() in this process: the same argv, run in
    `cwd`, with `env`'s BATCH_API_URL and BATCH_API_KEY, stdin and stdout not a terminal, exit status, stdout
    and stderr as the process would have them."""
    assert args[:1] != ("admin",), "the operator's commands read AWS settings: run them with batchctl()"
    # As a process's own: text streams over bytes (`results` writes its lines to stdout's buffer).
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2))
    saved_env = {name: os.environ.pop(name) for name in USER_ENV if name in os.environ}
    os.environ.update({name: env[name] for name in USER_ENV if name in env})
    here, saved_stdin = Path.cwd(), sys.stdin
    try:
        os.chdir(cwd)
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
        # As batchctl()'s timeout: a command still running after CTL_TIMEOUT_SECONDS is interrupted (Ctrl-C).
        fired = threading.Event()
        timer = threading.Timer(CTL_TIMEOUT_SECONDS, lambda: (fired.set(), _thread.interrupt_main()))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                timer.start()
                code = cli.main(list(args))
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else 1
            finally:
                timer.cancel()
        assert not fired.is_set(), f"batchctl {' '.join(args)} still running after {CTL_TIMEOUT_SECONDS} s"
    finally:
        sys.stdin = saved_stdin
        os.chdir(here)
        for name in USER_ENV:
            os.environ.pop(name, None)
        os.environ.update(saved_env)
        out.flush()
        err.flush()
    return subprocess.CompletedProcess(["batchctl", *args], code, out.buffer.getvalue().decode(),
                                       err.buffer.getvalue().decode())


def one_line_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode != 0 and out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("batchctl: "), out.stderr
    return lines[0]


def test_admin_works_with_no_aws_setup(stack, fresh_env):
    created = batchctl(stack["dir"], fresh_env, "admin", "create-account", "--tier", "pro")
    assert created.returncode == 0, created.stderr
    account = created.stdout.strip()
    assert account.startswith("acct_") and "\n" not in account

    made = batchctl(stack["dir"], fresh_env, "admin", "create-key", "--account", account)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("hyi-") and "\n" not in key
    with httpx.Client(trust_env=False, timeout=10) as http:
        answer = http.get(f"{stack['base']}/batches", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text


def test_unknown_account_is_one_line(stack, fresh_env):
    line = one_line_error(batchctl(stack["dir"], fresh_env, "admin", "show", "--account", "acct_nonexistent"))
    assert "acct_nonexistent not found" in line


def test_local_stack_not_running_is_one_line(tmp_path, fresh_env):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    (tmp_path / ".local").mkdir()
    (tmp_path / ".local" / "stack.json").write_text(json.dumps({"aws_endpoint_url": url, "table_name": "gone"}))
    line = one_line_error(batchctl(tmp_path, fresh_env, "admin", "create-account", "--tier", "pro"))
    assert url in line and "not reachable" in line and "make run" in line


def test_no_stack_file_and_no_table_name_is_one_line(tmp_path, fresh_env):
    line = one_line_error(batchctl(tmp_path, fresh_env, "admin", "show", "--account", "acct_x"))
    assert "TABLE_NAME" in line and "make run" in line


# --- The user commands ------------------------------------------------------------------------------------

def chat_line(custom_id: str, text: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": MODEL, "messages": [{"role": "user", "content": text}], **body}})


def ok(out: subprocess.CompletedProcess, code: int = 0) -> subprocess.CompletedProcess:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    return out


def progress_lines(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if PROGRESS.match(line)]
    assert lines, stderr
    return lines


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def message_batch(stack, requests: list[dict]) -> str:
    """A Message Batch created through the API with the stack's key (batchctl submits only OpenAI batches)."""
    with httpx.Client(trust_env=False, timeout=30) as http:
        answer = http.post(f"{stack['base']}/messages/batches", json={"requests": requests}, headers={
            "Authorization": f"Bearer {stack['key']}", "anthropic-version": "2023-06-01"})
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def test_submit_inline_waits_and_writes_the_results_with_no_flags(stack, fresh_env, tmp_path):
    source = tmp_path / "requests.jsonl"
    source.write_text("\n".join([chat_line("a", "hello there"), chat_line("b", "no [[sim:400]]"),
                                 chat_line("c", "third one")]) + "\n")
    out = tmp_path / "out.jsonl"
    run = ok(batchctl(stack["dir"], fresh_env, "submit", str(source), "--wait", "-o", str(out),
                      "--metadata", "project=ctl", "--metadata", "run=1"))
    batch_id = run.stdout.strip()
    assert re.fullmatch(r"batch_\w+", batch_id), run.stdout  # stdout is the id, and only the id
    assert progress_lines(run.stderr)[-1].startswith(f"{batch_id}: 2/3 completed, 1 failed,")
    assert progress_lines(run.stderr)[-1].endswith("[completed]")
    results = jsonl(out.read_text())
    assert [r["custom_id"] for r in results] == ["a", "b", "c"]
    assert results[0]["response"]["status_code"] == 200 and results[0]["error"] is None
    assert results[1]["response"] is None and results[1]["error"]["code"] == "invalid_request"
    assert not (tmp_path / "out.jsonl.part").exists()

    failed = ok(ctl(stack["dir"], fresh_env, "results", batch_id, "--failed"))
    assert [r["custom_id"] for r in jsonl(failed.stdout)] == ["b"]
    shown = json.loads(ok(ctl(stack["dir"], fresh_env, "status", batch_id, "--json")).stdout)
    assert shown["status"] == "completed" and shown["metadata"] == {"project": "ctl", "run": "1"}
    assert shown["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    human = ok(ctl(stack["dir"], fresh_env, "status", batch_id)).stdout.splitlines()
    assert human[0] == f"{batch_id}  completed" and "3 total, 2 completed, 1 failed" in human[1]
    written = json.loads(ok(ctl(stack["dir"], fresh_env, "results", batch_id, "--failed", "--json",
                                     "-o", str(tmp_path / "failed.jsonl"))).stdout)
    assert written["lines"] == 1 and len(jsonl((tmp_path / "failed.jsonl").read_text())) == 1


def test_submit_a_prompt_list_with_model(stack, fresh_env, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('plain prompt\n\n"a \\"json\\" prompt"\n')
    line = one_line_error(ctl(stack["dir"], fresh_env, "submit", str(prompts)))
    assert "--model" in line
    run = ok(ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL, "--wait", "--json"))
    batch = json.loads(run.stdout)  # with --json, stdout is one JSON document: the batch as it ended
    assert batch["status"] == "completed" and batch["request_counts"]["total"] == 2
    results = jsonl(ok(ctl(stack["dir"], fresh_env, "results", batch["id"])).stdout)
    assert [r["custom_id"] for r in results] == ["request-1", "request-2"]
    answers = [r["response"]["body"]["choices"][0]["message"]["content"] for r in results]
    assert answers[0].startswith(f"Simulated answer from {MODEL} to: plain prompt")
    assert answers[1].startswith(f'Simulated answer from {MODEL} to: a "json" prompt')


def test_estimate_creates_nothing_and_says_what_the_batch_would_take(stack, fresh_env, tmp_path):
    prompts = tmp_path / "estimate.txt"
    prompts.write_text("tiktoken is great!\nhello world\n")
    listed = json.loads(ok(ctl(stack["dir"], fresh_env, "list", "--json")).stdout)["data"]
    shown = json.loads(ok(ctl(stack["dir"], fresh_env, "estimate", str(prompts), "--model", MODEL,
                                   "--json")).stdout)
    # 6 and 2 o200k_base tokens of text, 7 more each (OpenAI's chat counting rule); the catalog's output limit.
    assert shown["object"] == "batch.estimate" and shown["input_tokens"] == 13 + 9
    assert shown["max_output_tokens"] == 2 * 32768 and shown["fits_window"] is True
    human = ok(ctl(stack["dir"], fresh_env, "estimate", str(prompts), "--model", MODEL)).stdout.splitlines()
    assert human[0].startswith("2 requests, 22 input tokens (o200k_base), at most 65536 output tokens; cost $")
    assert human[1].startswith(f"  {MODEL}: 2 requests, ") and "within its 86400 s window" in human[-1]
    line = one_line_error(ctl(stack["dir"], fresh_env, "estimate", str(prompts), "--model", "no-such-model"))
    assert "requests[0]" in line and "no-such-model" in line
    assert json.loads(ok(ctl(stack["dir"], fresh_env, "list", "--json")).stdout)["data"] == listed


def test_execution_sends_a_batch_to_its_models_provider_tier_and_the_estimate_prices_it_there(
        stack, fresh_env, tmp_path):
    prompts = tmp_path / "tier.txt"
    prompts.write_text("first tier prompt\nsecond tier prompt\n")
    human = ok(ctl(stack["dir"], fresh_env, "estimate", str(prompts), "--model", MODEL, "--execution",
                   "provider_batch")).stdout.splitlines()
    assert human[1].startswith(f"  {MODEL}: 2 requests (2 on its provider's batch tier), "), human
    run = ok(ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL, "--execution", "provider_batch",
                 "--wait", "--json"))
    batch = json.loads(run.stdout)
    assert (batch["status"], batch["execution"], batch["request_counts"]["completed"]) == (
        "completed", "provider_batch", 2), batch
    assert batch["saved_usd"] > 0 and batch["cost_usd"] == pytest.approx(batch["saved_usd"], abs=1e-12)  # half
    assert "invalid choice" in ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL,
                                   "--execution", "cheap").stderr


def test_a_large_submission_goes_as_a_file_batch(stack, fresh_env, tmp_path):
    prompts = tmp_path / "many.txt"
    prompts.write_text("".join(f"prompt {i} {'x' * 40}\n" for i in range(30)))  # ~2.7 KB inline
    out = tmp_path / "many.jsonl"
    run = ok(ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL, "--inline-max-bytes", "1000",
                      "--wait", "-o", str(out)))
    batch_id = run.stdout.strip()
    assert re.search(r"uploaded many\.\w+\.jsonl \(\d+ bytes\) as file-", run.stderr), run.stderr  # POST /v1/files
    shown = json.loads(ok(ctl(stack["dir"], fresh_env, "status", batch_id, "--json")).stdout)
    assert shown["input_file_id"].startswith("file-") and shown["status"] == "completed"
    assert [r["custom_id"] for r in jsonl(out.read_text())] == [f"request-{i}" for i in range(1, 31)]

    # Larger than a part: the Uploads API. With an Idempotency-Key, submitting again reuses the upload and the
    # service answers with the first batch.
    args = ("submit", str(prompts), "--model", MODEL, "--inline-max-bytes", "1000", "--upload-part-bytes", "1000",
            "--idempotency-key", "ctl-file-1")
    first = ok(ctl(stack["dir"], fresh_env, *args))
    assert re.search(r"\(\d+ bytes, [3-9] parts\) as file-", first.stderr), first.stderr
    again = ok(ctl(stack["dir"], fresh_env, *args))
    assert again.stdout == first.stdout and "already created" in again.stderr, again.stderr
    shown = json.loads(ok(ctl(stack["dir"], fresh_env, "status", first.stdout.strip(), "--json")).stdout)
    assert shown["input_file_id"].startswith("file-") and shown["status"] != "failed"

    # A file whose lines the service refuses: the batch fails with nothing run; wait says why and exits 3.
    refused = tmp_path / "refused.jsonl"
    refused.write_text(json.dumps({**json.loads(chat_line("a", "x")), "extra": 1}) + "\n")
    batch_id = ok(ctl(stack["dir"], fresh_env, "submit", str(refused), "--inline-max-bytes", "0")).stdout.strip()
    waited = ok(ctl(stack["dir"], fresh_env, "wait", batch_id), 3)
    assert waited.stdout.startswith(f"{batch_id} failed:")
    assert f"{batch_id}: line 1: " in waited.stderr, waited.stderr


def test_message_batches_work_with_the_same_commands(stack, fresh_env, tmp_path):
    ours = ok(ctl(stack["dir"], fresh_env, "submit", "-", "--model", MODEL, stdin="from stdin\n")).stdout.strip()
    params = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    batch_id = message_batch(stack, [{"custom_id": "good", "params": params},
                                     {"custom_id": "bad", "params": {**params, "max_tokens": 0}}])
    waited = ok(ctl(stack["dir"], fresh_env, "wait", batch_id))  # errored requests alone: it completed
    assert progress_lines(waited.stderr)[-1].endswith("[ended]")
    assert waited.stdout.strip() == f"{batch_id} ended: 2 total, 1 succeeded, 1 errored, 0 canceled, 0 expired"
    assert json.loads(ok(ctl(stack["dir"], fresh_env, "status", batch_id, "--json")).stdout)[
        "type"] == "message_batch"
    listed = json.loads(ok(ctl(stack["dir"], fresh_env, "list", "--limit", "50", "--json")).stdout)
    ids = [b["id"] for b in listed["data"]]
    assert batch_id in ids and ours in ids
    failed = jsonl(ok(ctl(stack["dir"], fresh_env, "results", batch_id, "--failed")).stdout)
    assert [(r["custom_id"], r["result"]["type"]) for r in failed] == [("bad", "errored")]
    assert len(jsonl(ok(ctl(stack["dir"], fresh_env, "results", batch_id)).stdout)) == 2
    assert ok(ctl(stack["dir"], fresh_env, "delete", batch_id)).stdout.strip() == f"{batch_id} deleted"
    line = one_line_error(ctl(stack["dir"], fresh_env, "status", batch_id))  # Anthropic's error envelope
    assert line == f"batchctl: 404 No Message Batch found with id '{batch_id}'."


def test_retry_runs_again_what_did_not_succeed(stack, fresh_env):
    batch_id = ok(ctl(stack["dir"], fresh_env, "submit", "-", "--model", MODEL,
                           stdin="fine\n[[sim:400]] refused\n")).stdout.strip()
    ok(ctl(stack["dir"], fresh_env, "wait", batch_id))
    # The refused request's input is at fault: the default retries nothing; naming its code retries it.
    line = one_line_error(ctl(stack["dir"], fresh_env, "retry", batch_id))
    assert line.startswith("batchctl: 400 No request of batch") and "the retry" in line
    retried = ok(ctl(stack["dir"], fresh_env, "retry", batch_id, "--error-code", "invalid_request"))
    assert retried.stdout.strip() == f"{batch_id} in_progress (retried 1 times)"
    ok(ctl(stack["dir"], fresh_env, "wait", batch_id))
    status = json.loads(ok(ctl(stack["dir"], fresh_env, "status", batch_id, "--json")).stdout)
    assert status["retry_count"] == 1 and status["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert ok(ctl(stack["dir"], fresh_env, "retry", "--help")).stdout.count("--custom-id") >= 1


class Backend:
    """The simulated backend's hold: while held, every model request it gets stays in flight, unanswered, so a
    batch runs for as long as the test needs it running, however slowly the machine goes."""

    def __init__(self, sim: str) -> None:
        self.http = httpx.Client(base_url=sim, trust_env=False, timeout=10)

    def hold(self) -> None:
        self.http.put("/_sim/config", json={"hold": True}).raise_for_status()

    def release(self) -> None:
        self.http.put("/_sim/config", json={"hold": False}).raise_for_status()


@pytest.fixture
def backend(stack):
    backend = Backend(stack["sim"])
    backend.hold()
    yield backend
    backend.release()
    backend.http.close()


def test_interrupt_cancel_and_delete_of_a_running_batch(stack, fresh_env, tmp_path, backend):
    prompts = tmp_path / "slow.txt"
    # Many more than the backend is sent before the cancel (the model's budget of 16 held in flight, and what
    # the workers have taken): those left cancelled are the failed results.
    prompts.write_text("".join(f"slow prompt {i}\n" for i in range(150)))
    batch_id = ok(ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL)).stdout.strip()

    # Ctrl-C while waiting: 130, and how to resume; the batch runs on. (SIGINT as a terminal sends it; the
    # child's SIGINT is made the default again, in case this test runs where it is ignored.)
    waiting = subprocess.Popen([str(ROOT / "batchctl"), "wait", batch_id], cwd=stack["dir"], env=fresh_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = waiting.stderr.readline()
    assert PROGRESS.match(first.strip()), first
    waiting.send_signal(signal.SIGINT)
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 130 and out == "", (out, err)
    assert err.strip() == f"batchctl: interrupted: {batch_id} keeps running; resume waiting with " \
                          f"`batchctl wait {batch_id}`"

    line = one_line_error(ctl(stack["dir"], fresh_env, "results", batch_id))  # not final yet
    assert line.startswith("batchctl: 409 The batch has not finished")
    cancelled = json.loads(ok(ctl(stack["dir"], fresh_env, "cancel", batch_id, "--json")).stdout)
    assert cancelled["status"] in ("cancelling", "cancelled")
    backend.release()  # the requests in flight answer; the cancelled batch ends
    waited = ok(ctl(stack["dir"], fresh_env, "wait", batch_id, "--json"), 3)  # ended, not completed
    assert json.loads(waited.stdout)["status"] == "cancelled"
    assert progress_lines(waited.stderr)[-1].endswith("[cancelled]")
    assert jsonl(ok(ctl(stack["dir"], fresh_env, "results", batch_id, "--failed")).stdout)
    deleted = json.loads(ok(ctl(stack["dir"], fresh_env, "delete", batch_id, "--json")).stdout)
    assert deleted == {"id": batch_id, "object": "batch.deleted", "deleted": True}
    assert one_line_error(ctl(stack["dir"], fresh_env, "status", batch_id)) == \
        f"batchctl: 404 No batch found with id '{batch_id}'."

    backend.hold()
    params = {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "slow"}]}
    message_id = message_batch(stack, [{"custom_id": f"m{i}", "params": params} for i in range(150)])
    assert ok(ctl(stack["dir"], fresh_env, "cancel", message_id)).stdout.split() in (
        [message_id, "canceling"], [message_id, "ended"])
    backend.release()
    ok(ctl(stack["dir"], fresh_env, "wait", message_id), 3)  # ended after a cancel: not completed
    ok(ctl(stack["dir"], fresh_env, "delete", message_id))


def test_pause_and_resume_of_either_kind_of_batch(stack, fresh_env, tmp_path, backend):
    prompts = tmp_path / "paused.txt"
    prompts.write_text("".join(f"paused prompt {i}\n" for i in range(40)))
    batch_id = ok(ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL)).stdout.strip()
    paused = ok(ctl(stack["dir"], fresh_env, "pause", batch_id)).stdout.split()
    assert paused[0] == batch_id and paused[-1] == "paused", paused
    assert ok(ctl(stack["dir"], fresh_env, "pause", batch_id)).stdout.split() == paused  # again: unchanged
    shown = ok(ctl(stack["dir"], fresh_env, "status", batch_id)).stdout
    assert shown.splitlines()[0].endswith("(paused)") and f"batchctl resume {batch_id}" in shown, shown
    resumed = json.loads(ok(ctl(stack["dir"], fresh_env, "resume", batch_id, "--json")).stdout)
    assert resumed["id"] == batch_id and resumed["paused_at"] is None
    backend.release()
    waited = json.loads(ok(ctl(stack["dir"], fresh_env, "wait", batch_id, "--json")).stdout)
    assert waited["status"] == "completed" and waited["request_counts"]["completed"] == 40
    line = one_line_error(ctl(stack["dir"], fresh_env, "pause", batch_id))
    assert line == f"batchctl: 409 Batch '{batch_id}' has ended (completed): it cannot be paused."

    backend.hold()
    params = {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "paused"}]}
    message_id = message_batch(stack, [{"custom_id": f"m{i}", "params": params} for i in range(40)])
    assert ok(ctl(stack["dir"], fresh_env, "pause", message_id)).stdout.split() == [
        message_id, "in_progress", "paused"]
    assert ok(ctl(stack["dir"], fresh_env, "resume", message_id)).stdout.split() == [message_id, "in_progress"]
    backend.release()
    ok(ctl(stack["dir"], fresh_env, "wait", message_id))  # ended, every request succeeded


@pytest.mark.parametrize("args", [[], ["submit"], ["status"], ["list", "--limit", "0"], ["wait", "x", "--nope"],
                                  ["submit", "f.jsonl", "--endpoint", "/v1/nope"]])
def test_bad_usage_exits_2(stack, fresh_env, args):
    out = ctl(stack["dir"], fresh_env, *args)
    assert out.returncode == 2 and out.stdout == "" and "usage: batchctl" in out.stderr, out.stderr


def test_an_unreadable_input_file_exits_2_in_one_line(stack, fresh_env, tmp_path):
    line = one_line_error(ctl(stack["dir"], fresh_env, "submit", str(tmp_path / "missing.jsonl")))
    assert "missing.jsonl" in line
    (tmp_path / "mixed.jsonl").write_text(chat_line("a", "x") + "\nnot json\n")
    out = ctl(stack["dir"], fresh_env, "submit", str(tmp_path / "mixed.jsonl"))
    assert out.returncode == 2 and "line 2: not a JSON object" in one_line_error(out)
    out = ctl(stack["dir"], fresh_env, "submit", str(tmp_path / "mixed.jsonl"), "-o", "out.jsonl")
    assert out.returncode == 2 and "--wait" in one_line_error(out)


def test_api_errors_exit_1_in_one_line(stack, fresh_env):
    out = ctl(stack["dir"], fresh_env, "status", "batch_nonexistent")
    assert out.returncode == 1
    assert one_line_error(out) == "batchctl: 404 No batch found with id 'batch_nonexistent'."
    out = ctl(stack["dir"], fresh_env, "list", "--api-key", "hyi-not-a-key")
    assert out.returncode == 1 and one_line_error(out).startswith("batchctl: 401 ")
    out = ctl(stack["dir"], fresh_env, "status", "batch_x", "--base-url", f"http://127.0.0.1:{free_port()}/v1",
                   "--api-key", "hyi-x")
    assert out.returncode == 1 and "cannot reach" in one_line_error(out)


def test_configuration_from_the_environment_or_nowhere(stack, fresh_env, tmp_path):
    out = batchctl(tmp_path, fresh_env, "list")  # no .local here, nothing in the environment
    assert out.returncode == 2
    line = one_line_error(out)
    assert "BATCH_API_URL" in line and "make run" in line
    env = {**fresh_env, "BATCH_API_URL": stack["root"], "BATCH_API_KEY": stack["key"]}  # with or without /v1
    listed = json.loads(ok(batchctl(tmp_path, env, "list", "--limit", "1", "--json")).stdout)
    assert listed["object"] == "list" and len(listed["data"]) == 1
    # The local key goes only to the local stack's URL.
    out = batchctl(stack["dir"], fresh_env, "list", "--base-url", f"http://127.0.0.1:{free_port()}/v1")
    assert out.returncode == 2 and "BATCH_API_KEY" in one_line_error(out)


def test_submit_with_a_priority_and_change_it_while_it_runs(stack, fresh_env, tmp_path, backend):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(40)))
    batch_id = ok(ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL,
                           "--priority", "high")).stdout.strip()
    assert json.loads(ok(ctl(stack["dir"], fresh_env, "status", batch_id, "--json")).stdout)["priority"] == "high"
    assert ok(ctl(stack["dir"], fresh_env, "priority", batch_id, "low")).stdout.split() == [batch_id, "low"]
    human = ok(ctl(stack["dir"], fresh_env, "status", batch_id)).stdout.splitlines()
    assert human[2].split() == ["priority", "low"], human
    # A larger submission goes as a file batch: the priority goes with it.
    file_id = ok(ctl(stack["dir"], fresh_env, "submit", str(prompts), "--model", MODEL, "--priority", "low",
                          "--inline-max-bytes", "100")).stdout.strip()
    assert json.loads(ok(ctl(stack["dir"], fresh_env, "status", file_id, "--json")).stdout)["priority"] == "low"
    params = {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "slow"}]}
    message_id = message_batch(stack, [{"custom_id": f"m{i}", "params": params} for i in range(20)])
    changed = json.loads(ok(ctl(stack["dir"], fresh_env, "priority", message_id, "high", "--json")).stdout)
    assert changed["id"] == message_id and changed["priority"] == "high"

    out = ctl(stack["dir"], fresh_env, "priority", batch_id, "urgent")
    assert out.returncode == 2 and "invalid choice: 'urgent'" in out.stderr, out.stderr
    for ended in (batch_id, file_id, message_id):
        ok(ctl(stack["dir"], fresh_env, "cancel", ended))
    backend.release()  # the requests in flight answer; the cancelled batches end
    for ended in (batch_id, file_id, message_id):
        ctl(stack["dir"], fresh_env, "wait", ended)
    line = one_line_error(ctl(stack["dir"], fresh_env, "priority", batch_id, "high"))
    assert line.startswith(f"batchctl: 409 Batch '{batch_id}' has ended"), line


@pytest.fixture
def slow_backend(stack):
    """Every backend call takes 0.5 s for the test's length: a watch started at once finds the batch running
    (a worker records a chunk of requests' results together, so held calls would show nothing until let go)."""
    with httpx.Client(trust_env=False, timeout=10) as http:
        http.put(f"{stack['sim']}/_sim/config", json={"latency_seconds": 0.5}).raise_for_status()
        yield
        http.put(f"{stack['sim']}/_sim/config", json={"latency_seconds": 0.0}).raise_for_status()


def test_watch_prints_each_result_once_as_it_finishes_with_progress(stack, fresh_env, slow_backend):
    prompts = "".join(f"prompt {i}\n" for i in range(20)) + "[[sim:400]] refused\n"
    batch_id = ok(ctl(stack["dir"], fresh_env, "submit", "-", "--model", MODEL, stdin=prompts)).stdout.strip()
    watched = ok(ctl(stack["dir"], fresh_env, "watch", batch_id))
    results = jsonl(watched.stdout)
    assert len(results) == 21 and len({r["custom_id"] for r in results}) == 21  # each once
    assert sorted(r["status"] for r in results) == ["completed"] * 20 + ["failed"]
    assert progress_lines(watched.stderr)[-1].startswith(f"{batch_id}: 20/21 completed, 1 failed,")
    # From the end's cursor nothing more; an unknown cursor is one line.
    again = ok(ctl(stack["dir"], fresh_env, "watch", batch_id))
    assert jsonl(again.stdout) == results  # the same order for every reader
    line = one_line_error(ctl(stack["dir"], fresh_env, "watch", batch_id, "--after", "nonsense"))
    assert line.startswith("batchctl: 400") and "after" in line

    msg_id = message_batch(stack, [{"custom_id": f"m{i}", "params": {
        "model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": f"hi {i}"}]}} for i in range(3)])
    lines = jsonl(ok(ctl(stack["dir"], fresh_env, "watch", msg_id)).stdout)
    assert sorted(r["custom_id"] for r in lines) == ["m0", "m1", "m2"]
    assert {r["result"]["type"] for r in lines} == {"succeeded"}
