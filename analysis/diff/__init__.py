"""Two analysed runs compared: what changed, and whether it is more than the runs' noise
(docs/numbers.md#diff; the command: analysis.cli.diff).

`figures` reads each run's figures per analysed step from its stored analysis, `significance` tests a
change against the two runs' spread, `compare` matches A's figures to B's and orders the changes,
`rules` is the CI gate (`--fail-on`), `output` the table, the markdown and diff.json; `stored` keeps a
diff in B's run directory for the report's page of the pair, `neighbours` picks the pairs the report
compares unasked (each sweep's consecutive m).
"""
