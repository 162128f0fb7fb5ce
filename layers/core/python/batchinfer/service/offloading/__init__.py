"""Offloading to a provider's batch tier (docs/provider-batch.md): which part of a batch goes to its model's
provider batch tier (`execution`), and the provider jobs that carry it (`jobs`: one record per job, written
before the provider's job, looked at on schedule by the sweeper, its results landed through the ledger as a
direct call's are, what it did not finish handed back to run directly).

May touch: the batch (its lane cursors, its counters), its request items and its provider-job records, each
change fenced on what it was decided from; a batch's status only through `..lifecycle`.
"""
