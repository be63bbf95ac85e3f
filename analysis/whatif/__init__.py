"""What-if analysis of op-level timelines in the StragglerAnalysis paper's terms (OSDI'25, "Understanding
Stragglers in Large Model Training Using What-if Analysis"): the op graph (graph), its replay (replay)
and the slowdowns S, S_stage, S_w, S_t, M_S and M_W (figures)."""
