"""Stage 4 of 4 (store -> format -> archive -> query): reading the archive: reader, scans, Spark, export."""
