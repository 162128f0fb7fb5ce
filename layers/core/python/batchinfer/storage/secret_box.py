"""Secrets the service keeps for callers (webhook signing secrets), encrypted with KMS: a key of the
stack's on AWS, the moto server's stand-in locally. Each ciphertext is bound to its account by KMS's
encryption context, so one account's sealed secret cannot be opened as another's."""

from __future__ import annotations

import base64

from .aws import client


class SecretBox:
    def __init__(self, endpoint_url: str | None, region: str, key_id: str) -> None:
        self.endpoint_url, self.region, self.key_id = endpoint_url, region, key_id

    def _kms(self):
        return client("kms", self.endpoint_url, self.region)

    def seal(self, plaintext: str, context: dict[str, str]) -> str:
        answer = self._kms().encrypt(KeyId=self.key_id, Plaintext=plaintext.encode(), EncryptionContext=context)
        return base64.b64encode(answer["CiphertextBlob"]).decode()

    def open(self, sealed: str, context: dict[str, str]) -> str:
        answer = self._kms().decrypt(CiphertextBlob=base64.b64decode(sealed), EncryptionContext=context,
                                     KeyId=self.key_id)
        return answer["Plaintext"].decode()

