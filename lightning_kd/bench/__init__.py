"""The benchmark and the soak: memory and speed of a KD step against its floor."""
