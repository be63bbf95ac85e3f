"""Stage factories for `--model` (runners/stage_factory.py), beyond the built-in Linear+GELU stack."""
