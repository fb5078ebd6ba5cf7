"""Text and chat data: reading files and datasets (whole or streamed), the embedded corpus,
tokenising, packing, resumable loaders."""
