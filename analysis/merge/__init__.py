"""The merged Perfetto trace: every rank of a run in one Chrome trace, on one clock.

In: a run's traces and, where `analyze` has written it, its analysis/ directory. Out:
merged.json.gz (`merged`), built from per-rank thread layouts and flows (`tracks`) plus the analysis
tracks (`analysis_tracks`); `perfetto_check` says whether Perfetto would show a trace as written.
"""
