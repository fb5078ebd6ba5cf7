"""Text and chat data: reading files, the embedded corpus, tokenising, packing, resumable
loaders."""
