"""The OpenAI-shaped batch API's operations: batches (`/v1/batches`), the files they read and write
(`/v1/files`) and files sent in parts (`/v1/uploads`). Its description (ids, shapes) is `protocols.openai`."""
