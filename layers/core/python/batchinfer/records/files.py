"""Files: a batch file's record, and an upload (a file sent in parts) until it becomes one."""

from __future__ import annotations

from collections.abc import Iterator

from ..layout import OWNER_FILE_PREFIX, file_key, owner_file_sort, owner_partition, upload_key
from ..storage.dynamo import Table
from .batches import Batch
from .expressions import Op
from .items import FileItem, UploadItem


class File:
    """A batch file's record; its bytes are one S3 object (layout.file_object)."""

    @staticmethod
    def new(*, file_id: str, account_id: str, filename: str, purpose: str, size: int, sha256: str, now: int,
            expires_at: int | None, owner_created_us: int, batch_id: str | None = None) -> FileItem:
        pk, sk = file_key(file_id)
        item: FileItem = {"pk": pk, "sk": sk, "id": file_id, "account_id": account_id, "filename": filename,
                          "purpose": purpose, "bytes": size, "sha256": sha256, "created_at": now,
                          "expires_at": expires_at, "owner_pk": owner_partition(account_id),
                          "owner_sk": owner_file_sort(owner_created_us, file_id)}
        if batch_id:
            item["batch_id"] = batch_id
        if expires_at:
            item["ttl"] = expires_at + 86400
        return item

    @staticmethod
    def get(t: Table, file_id: str) -> FileItem | None:
        return t.get(*file_key(file_id))  # type: ignore[return-value]

    @staticmethod
    def create(t: Table, item: FileItem) -> Op:
        return t.op_put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def register_result(t: Table, item: FileItem) -> list[Op]:
        """A batch's output or error file (written again the same by a writer that runs again), only while
        its batch is not being deleted: a file registered after the purge removed its files would outlive it."""
        return [t.op_put(item), Batch.not_deleting(t, item["batch_id"])]

    @staticmethod
    def delete(t: Table, file_id: str) -> None:
        t.delete(*file_key(file_id))

    @staticmethod
    def of_owner(t: Table, account_id: str, limit: int, start: dict | None, newest_first: bool = True,
                 ) -> tuple[list[FileItem], dict | None]:
        return t.query("owner_pk = :o AND begins_with(owner_sk, :f)",
                       {":o": owner_partition(account_id), ":f": OWNER_FILE_PREFIX}, index="by_owner",
                       forward=not newest_first, limit=limit, start=start)  # type: ignore[return-value]

    @staticmethod
    def all_of_owner(t: Table, account_id: str) -> Iterator[FileItem]:
        return t.query_all("owner_pk = :o AND begins_with(owner_sk, :f)",
                           {":o": owner_partition(account_id), ":f": OWNER_FILE_PREFIX},
                           index="by_owner")  # type: ignore[return-value]

    @staticmethod
    def owner_cursor(item: FileItem) -> dict:
        return {"pk": item["pk"], "sk": item["sk"], "owner_pk": item["owner_pk"], "owner_sk": item["owner_sk"]}


# --- Upload (a file sent in parts) ----------------------------------------------------------------------

class Upload:
    """A file sent in parts (the Uploads API): pending while parts are added, then completed into a file
    (`File`) or cancelled; each of those is fenced on it still being pending."""

    PENDING, COMPLETED, CANCELLED = "pending", "completed", "cancelled"

    @staticmethod
    def new(*, upload_id: str, account_id: str, filename: str, purpose: str, mime_type: str, size: int, now: int,
            expires_at: int, file_expires_after: int | None) -> UploadItem:
        pk, sk = upload_key(upload_id)
        item: UploadItem = {"pk": pk, "sk": sk, "id": upload_id, "account_id": account_id, "filename": filename,
                            "purpose": purpose, "mime_type": mime_type, "bytes": size, "created_at": now,
                            "expires_at": expires_at, "status": Upload.PENDING, "parts": {}, "received": 0,
                            "ttl": expires_at + 86400}
        if file_expires_after:
            item["file_expires_after"] = file_expires_after
        return item

    @staticmethod
    def get(t: Table, upload_id: str) -> UploadItem | None:
        return t.get(*upload_key(upload_id))  # type: ignore[return-value]

    @staticmethod
    def create(t: Table, item: UploadItem) -> None:
        t.put(item, condition="attribute_not_exists(pk)")

    @staticmethod
    def add_part(t: Table, upload_id: str, part_id: str, size: int, now: int, max_received: int,
                 max_parts: int) -> None:
        """Record a part whose bytes are stored. Fenced on the upload being pending and unexpired, on its
        parts staying within `max_received` bytes together and on fewer than `max_parts` parts (the record
        must stay far below DynamoDB's 400 KB). ConditionFailed otherwise."""
        t.update(*upload_key(upload_id), "SET #parts.#part = :size ADD #received :size", names={"#part": part_id},
                 vals={":size": size, ":pending": Upload.PENDING, ":now": now, ":room": max_received - size,
                       ":most": max_parts},
                 condition="#status = :pending AND expires_at > :now AND #received <= :room "
                           "AND size(#parts) < :most")

    @staticmethod
    def complete(t: Table, upload_id: str, file_id: str, part_ids: list[str], now: int) -> Op:
        """pending -> completed into `file_id` (in one transaction with the file's record). Fenced on it
        being pending and unexpired."""
        return t.op_update(*upload_key(upload_id),
                           "SET #status = :completed, file_id = :file, part_ids = :ids, completed_at = :now",
                           vals={":completed": Upload.COMPLETED, ":file": file_id, ":ids": part_ids, ":now": now,
                                 ":pending": Upload.PENDING},
                           condition="#status = :pending AND expires_at > :now")

    @staticmethod
    def cancel(t: Table, upload_id: str, now: int) -> None:
        """pending -> cancelled. ConditionFailed when it is not pending (any more)."""
        t.update(*upload_key(upload_id), "SET #status = :cancelled, cancelled_at = :now",
                 vals={":cancelled": Upload.CANCELLED, ":now": now, ":pending": Upload.PENDING},
                 condition="#status = :pending")
