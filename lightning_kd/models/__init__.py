"""Teacher and student: loading, students built from the teacher's layers, LoRA, int8 teachers,
precision from the hardware, capture hooks, layer pairs and digests. Knows transformers, not the
training loop."""
