"""Stage 1 of 4 (store -> format -> archive -> query): the broker's local store, read read-only."""
