"""The Lightning layer: the LightningModule around the Distiller, strategies, checkpoints, metrics,
optimisers, callbacks and the run summary."""
