"""batchctl's user commands: submit, estimate, status, list, wait, watch, results, priority, cancel, pause, resume,
retry and delete, as a client of the service's own HTTP API (never its storage). Batch ids (`batch_...`) go to
`/v1/batches`, Message Batch ids (`msgbatch_...`) to `/v1/messages/batches`; the commands are the same for
both.

stdout carries only what a command answers (a batch id, a status, results, or one JSON document with
--json); progress and notes go to stderr, and every failure is one line there: `batchctl: <message>`.

Here: the commands, their arguments and how a command's failure becomes its exit code. What they do is in
connection.py (where the calls go), submission.py and uploads.py (submit), views.py (status, list),
progress.py (wait), watch.py (watch) and results.py (results).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from .api_client import ApiClient, ApiFailure
from .common import (
    EXIT_API,
    EXIT_INTERRUPTED,
    EXIT_NOT_COMPLETED,
    EXIT_OK,
    EXIT_USAGE,
    LOCAL_STACK_FILE,
    UsageError,
    one_line,
)
from .connection import connection, env_defaults
from .estimate import cmd_estimate
from .progress import Interrupted, wait_for
from .results import download_results
from .submission import CHAT, ENDPOINTS, INLINE_MAX_BYTES, submit_batch
from .uploads import UPLOAD_PART_BYTES
from .views import BatchView, batch_path, batch_table, describe, fetch, list_batches
from .watch import watch

PRIORITIES = ("high", "normal", "low")  # a batch's priority among its account's batches
EXECUTIONS = ("direct", "provider_batch", "auto")  # how each model's part runs (docs/provider-batch.md)
EXECUTION_HELP = ("direct (one by one), provider_batch (each model's part on its provider's batch tier where the "
                  "catalog has one) or auto (as provider_batch, but a high priority batch runs directly); "
                  "default: each model's own; an extension of this service")

# --- Commands -----------------------------------------------------------------------------------------------

def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2), flush=True)


def _finish_wait(client: ApiClient, args: argparse.Namespace, view: BatchView, out: str | None,
                 summary_to_stdout: bool) -> int:
    print(view.summary(), file=sys.stdout if summary_to_stdout and not args.json else sys.stderr, flush=True)
    problems = (view.raw.get("errors") or {}).get("data") or []  # a file batch whose lines were refused
    for problem in problems[:5]:
        print(f"{view.id}: line {problem.get('line')}: {problem.get('code')}: {problem.get('message')}",
              file=sys.stderr)
    if len(problems) > 5:
        print(f"{view.id}: ... and more: batchctl status {view.id} --json", file=sys.stderr)
    if out:
        lines, failed = download_results(client, view.id, out, failed_only=False)
        print(f"wrote {lines} results ({failed} not succeeded) to {out}", file=sys.stderr, flush=True)
    if args.json:
        _print_json(view.raw)
    return EXIT_OK if view.completed_ok else EXIT_NOT_COMPLETED


def cmd_submit(client: ApiClient, args: argparse.Namespace) -> int:
    batch = submit_batch(client, args)
    if not args.json:
        print(batch["id"], flush=True)  # at once: a script (or a person) has it before the wait starts
    if not args.wait:
        if args.json:
            _print_json(batch)
        return EXIT_OK
    hint = f"batchctl wait {batch['id']}" + (f" -o {args.output}" if args.output else "")
    view = wait_for(client, batch["id"], args.poll_interval, hint)
    return _finish_wait(client, args, view, args.output, summary_to_stdout=False)


def cmd_wait(client: ApiClient, args: argparse.Namespace) -> int:
    hint = f"batchctl wait {args.id}" + (f" -o {args.output}" if args.output else "")
    view = wait_for(client, args.id, args.poll_interval, hint)
    return _finish_wait(client, args, view, args.output, summary_to_stdout=True)


def cmd_watch(client: ApiClient, args: argparse.Namespace) -> int:
    view = watch(client, args.id, args.after)
    print(view.summary(), file=sys.stderr, flush=True)
    return EXIT_OK if view.completed_ok else EXIT_NOT_COMPLETED


def cmd_status(client: ApiClient, args: argparse.Namespace) -> int:
    view = fetch(client, args.id)
    if args.json:
        _print_json(view.raw)
    else:
        print(describe(view))
    return EXIT_OK


def cmd_list(client: ApiClient, args: argparse.Namespace) -> int:
    views, more = list_batches(client, args.limit)
    if args.json:
        _print_json({"object": "list", "data": [v.raw for v in views], "has_more": more})
    elif views:
        print(batch_table(views))
        if more:
            print(f"(more: --limit {args.limit * 2})", file=sys.stderr)
    else:
        print("no batches", file=sys.stderr)
    return EXIT_OK


def cmd_results(client: ApiClient, args: argparse.Namespace) -> int:
    lines, failed = download_results(client, args.id, args.output, args.failed)
    if args.output and args.output != "-":
        if args.json:
            _print_json({"id": args.id, "path": args.output, "lines": lines, "not_succeeded": failed})
        else:
            print(f"wrote {lines} results to {args.output}", file=sys.stderr)
    return EXIT_OK


def cmd_cancel(client: ApiClient, args: argparse.Namespace) -> int:
    view = BatchView.of(client.post(batch_path(args.id) + "/cancel"))
    if args.json:
        _print_json(view.raw)
    else:
        print(f"{view.id} {view.status}")
    return EXIT_OK


def cmd_pause(client: ApiClient, args: argparse.Namespace) -> int:
    """Pause or resume (args.resume): the batch as it is now, `<id> <status> paused` while paused."""
    view = BatchView.of(client.post(batch_path(args.id) + ("/resume" if args.resume else "/pause")))
    if args.json:
        _print_json(view.raw)
    else:
        print(f"{view.id} {view.status}" + (" paused" if view.raw.get("paused_at") else ""))
    return 0


def cmd_retry(client: ApiClient, args: argparse.Namespace) -> int:
    """Retry in place (an extension): the batch's requests that did not succeed run again; no option, every
    one of them but those whose input is at fault (named by --custom-id or --error-code, those too)."""
    wanted = {name: values for name, values in (("custom_ids", args.custom_id), ("error_codes", args.error_code),
                                                ("statuses", args.status)) if values}
    view = BatchView.of(client.post(batch_path(args.id) + "/retry", wanted or None))
    if args.json:
        _print_json(view.raw)
    else:
        print(f"{view.id} {view.status} (retried {view.raw.get('retry_count', 0)} times)")
    return 0


def cmd_priority(client: ApiClient, args: argparse.Namespace) -> int:
    view = BatchView.of(client.post(batch_path(args.id) + "/priority", {"priority": args.priority}))
    if args.json:
        _print_json(view.raw)
    else:
        print(f"{view.id} {view.raw.get('priority', args.priority)}")
    return EXIT_OK


def cmd_delete(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.delete(batch_path(args.id))
    if args.json:
        _print_json(answer)
    else:
        print(f"{args.id} deleted")
    return EXIT_OK


# --- Arguments ----------------------------------------------------------------------------------------------

def _metadata(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {value!r}")
    return key, val


def _positive(kind: type) -> Any:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {value!r}") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, not {value}")
        return number
    return parse


def _common(env: dict[str, str | None]) -> argparse.ArgumentParser:
    """Options every user command takes, after its name (or before it: SUPPRESS keeps a value given
    before the command from being reset by the subcommand's default)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--base-url", default=env["base_url"],
                        help="the API's base URL, e.g. http://127.0.0.1:8000/v1 (default: $BATCH_API_URL, else the "
                             "local stack's, from .local/stack.json)")
    common.add_argument("--api-key", default=env["api_key"],
                        help="the API key (default: $BATCH_API_KEY, else the local stack's, .local/api-key)")
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument("--stack-file", type=Path, default=argparse.SUPPRESS,
                        help=f"the local stack's description (default: {LOCAL_STACK_FILE})")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="print the traceback of an error")
    return common


def _waiting(p: argparse.ArgumentParser) -> None:
    p.add_argument("--poll-interval", type=_positive(float), default=2.0, metavar="SECONDS",
                   help="the longest time between two looks at the batch (default: 2)")


def add_commands(groups: argparse._SubParsersAction) -> None:
    """The user commands and their options."""
    common = _common(env_defaults())

    p = groups.add_parser("submit", parents=[common], help="submit a batch; prints its id",
                          description="Submit FILE as a batch and print its id. FILE (or - for stdin) holds OpenAI "
                                      "batch lines ({custom_id, method, url, body}) or prompts, one a line (text or "
                                      "a JSON string), with --model. Small batches go inline; larger ones as a file "
                                      "batch (uploaded first).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--model", help="the model of prompts, and of batch lines whose body names none")
    p.add_argument("--endpoint", choices=ENDPOINTS, default=None,
                   help=f"the url of prompts and of batch lines that give none (default: {CHAT})")
    p.add_argument("--metadata", type=_metadata, action="append", metavar="KEY=VALUE", help="repeatable")
    p.add_argument("--max-cost", type=_positive(float), metavar="USD",
                   help="the batch's spending cap (max_cost_usd): it stops before a request could pass it")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="sent as Idempotency-Key: submitting again with it answers with the first batch")
    p.add_argument("--priority", choices=PRIORITIES, default=None,
                   help="among your own batches (default: normal); an extension of this service")
    p.add_argument("--execution", choices=EXECUTIONS, default=None, help=EXECUTION_HELP)
    p.add_argument("--wait", action="store_true", help="wait for the batch to end, showing progress")
    p.add_argument("-o", "--output", metavar="OUT", help="with --wait: write the results there (JSONL)")
    p.add_argument("--inline-max-bytes", type=int, default=INLINE_MAX_BYTES, metavar="BYTES",
                   help=f"larger batches go as a file batch (default: {INLINE_MAX_BYTES})")
    p.add_argument("--upload-part-bytes", type=_positive(int), default=UPLOAD_PART_BYTES, metavar="BYTES",
                   help="a file batch's input larger than this goes through the Uploads API in parts of this size "
                        f"(default: {UPLOAD_PART_BYTES}, the service's part limit)")
    _waiting(p)
    p.set_defaults(handler=cmd_submit)

    p = groups.add_parser("estimate", parents=[common], help="what a batch of FILE would cost and when it would end",
                          description="Estimate FILE as a batch (an extension): requests, input tokens, the cost "
                                      "range, the queue ahead and when it would end if submitted now. Nothing is "
                                      "created. FILE as for submit.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--model", help="the model of prompts, and of batch lines whose body names none")
    p.add_argument("--endpoint", choices=ENDPOINTS, default=None, help=f"as for submit (default: {CHAT})")
    p.add_argument("--max-cost", type=_positive(float), metavar="USD", help="as for submit: checked as create would")
    p.add_argument("--priority", choices=PRIORITIES, default=None, help="as for submit (auto runs a high one directly)")
    p.add_argument("--execution", choices=EXECUTIONS, default=None,
                   help="as for submit: each model's part priced the way it would run")
    p.set_defaults(handler=cmd_estimate)

    p = groups.add_parser("status", parents=[common], help="a batch's status and counts")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_status)

    p = groups.add_parser("list", parents=[common], help="your batches of both kinds, newest first")
    p.add_argument("--limit", type=_positive(int), default=20, metavar="N", help="at most N (default: 20)")
    p.set_defaults(handler=cmd_list)

    p = groups.add_parser("wait", parents=[common], help="wait for a batch to end, showing progress",
                          description="Wait for a batch to end. Exits 0 when it completed, 3 when it ended "
                                      "otherwise (failed, expired, cancelled), 130 on Ctrl-C (it runs on).")
    p.add_argument("id", metavar="ID")
    p.add_argument("-o", "--output", metavar="OUT", help="then write its results there (JSONL)")
    _waiting(p)
    p.set_defaults(handler=cmd_wait)

    p = groups.add_parser("watch", parents=[common], help="print a batch's results as they finish, with progress",
                          description="Print a batch's results as they finish, one JSON line each, until it has "
                                      "ended (an extension: the service's results in finished order). Exits as "
                                      "wait does; on Ctrl-C it names the --after cursor to go on from.")
    p.add_argument("id", metavar="ID")
    p.add_argument("--after", metavar="CURSOR", help="go on from this cursor (a page's last_id)")
    p.set_defaults(handler=cmd_watch)

    p = groups.add_parser("results", parents=[common], help="a batch's results as JSONL, once it has ended")
    p.add_argument("id", metavar="ID")
    p.add_argument("-o", "--output", metavar="FILE", help="write them there (default: stdout)")
    p.add_argument("--failed", action="store_true", help="only the requests that did not succeed")
    p.set_defaults(handler=cmd_results)

    p = groups.add_parser("priority", parents=[common], help="change a running batch's priority",
                          description="Change a batch's priority among your own batches while it runs: high ones "
                                      "take your share of a model first, low ones last. Never over another "
                                      "account's batches. Refused (exit 1) once the batch has ended.")
    p.add_argument("id", metavar="ID")
    p.add_argument("priority", choices=PRIORITIES)
    p.set_defaults(handler=cmd_priority)

    p = groups.add_parser("cancel", parents=[common], help="cancel a batch (running requests finish)")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_cancel)

    p = groups.add_parser("pause", parents=[common], help="pause a batch: no request starts (running ones "
                          "finish) until it is resumed; its window keeps running")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_pause, resume=False)

    p = groups.add_parser("resume", parents=[common], help="resume a paused batch")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_pause, resume=True)

    p = groups.add_parser("retry", parents=[common], help="run again an ended batch's requests that did not succeed",
                          description="Retry in place (an extension): an ended batch runs again its requests that did "
                                      "not succeed, keeping every success. With no option, every one of them but "
                                      "those whose input is at fault (invalid_request and the like), which run "
                                      "again only when named by --custom-id or --error-code.")
    p.add_argument("id", metavar="ID")
    p.add_argument("--custom-id", action="append", metavar="X", help="only this request (repeatable)")
    p.add_argument("--error-code", action="append", metavar="C",
                   help="only requests whose error has this code, as the results show it (repeatable)")
    p.add_argument("--status", action="append", metavar="S",
                   help="only requests with this result status (repeatable): failed, expired, cancelled; for a "
                        "Message Batch errored, expired, canceled")
    p.set_defaults(handler=cmd_retry)

    p = groups.add_parser("delete", parents=[common], help="delete a batch with its results")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_delete)


def run_command(args: argparse.Namespace) -> int:
    """Run one user command. Exit codes: see common.py (0, 1, 2, 3, 130)."""
    try:
        if args.handler is cmd_submit and args.output and not args.wait:
            raise UsageError("-o/--output needs --wait (or use `batchctl results ID -o OUT` later)")
        base_url, key = connection(args)
        with ApiClient(base_url, key) as client:
            return args.handler(client, args)
    except (UsageError, ApiFailure, Interrupted) as error:
        code = EXIT_USAGE if isinstance(error, UsageError) else EXIT_API if isinstance(error, ApiFailure) \
            else EXIT_INTERRUPTED
        return _fail(args, error, code)
    except KeyboardInterrupt as error:
        return _fail(args, error, EXIT_INTERRUPTED, "interrupted")
    except BrokenPipeError:  # `batchctl results ID | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as error:  # a bug: still one line; --debug shows where
        return _fail(args, error, EXIT_API, f"unexpected error: {type(error).__name__}: {error}")


def _fail(args: argparse.Namespace, error: BaseException, code: int, text: str | None = None) -> int:
    if getattr(args, "debug", False):
        traceback.print_exception(error)
    print(f"batchctl: {one_line(text or error)}", file=sys.stderr, flush=True)
    return code
