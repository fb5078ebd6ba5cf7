"""The ground floor: crash-safe file writes and the one fence around Lightning's private API."""
