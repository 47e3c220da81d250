"""The training run (TensorFlow-only code, like `data/`): `run.train_and_evaluate` drives it;
the learning-rate schedule and optimizer (`schedule`), the label-smoothed loss and masked
metrics (`losses`), the `fit` callbacks (`callbacks`), checkpoints and their averaging
(`checkpoints`), SIGTERM / Ctrl-C handling (`stop_signals`), multi-worker set-up
(`distribute`) and BLEU (`evaluation`).

The public names (`TransformerSchedule`, `make_optimizer`, `LabelSmoothedCrossEntropy`,
`MaskedAccuracy`) import from the package root, `keras_transformer`.
"""
