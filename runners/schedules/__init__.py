"""Pipeline schedules as pure data (no torch): build, lower, validate, simulate, draw.

schedule = build("1f1b", p=4, m=8)        # compute actions per rank, in order
validate(lower(schedule))                 # with SEND/RECV; raises ScheduleError showing the grid
print(grid(schedule, simulate(schedule))) # unit-time picture, bubbles as blanks
"""

from .actions import COMM_KINDS, COMPUTE_KINDS, Action, ActionParseError, Kind
from .bubble import bubble_formula
from .dependencies import dependencies
from .generate import SCHEDULES, V_SHAPED, build, check_request
from .grid import grid
from .lower import lower
from .memory import held, in_flight
from .schedule import Schedule, ScheduleError, placement_of
from .simulate import simulate
from .timeline import Timeline
from .validate import validate

__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "SCHEDULES",
    "Action",
    "ActionParseError",
    "Kind",
    "Schedule",
    "ScheduleError",
    "Timeline",
    "V_SHAPED",
    "build",
    "check_request",
    "dependencies",
    "bubble_formula",
    "grid",
    "held",
    "in_flight",
    "lower",
    "placement_of",
    "simulate",
    "validate",
]
