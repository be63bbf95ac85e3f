"""Attribution: where the step time went, per rank and for the step as a whole.

In: cells and gaps on one clock, the executed schedule, run.json's calibration. Out: the reference
duration of every (stage, kind) (`reference`, the one rule), per-rank parts that close on the step time
(`parts`), and the ladder of replays from the formula to the measurement: the waterfall and the ideal
timeline (`replay`, `waterfall`).
"""
