"""Running a request on its backend: `backend_call`, the one call path (routing, translation, cost) that a
batch request (`run_request`: the checks before a run, its outcome, the worker's pump) and an interactive
call (`interactive`) both go through; `batch_usage`, how a batch's usage and cost are shown; `request_file`,
request bodies read back from a batch's file (a run's group, a provider job's page).

May touch: the ledger (every outcome is its transaction), the request bodies in S3, the providers, the
scheduler's pump it starts; a batch it stops or settles goes through `..lifecycle`.
"""
