"""The bundled trainer: a Llama-style decoder trained with FSDP2 on a published manifest through the
loader, with checkpoints that record exactly which data the weights saw. See docs/trainer.md."""
