"""Op-level timelines: a folder holding `trace-<name>.parquet` and `meta-<name>.yaml` is a run.

The format is ByteDance's StragglerAnalysis (Megatron-LM jobs recorded op by op): one row per op with
dp_rank, stage, rank, step, optype, start_ts and duration (seconds), seq_id (the op's index among its
rank's ops of that optype in the step), mc (model chunk), mb_id (microbatch) and gmc; the yaml gives the
job's shape (dp_size, pp_size, tp_size, dsp_size, vpp_size, world_size). Tensor- and sequence-parallel
dimensions are accepted: a job records one rank per (stage, dp_rank), or all of them. Limits: no kernels
and no calibration, so nothing below the op (compute against small-GEMM or slowdown) can be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from analysis.errors import InputError
from analysis.traces.run_files import oplevel_files

# The columns the format defines, and the integer dtype each is read as.
COLUMNS = {
    "dp_rank": pl.Int32,
    "stage": pl.Int32,
    "rank": pl.Int32,
    "step": pl.Int64,
    "optype": pl.String,
    "start_ts": pl.Float64,
    "duration": pl.Float64,
    "seq_id": pl.Int32,
    "mc": pl.Int32,
    "mb_id": pl.Int32,
    "gmc": pl.Int32,
}
SIZES = ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size", "world_size")
# The optypes the analysis reads by name (analysis.whatif.graph models how they depend on each other).
COMPUTE = ("forward-compute", "backward-compute")
# p2p optype -> the compute of its direction
P2P = {
    "forward-send": "forward-compute",
    "forward-recv": "forward-compute",
    "backward-send": "backward-compute",
    "backward-recv": "backward-compute",
}
PARAMS_GATHER = "params-all-gather"
DP_COLLECTIVES = (PARAMS_GATHER, "grads-reduce-scatter", "separate-grads-all-reduce")
EMBEDDING = "embedding-grads-all-reduce"
CLIP = "optimizer-clip-main-grad"
# Communication by kind (the typical value of its time is the median, not the mean): the collectives and
# p2p ops, and the tensor-parallel all-reduce that is replayed as an op of its own.
COMMUNICATION = frozenset({*P2P, *DP_COLLECTIVES, EMBEDDING, CLIP, "layernorm-grads-all-reduce"})


@dataclass(frozen=True)
class OpTimeline:
    """One job's ops (COLUMNS, plus end_ts = start_ts + duration) and its shape from the yaml."""

    name: str
    ops: pl.DataFrame
    sizes: dict[str, int]

    def lanes(self) -> pl.DataFrame:
        """The ops of one recorded rank per (stage, dp_rank), the lowest: where a job records every
        tensor- or sequence-parallel rank, they run in lockstep and one stands for its group."""
        return self.ops.filter(pl.col("rank") == pl.col("rank").min().over("stage", "dp_rank"))


def _sizes(path: Path) -> dict[str, int]:
    try:
        meta = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise InputError(path, f"not a readable yaml file ({type(error).__name__})") from None
    if not isinstance(meta, dict):
        raise InputError(path, "not a mapping of the job's sizes")
    sizes = {key: meta.get(key, 1) for key in SIZES}
    bad = [key for key, value in sizes.items() if type(value) is not int or value < 1]
    if bad:
        raise InputError(path, f"{bad[0]} is {sizes[bad[0]]!r}, not a positive integer")
    parallel = sizes["dp_size"] * sizes["pp_size"] * sizes["tp_size"] * sizes["dsp_size"]
    if parallel != sizes["world_size"]:
        raise InputError(path, f"world_size {sizes['world_size']} is not dp x pp x tp x dsp = {parallel}")
    return sizes


def _ops(path: Path) -> pl.DataFrame:
    try:
        ops = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as error:
        raise InputError(path, f"not a readable parquet file ({type(error).__name__})") from None
    missing = sorted(set(COLUMNS) - set(ops.columns))
    if missing:
        raise InputError(path, f"lacks the column(s) {', '.join(missing)}")
    try:
        ops = ops.select(pl.col(name).cast(dtype) for name, dtype in COLUMNS.items())
    except pl.exceptions.PolarsError:
        raise InputError(path, "a column does not hold the format's type (numbers, optype text)") from None
    if ops.height == 0:
        raise InputError(path, "holds no ops")
    if ops.null_count().sum_horizontal().item() or not ops["duration"].is_finite().all():
        raise InputError(path, "has missing or non-finite values")
    if (ops["duration"] < 0).any():
        raise InputError(path, "has a negative duration")
    return ops.with_columns(end_ts=pl.col("start_ts") + pl.col("duration"))


def read_timeline(directory: Path) -> OpTimeline:
    """The op-level run in `directory`; InputError naming the file and the problem when it is malformed."""
    found = oplevel_files(directory) if Path(directory).is_dir() else None
    if found is None:
        raise InputError(directory, "holds no trace-<name>.parquet with its meta-<name>.yaml")
    parquet, meta = found
    sizes = _sizes(meta)
    ops = _ops(parquet)
    if ops["stage"].max() >= sizes["pp_size"] or ops["dp_rank"].max() >= sizes["dp_size"]:
        raise InputError(parquet, f"has stages or dp ranks beyond {meta.name}'s pp_size and dp_size")
    if ops["stage"].min() < 0 or ops["dp_rank"].min() < 0:
        raise InputError(parquet, "has a negative stage or dp_rank")
    return OpTimeline(parquet.name[len("trace-") : -len(".parquet")], ops, sizes)
