"""The scheduler: which batch requests run when, on how many of a model's slots.

`dispatcher` makes the claim pass (retries first, then `lanes`: batches taking turns); `pump` keeps a
worker's slots busy from work it claims ahead; `capacity` says how many slots a model may fill now; `policy`
holds the arithmetic of all of them as pure functions; `config` their knobs. It sits below the service:
what runs one request is the service's (service.running.run_request), handed to the pump.
"""
