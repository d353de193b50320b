"""Stage 2 of 4 (store -> format -> archive -> query): records, entries, batches and key indexes as bytes."""
