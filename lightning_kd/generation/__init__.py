"""Decoding outside the training step's graph: sampling helpers, interleaved sampling, and the
teacher's completions for sequence-level KD."""
