"""The timeline: ranks on one clock, each rank's device busy time per step, and its idle gaps by class.

In: every rank's cells (analysis.cells). Out: clock offsets (`clock`), elementary segments of each step
window (`gaps`) and the gaps table with each idle stretch's class: bubble, p2p_wait, launch_overhead,
other (`classify`).
"""
