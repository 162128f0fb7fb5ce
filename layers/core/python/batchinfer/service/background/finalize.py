"""Writing what a batch leaves behind when it ends, as a resumable step: its output and error files (a
batch from a file) and its output.jsonl export (a batch too large for one API answer).

Each is an S3 multipart upload written a part at a time from the batch's results, which no longer change.
After every part (and when a run's time is up: lines too few for a part wait in a small "carry" object)
the cursor (upload id, parts written, the next request index, the carry) is saved on the batch item
under a condition on the previous cursor, so a run cut off by its deadline, a crash or a timeout is picked
up by the next run where it stopped, and two runs cannot both advance one file: the loser stops (at the save,
or earlier, when the upload it writes into was completed by the winner: S3's NoSuchUpload). A part
is built from whole pages of results, so a part written again after a crash has the same bytes. The
SHA-256 of a finished file is read back from S3 (a hash cannot be saved halfway), and becomes its ETag.
"""

from __future__ import annotations

import hashlib
import time
from time import time_ns

from ... import protocols
from ...jsontext import to_json
from ...layout import export_object, file_object
from ...records import Batch, BatchItem, File, FileItem
from ...runtime import Services
from ...storage.blobs import UploadGone
from ...storage.dynamo import ConditionFailed
from ..reading.results import EXPORT_PAGE, iter_results

RESULT = "batch_output"  # the purpose of a batch's output and error files


def _key(batch: BatchItem, kind: str) -> str:
    return export_object(batch["id"]) if kind == "export" else file_object(batch["result_file_ids"][kind])


def _lines(svc: Services, batch: BatchItem, kind: str, start: int, end: int) -> bytes:
    protocol = protocols.of_batch(batch)
    shape = protocol.export_line if kind == "export" else protocol.result_file_lines[kind]
    out = []
    for r in iter_results(svc, batch, start, end):
        line = shape(r)
        if line is not None:
            out.append(to_json(line).encode() + b"\n")
    return b"".join(out)


def _sha256(svc: Services, key: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for chunk in svc.blobs.stream(key):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def write(svc: Services, batch: BatchItem, kinds: tuple[str, ...], deadline: float | None = None) -> BatchItem | None:
    """Advance the batch's writers of `kinds` until they are done or `deadline` (time.monotonic()) comes.
    Returns the batch with every writer done (`writing.<kind>.done`, and `.file` for result files: an id,
    or None when the file would be empty), or None when time ran out or another run holds a writer."""
    part_bytes = svc.settings.result_part_bytes
    for kind in kinds:
        while True:
            state = (batch.get("writing") or {}).get(kind)
            if state and state.get("done"):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return None
            current = Batch.get(svc.table, batch["id"])
            if current is None or (current.get("writing") or {}).get(kind) != state:
                return None  # another run advanced this writer (or the batch went): it carries on
            key = _key(batch, kind)
            if state is None:
                upload_id = svc.blobs.start_multipart(key, "application/jsonl")
                new = {"upload_id": upload_id, "parts": [], "next": 0, "done": False}
            else:
                new = {**state, "parts": list(state["parts"]), "carry": None}
                # Lines read by an earlier run that were too few for a part (S3 wants >= 5 MiB but for the
                # last) wait in a carry object.
                buffer = (svc.blobs.get(state["carry"]) or b"") if state.get("carry") else b""
                end = new["next"]
                out_of_time = False
                # Whole pages until the part is big enough, the results end, or time runs out.
                while end < batch["total"] and len(buffer) < part_bytes:
                    if deadline is not None and time.monotonic() >= deadline:
                        out_of_time = True
                        break
                    stop = min(batch["total"], end + EXPORT_PAGE)
                    buffer += _lines(svc, batch, kind, end, stop)
                    end = stop
                if out_of_time:  # keep what was read: the next run goes on from `end`
                    if buffer:
                        new["carry"] = f"{key}.carry-{end}"
                        svc.blobs.put(new["carry"], buffer)
                new["next"] = end
                try:
                    if buffer and not out_of_time:
                        number = len(new["parts"]) + 1
                        new["parts"].append([number, svc.blobs.put_part(key, new["upload_id"], number, buffer)])
                    if end >= batch["total"] and not out_of_time:
                        new.update(_complete(svc, batch, kind, key, new))
                except UploadGone:
                    # Another run, past the same check a moment before, finished this writer's upload (or
                    # started it again): it saves the cursor; this run stops, as when it loses the save.
                    return None
                except ConditionFailed:  # the batch is being deleted: its file must not outlive the purge
                    svc.blobs.delete(key)
                    return None
            try:
                Batch.save_writer(svc.table, batch["id"], kind, new, previous=state)
            except ConditionFailed:
                if state is None:  # another run started this writer at the same moment: keep its upload
                    svc.blobs.abort_multipart(key, new["upload_id"])
                return None  # another run advanced this writer: it carries on
            if state is None:
                # This upload is the writer's now. Any other on the key was started by a run cut off before it
                # saved its upload id (or one that lost the race above, and aborts its own): its parts would
                # cost storage for good.
                svc.blobs.abort_uploads(key, keep=new["upload_id"])
            if state and state.get("carry") and state["carry"] != new.get("carry"):
                svc.blobs.delete(state["carry"])  # its lines are in a part, or in the new carry, now
            batch = {**batch, "writing": {**(batch.get("writing") or {}), kind: new}}
    return batch


def _complete(svc: Services, batch: BatchItem, kind: str, key: str, state: dict) -> dict:
    """The last part is written: finish the object (or drop it when it has no line) and fix its bytes."""
    if not state["parts"]:
        svc.blobs.abort_multipart(key, state["upload_id"])
        return {"done": True, "file": None}
    svc.blobs.complete_multipart(key, state["upload_id"], state["parts"])
    if kind == "export":
        return {"done": True}
    sha256, size = _sha256(svc, key)
    expires_after = batch.get("output_expires_after")
    now = svc.now()
    register_result_file(svc, file_id=batch["result_file_ids"][kind], account_id=batch["account_id"],
                         batch_id=batch["id"], filename=f"{batch['id']}_{kind}.jsonl", size=size, sha256=sha256,
                         expires_at=now + int(expires_after) if expires_after else
                         now + svc.settings.batch_retention_seconds)
    return {"done": True, "file": batch["result_file_ids"][kind]}


def register_result_file(svc: Services, *, file_id: str, account_id: str, batch_id: str, filename: str, size: int,
                         sha256: str, expires_at: int | None) -> FileItem:
    """The record of a batch's output or error file, once its bytes are written. A run that writes it again
    writes the same record. Raises ConditionFailed once the batch is being deleted."""
    item = File.new(file_id=file_id, account_id=account_id, filename=filename, purpose=RESULT, size=size,
                    sha256=sha256, now=svc.now(), expires_at=expires_at, owner_created_us=time_ns() // 1000,
                    batch_id=batch_id)
    svc.table.transact(File.register_result(svc.table, item))
    return item
