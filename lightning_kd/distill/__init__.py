"""The distillation step as plain PyTorch: the objective, the Distiller, exact accumulation,
on-policy micro-batches and the block-wise repair stage. No Lightning below this line."""
