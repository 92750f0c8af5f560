"""Auto-tuning: search the knobs of the default schedules, keep the best in a database.

- :mod:`kiln.tune.database`: the SQLite tuning database ``kiln.build(mod, tuning_db=...)``
  reads;
- :mod:`kiln.tune.tasks`: the distinct kernels of a model and their search spaces;
- :mod:`kiln.tune.measure`: building candidates and measuring them in isolated processes;
- :mod:`kiln.tune.features`, :mod:`kiln.tune.cost_model`, :mod:`kiln.tune.search`: the
  learned cost model and the evolutionary search it guides;
- :mod:`kiln.tune.tuner`: the tuning loop over a model's tasks (``kiln tune``).

This package's namespace holds the database only: ``kiln.build`` imports it, and the tuner
builds models itself.
"""

from .database import (  # noqa: F401
    Record,
    TuningDatabase,
    TuningDatabaseError,
    Workload,
    kernel_key,
    open_database,
    target_key,
)
