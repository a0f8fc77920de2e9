"""Results as NumPy arrays: what ``Simulation.run`` returns and ``load_trajectory`` reads."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class Result:
    """Observed states as one NumPy array per log column, in order (step, then replica).

        res = sim.run(200, every=10)
        res["eps"][-1]          # eps of the final state (always observed)
        res.step, res.time      # attribute access works for every column
        res.to_pandas()         # a DataFrame with the columns of log.csv (needs pandas)

    ``final_tokens``: the tokens after the last step, float64, (n, d) or (R, n, d).
    """

    data: dict = field(default_factory=dict)
    final_tokens: np.ndarray | None = None

    @classmethod
    def from_rows(cls, rows: list[dict], final_tokens=None) -> "Result":
        names: list[str] = []
        for row in rows:
            names += [k for k in row if k not in names]
        data = {}
        for name in names:
            values = [row.get(name, math.nan) for row in rows]
            integral = name in ("step", "replica", "clusters") and all(isinstance(v, int) for v in values)
            data[name] = np.asarray(values, dtype=np.int64 if integral else np.float64)
        return cls(data, final_tokens)

    @property
    def columns(self) -> list[str]:
        return list(self.data)

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.data[name]
        except KeyError:
            raise KeyError(f"no column {name!r}; columns: {', '.join(self.data)}") from None

    def __getattr__(self, name: str) -> np.ndarray:
        data = self.__dict__.get("data", {})
        if name in data:
            return data[name]
        raise AttributeError(f"Result has no column or attribute {name!r}")

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0

    def __repr__(self) -> str:
        return f"Result({len(self)} observed states; columns {', '.join(self.data)})"

    def to_pandas(self):
        """The columns as a pandas DataFrame (pandas is optional: ImportError names it)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Result.to_pandas needs pandas (pip install pandas); the columns are "
                              "NumPy arrays in result[name] without it") from None
        return pd.DataFrame(self.data)


class Trajectory(NamedTuple):
    """A run's saved trajectory: ``steps`` (frames,), ``times`` (frames,), ``tokens`` (frames, n, d)
    or (frames, R, n, d) for an ensemble, and ``meta`` (the run's parameters). Unpacks as the
    4-tuple it used to be: ``steps, times, tokens, meta = load_trajectory(run_dir)``."""

    steps: np.ndarray
    times: np.ndarray
    tokens: np.ndarray
    meta: dict


__all__ = ["Result", "Trajectory"]
