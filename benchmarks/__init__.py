"""The benchmarks behind docs/lab-notebook, one script each, sharing `benchmarks.harness`.

Run one from the repository root as a module, e.g. `python -m benchmarks.translate_speed
--help`; each script's docstring says what it measures and how. Importing this package
sets nothing: a script run that way is one of the project's commands, so `keras_transformer`
gives it the quiet console (`keras_transformer.console.quiet_requested`), and its worker
processes inherit it.
"""
