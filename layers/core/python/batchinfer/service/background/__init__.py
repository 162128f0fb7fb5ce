"""The background work: the sweeper's scan (`sweep`: leases that ran out, file batches to validate,
windows, endings, purges), what an ending leaves behind (`finalize`: result files and exports, written a
part at a time), and completion webhooks (`webhooks`: the registration, the event an ending writes, its
delivery and re-sends).

May touch: every record of the batches it walks, each step in its own bulkhead; every status change goes
through `..lifecycle`.
"""
