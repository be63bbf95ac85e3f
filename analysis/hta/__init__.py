"""Holistic Trace Analysis beside ours: run (HTA on the traces), figures (RUN/hta.json), compare."""
