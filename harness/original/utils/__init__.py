"""The original benchmark's `utils` package, as far as solution files use it (see harness/original)."""
