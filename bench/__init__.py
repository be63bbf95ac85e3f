"""The benchmark harness (`make bench`, `python -m bench`): not part of the product.

`suite` runs every part and writes bench/results.json and bench/RESULTS.md; `throughput`, `traceset`,
`child` and `process` time the analysis against Holistic Trace Analysis on generated trace sets;
`runs` times real runs (executor, profiler, the typical step, the seed's sweep, the m=1 bubble); `load`
times the loader alone; `stats` and `report` summarise and render.
"""
