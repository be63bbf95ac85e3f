"""Analyse pipeline-parallel Chrome traces: cells, idle-time classes, the deviation from the formula."""
