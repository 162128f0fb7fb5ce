"""Creating a batch: its requests checked (`validation`, and `message_params` for a Messages request), its
estimate before it runs (`forecast`, with token counts from `tokenizer`), and `intake`, which stores what
was checked in S3 and one DynamoDB transaction, or nothing for a batch that is refused.

May touch: the batch's and the account's records, the request bodies in S3, the catalog, the account's
checks (`..accounts`); a file batch's validation failure goes through `..lifecycle`.
"""
