"""How far the model's load has come: the share done of the step that reports a count ("weights 3/10") and,
at its rate so far, the seconds left. Where there is no basis for a number there is none.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_COUNT = re.compile(r"(?:^|(?<=\s))(\d+)/(\d+)(?=$|[\s:,;)])")  # "program 6/32", not a path's "v1/2"


class _Step(NamedTuple):
    name: str  # the words before the count: one step's reports share them
    total: int
    first_s: float
    first_done: int
    last_s: float
    done: int


class LoadEstimate:
    """`report` runs on the loading thread and `at` on the event loop: the step is one tuple, replaced whole, so a
    reader never sees half an update."""

    def __init__(self) -> None:
        self._step: _Step | None = None

    def report(self, message: str, now: float) -> None:
        count = _COUNT.search(message)
        if count is None:
            self._step = None
            return
        done, total = int(count.group(1)), int(count.group(2))
        if total <= 0 or done > total:
            self._step = None
            return
        name, step = message[:count.start()], self._step
        if step is None or step.name != name or step.total != total or done < step.done:
            self._step = _Step(name, total, now, done, now, done)
        else:
            self._step = step._replace(last_s=now, done=done)

    def at(self, now: float) -> dict[str, float]:
        step = self._step
        if step is None:
            return {}
        out = {"fraction": round(step.done / step.total, 3)}
        took, made = step.last_s - step.first_s, step.done - step.first_done
        if made > 0 and took > 0 and step.done < step.total:
            left = step.last_s + (step.total - step.done) * took / made - now
            if left > 0:
                out["left_s"] = round(left, 1)
        return out
