"""S3: request bodies, lane position lists, large results and exports."""

from __future__ import annotations

from collections.abc import Iterator

from botocore.exceptions import ClientError


class UploadGone(Exception):
    """The multipart upload is no longer there: completed or aborted (by another writer of the same object)."""


def _no_such_upload(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "NoSuchUpload"


class Blobs:
    def __init__(self, s3_client, bucket: str) -> None:
        self.s3 = s3_client
        self.bucket = bucket

    def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type)

    def get(self, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        answer = self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
        return answer["Body"].read()

    def read_range(self, key: str, offset: int, length: int) -> tuple[bytes, int]:
        """Up to `length` bytes from `offset` and the object's whole size; (b"", size) from its end on."""
        try:
            answer = self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "InvalidRange":
                raise
            return b"", int(self.s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        total = str(answer.get("ContentRange") or "").rpartition("/")[2]
        data = answer["Body"].read()
        return data, int(total) if total.isdigit() else offset + len(data)

    def keys(self, prefix: str) -> list[str]:
        """The keys of the objects under `prefix` (a few: every page is listed)."""
        return [o["Key"] for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                                       Prefix=prefix)
                for o in page.get("Contents", [])]

    def stream(self, key: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        yield from body.iter_chunks(chunk)

    def copy(self, source: str, target: str) -> None:
        """A server-side copy (no bytes through this process; S3 copies objects up to 5 GB in one call)."""
        self.s3.copy_object(Bucket=self.bucket, Key=target, CopySource={"Bucket": self.bucket, "Key": source})

    def delete(self, key: str) -> None:
        """Delete one object (deleting one that is not there is no error)."""
        self.s3.delete_object(Bucket=self.bucket, Key=key)

    def delete_prefix(self, prefix: str) -> int:
        deleted = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
                deleted += len(keys)
        return deleted

    def put_stream(self, key: str, chunks: Iterator[bytes], content_type: str, part_bytes: int = 8 << 20) -> int:
        """Upload an object of any size from an iterator, one part in memory at a time. Returns its size."""
        upload_id = self.start_multipart(key, content_type)
        parts, buffer, size = [], bytearray(), 0
        try:
            for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                if len(buffer) >= part_bytes:
                    parts.append([len(parts) + 1, self.put_part(key, upload_id, len(parts) + 1, bytes(buffer))])
                    buffer.clear()
            if buffer or not parts:
                parts.append([len(parts) + 1, self.put_part(key, upload_id, len(parts) + 1, bytes(buffer))])
            self.complete_multipart(key, upload_id, parts)
        except Exception:
            self.abort_multipart(key, upload_id)
            raise
        return size

    # A multipart upload a step at a time (resumable writers keep the upload id and parts themselves).
    def start_multipart(self, key: str, content_type: str) -> str:
        return self.s3.create_multipart_upload(Bucket=self.bucket, Key=key, ContentType=content_type)["UploadId"]

    def put_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        """Write (or write again, the same bytes) part `number`; returns its ETag. Raises UploadGone when the
        upload was completed or aborted meanwhile."""
        try:
            return self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                       Body=data)["ETag"]
        except ClientError as error:
            if _no_such_upload(error):
                raise UploadGone(upload_id) from error
            raise

    def complete_multipart(self, key: str, upload_id: str, parts: list) -> None:
        """Finish the object from [number, etag] parts. Finishing it again (a run that stopped right after
        finishing it, started again) is no error as long as the object is there; UploadGone when it is not
        (another writer aborted the upload)."""
        try:
            self.s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={
                "Parts": [{"PartNumber": n, "ETag": etag} for n, etag in parts]})
        except ClientError as error:
            if not _no_such_upload(error):
                raise
            if not self.exists(key):
                raise UploadGone(upload_id) from error

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as error:
            if not _no_such_upload(error):
                raise

    def abort_uploads(self, prefix: str, keep: str | None = None) -> int:
        """Abort the multipart uploads under `prefix` (but `keep`, an upload id): their parts cost storage
        until aborted, and a writer cut off before it saved its upload id cannot abort its own."""
        aborted = 0
        for page in self.s3.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                if upload["UploadId"] != keep:
                    self.abort_multipart(upload["Key"], upload["UploadId"])
                    aborted += 1
        return aborted

    def delete_page(self, prefix: str, most: int = 1000) -> int:
        """Delete up to `most` (at most 1,000) objects under `prefix`, one list and one delete call: a step a
        caller with a deadline repeats until it returns 0."""
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=min(most, 1000))
        keys = [{"Key": o["Key"]} for o in listed.get("Contents", [])]
        if keys:
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
        return len(keys)

    def exists(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise

    def presigned_get(self, key: str, seconds: int = 300) -> str:
        return self.s3.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": key},
                                              ExpiresIn=seconds)
