"""Change sources and sinks: the Delta transaction log, Delta CDF, and the MERGE writer of stream tables."""
