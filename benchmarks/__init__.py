"""The benchmarks behind BENCHMARKS.md, one script each, sharing `benchmarks.harness`.

Run one from the repository root as a module, e.g. `python -m benchmarks.translate_speed
--help`; each script's docstring says what it measures and how. Importing this package
sets nothing: a script asks for the quiet console (`harness.quiet_console`) only when it
runs as the main program.
"""
