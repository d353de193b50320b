"""Stage 3 of 4 (store -> format -> archive -> query): the cold tier: objects, manifests, commits, lease."""
