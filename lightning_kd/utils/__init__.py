"""The ground floor: crash-safe file writes, writer locks, file digests, and the one fence around
Lightning's private API."""
