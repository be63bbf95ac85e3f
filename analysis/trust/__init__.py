"""Whether the pipeline model fits a trace, and how far its figures can be trusted."""
