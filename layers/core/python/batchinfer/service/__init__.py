"""The service's use cases, one folder each: `creating` a batch (or its estimate), `steering` one that
exists (retry, pause, priority, spending cap), `reading` what a batch holds, `running` a request on its
backend (a batch's or an interactive call) and the `background` work the sweeper and the webhooks function
do. At the top, what they share: `accounts` (who may do what), `account_waiters` (requests waiting on their
account), `limits` (an account's request rate and long-poll holds) and `lifecycle`, the only place a
batch's status changes.

The service uses records, the ledger, storage, providers and the scheduler below it, and the protocols'
registry (`protocols`), never a protocol's own package: it is the same for every batch API. Each API's
operations (`operations/`) and the routes call it; it calls neither.
"""
