"""Use cases: accounts, batches, dispatch, work, sweep."""
