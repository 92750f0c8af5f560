"""The tuning database: measured schedules of kernels, in one SQLite file.

A record is one measured point of a kernel's search space: the kernel's key (a structural hash
of its unscheduled PrimFunc, :func:`kernel_key`, so the same kernel in another model finds it),
the target (:func:`target_key`), the knob values (:mod:`kiln.schedule.knobs`), the trace they
gave (its Python text, for people), the measured times, their ratio to the default schedule's
timed alternately with them, whether the candidate was good (built, ran, matched the default
schedule's output) and the machine that measured it. The best record is the one of lowest
ratio (comparable across sessions and machines under different load), then of lowest time.
``kiln.build(mod, tuning_db=path)`` gives every kernel the knobs of its best good record
(:meth:`TuningDatabase.knobs_for`).

Graph knobs (:func:`kiln.schedule.knobs.graph_knob`: a convolution's layout blocks) are
records too, keyed by :func:`graph_key` of the op call's key instead of a kernel's hash; their
times are whole-model times, their ratio to the model with that call's default decision
(:mod:`kiln.tune.graph_tuning`); ``kiln.build`` answers them with
:meth:`TuningDatabase.graph_knobs_for`.

The file is SQLite in WAL mode: any number of processes (tuning workers, builds) read and
write it at once; every write is one ``BEGIN IMMEDIATE`` transaction. A file that is not a
kiln tuning database, or one of another schema version, raises :class:`TuningDatabaseError`
and is never written to.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ir.errors import KilnError
from ..ir.node import stable_structural_hash
from ..target import Target
from ..tir.function import PrimFunc

__all__ = ["SCHEMA", "SCHEMA_VERSION", "Record", "TuningDatabase", "TuningDatabaseError",
           "Workload", "graph_key", "kernel_key", "machine_info", "open_database",
           "target_key"]

#: What the ``meta`` table's ``schema`` entry says in a kiln tuning database.
SCHEMA = "kiln-tuning"
#: The layout of the tables below; a file of another version is refused, never migrated
#: silently.
SCHEMA_VERSION = 1

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (
    kernel TEXT NOT NULL, target TEXT NOT NULL, name TEXT NOT NULL, op_name TEXT,
    default_s REAL, PRIMARY KEY (kernel, target));
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kernel TEXT NOT NULL, target TEXT NOT NULL,
    knobs TEXT NOT NULL, trace TEXT NOT NULL, times TEXT NOT NULL, mean_s REAL,
    ratio REAL, ok INTEGER NOT NULL, error TEXT, machine TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS records_best ON records (kernel, target, ok, ratio, mean_s);
"""

#: How records rank, best first: bad ones last, then by ratio to the default (when measured
#: so), then by time.
_BEST_ORDER = "mean_s IS NULL, ratio IS NULL, ratio, mean_s"

#: Attributes of a PrimFunc that name it in one model and not what it computes.
_NAMING_ATTRS = ("global_symbol",)


class TuningDatabaseError(KilnError):
    """A tuning database that cannot be used: not one, another schema version, unreadable."""


def kernel_key(func: PrimFunc) -> str:
    """The key of an unscheduled kernel: equal for structurally equal PrimFuncs whatever they
    are called in their model, the same in every process."""
    attrs = {k: v for k, v in func.attrs.items() if k not in _NAMING_ATTRS}
    return stable_structural_hash(func.replace(attrs=attrs))


#: How a graph knob's key starts in the records' ``kernel`` column (a kernel key is a hex hash).
GRAPH_KEY_PREFIX = "graph:"


def graph_key(key: str) -> str:
    """The record key of the graph knobs of an op call whose :func:`~kiln.schedule.knobs.
    graph_knob` key is ``key``."""
    return GRAPH_KEY_PREFIX + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def target_key(target: Target | str) -> str:
    """The target part of a record's key: its spec and the instruction sets its schedules use
    (``native`` differs between machines)."""
    tgt = Target.create(target)
    feats = ",".join(sorted(tgt.features or ()))
    return f"{tgt.spec} features={hashlib.blake2b(feats.encode(), digest_size=6).hexdigest()}"


def machine_info() -> dict[str, Any]:
    """The measuring machine: host name, CPU model, CPU count, Python platform."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return {"host": platform.node(), "cpu": model, "cpus": os.cpu_count(),
            "platform": platform.platform()}


def _plain(value: Any) -> Any:
    """JSON lists back to the tuples knob domains use."""
    return tuple(_plain(v) for v in value) if isinstance(value, list) else value


@dataclass
class Record:
    """One measured candidate (see the module docstring). ``mean_s`` is None for a bad one."""

    kernel: str
    target: str
    knobs: dict[str, Any]
    trace: str = ""
    times: list[float] = field(default_factory=list)
    ok: bool = True
    error: str = ""
    machine: dict[str, Any] = field(default_factory=machine_info)
    created: float = field(default_factory=time.time)
    id: int | None = None
    #: time / the default schedule's time, measured in alternation (None: not measured so)
    ratio: float | None = None

    @property
    def mean_s(self) -> float | None:
        return sum(self.times) / len(self.times) if self.ok and self.times else None


@dataclass
class Workload:
    """A kernel the tuner has seen: its name in the model it came from and the default
    schedule's time."""

    kernel: str
    target: str
    name: str
    op_name: str | None
    default_s: float | None


class TuningDatabase:
    """A tuning database file (see the module docstring).

    ``create=False`` refuses a path where no file is (what ``kiln.build`` does: a misspelled
    path should not silently build untuned). One connection per process (SQLite connections do
    not survive a fork).
    """

    def __init__(self, path: str | os.PathLike, create: bool = True):
        self.path = Path(path)
        if not self.path.exists() and not create:
            raise TuningDatabaseError(f"no tuning database at {self.path} (make one with "
                                      "`kiln tune ... --db PATH`)")
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._best: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._check_or_create()

    # -- connection ------------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            try:
                conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
                conn.execute("PRAGMA busy_timeout = 60000")
            except sqlite3.Error as err:
                raise TuningDatabaseError(f"cannot open tuning database {self.path}: {err}"
                                          ) from err
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as err:
            raise self._unusable(err) from err
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _unusable(self, err: Exception) -> TuningDatabaseError:
        return TuningDatabaseError(f"{self.path} is not a usable kiln tuning database ({err}); "
                                   "it was left as it is")

    def _check_or_create(self) -> None:
        conn = self._connection()
        try:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as err:
            raise self._unusable(err) from err
        if tables:
            self._check_meta(conn, tables)
            return
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.DatabaseError as err:
            raise self._unusable(err) from err
        with self._write() as c:
            # another process may have made the tables since we looked
            now = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if now:
                self._check_meta(c, now)
                return
            for statement in _TABLES.split(";"):
                if statement.strip():
                    c.execute(statement)
            c.executemany("INSERT INTO meta VALUES (?, ?)",
                          [("schema", SCHEMA), ("version", str(SCHEMA_VERSION))])

    def _check_meta(self, conn: sqlite3.Connection, tables: set[str]) -> None:
        if "meta" not in tables:
            raise TuningDatabaseError(f"{self.path} is an SQLite file but not a kiln tuning "
                                      f"database (tables: {', '.join(sorted(tables))}); it was "
                                      "left as it is")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("schema") != SCHEMA:
            raise TuningDatabaseError(f"{self.path} is not a kiln tuning database (schema "
                                      f"{meta.get('schema')!r}); it was left as it is")
        if meta.get("version") != str(SCHEMA_VERSION):
            raise TuningDatabaseError(
                f"{self.path} is a kiln tuning database of schema version "
                f"{meta.get('version')}, this kiln reads version {SCHEMA_VERSION}; it was left "
                "as it is (tune into a new file)")

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    # -- writing ---------------------------------------------------------------------------
    def add_workload(self, w: Workload) -> None:
        """Remember a kernel (its default time is kept once measured)."""
        with self._write() as c:
            c.execute("INSERT INTO workloads VALUES (?, ?, ?, ?, ?) ON CONFLICT (kernel, target) "
                      "DO UPDATE SET default_s = COALESCE(excluded.default_s, default_s)",
                      (w.kernel, w.target, w.name, w.op_name, w.default_s))

    def add_records(self, records: Sequence[Record]) -> None:
        """Store measured candidates, all in one transaction."""
        rows = [(r.kernel, r.target, json.dumps(r.knobs, sort_keys=True), r.trace,
                 json.dumps(r.times), r.mean_s, r.ratio if r.ok else None, int(r.ok), r.error,
                 json.dumps(r.machine), r.created) for r in records]
        with self._write() as c:
            c.executemany("INSERT INTO records (kernel, target, knobs, trace, times, mean_s, "
                          "ratio, ok, error, machine, created) VALUES "
                          "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        for r in records:
            self._best.pop((r.kernel, r.target), None)

    def withdraw(self, kernel: str, target: str, knobs: dict[str, Any], why: str) -> int:
        """Mark the good records of ``knobs`` bad with error ``why`` (a measurement that a
        later one in another context contradicts: the NPU tuner's check of the tuned model),
        so :meth:`best` no longer returns them; returns how many were."""
        with self._write() as c:
            n = c.execute("UPDATE records SET ok = 0, ratio = NULL, mean_s = NULL, error = ? "
                          "WHERE kernel = ? AND target = ? AND knobs = ? AND ok = 1",
                          (why, kernel, target, json.dumps(knobs, sort_keys=True))).rowcount
        self._best.pop((kernel, target), None)
        return n

    # -- reading ---------------------------------------------------------------------------
    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        try:
            return self._connection().execute(sql, args).fetchall()
        except sqlite3.DatabaseError as err:
            raise self._unusable(err) from err

    def records(self, kernel: str | None = None, target: str | None = None,
                ok: bool | None = None) -> list[Record]:
        """Records, optionally of one kernel / target / goodness, fastest first."""
        where, args = [], []
        for col, val in (("kernel", kernel), ("target", target)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        if ok is not None:
            where.append("ok = ?")
            args.append(int(ok))
        sql = ("SELECT kernel, target, knobs, trace, times, ok, error, machine, created, id, "
               "ratio FROM records" + (" WHERE " + " AND ".join(where) if where else "")
               + f" ORDER BY {_BEST_ORDER}, id")
        return [Record(k, t, {n: _plain(v) for n, v in json.loads(kn).items()}, tr,
                       json.loads(ti), bool(o), e or "", json.loads(m), cr, i, ra)
                for k, t, kn, tr, ti, o, e, m, cr, i, ra in self._query(sql, args)]

    def best(self, kernel: str, target: str) -> Record | None:
        """The fastest good record of a kernel on a target."""
        found = self._query(
            "SELECT id FROM records WHERE kernel = ? AND target = ? AND ok = 1 "
            f"AND mean_s IS NOT NULL ORDER BY {_BEST_ORDER} LIMIT 1", (kernel, target))
        if not found:
            return None
        return next(r for r in self.records(kernel, target, ok=True) if r.id == found[0][0])

    def knobs_for(self, func: PrimFunc, target: Target | str) -> dict[str, Any] | None:
        """The knobs of ``func``'s best record on ``target`` (None: no good record), for
        ``kiln.build``."""
        key = (kernel_key(func), target_key(target))
        if key not in self._best:
            rec = self.best(*key)
            self._best[key] = None if rec is None else rec.knobs
        return self._best[key]

    def graph_knobs_for(self, key: str, target: Target | str) -> dict[str, Any] | None:
        """The graph knobs of the best record of the op call keyed ``key`` (see
        :func:`kiln.schedule.knobs.graph_knob`) on ``target``; None: no good record."""
        k = (graph_key(key), target_key(target))
        if k not in self._best:
            rec = self.best(*k)
            self._best[k] = None if rec is None else rec.knobs
        return self._best[k]

    def workloads(self, target: str | None = None) -> list[Workload]:
        sql = "SELECT kernel, target, name, op_name, default_s FROM workloads"
        rows = self._query(sql + " WHERE target = ?", (target,)) if target else self._query(sql)
        return [Workload(*r) for r in rows]

    def workload(self, kernel: str, target: str) -> Workload | None:
        rows = self._query("SELECT kernel, target, name, op_name, default_s FROM workloads "
                           "WHERE kernel = ? AND target = ?", (kernel, target))
        return Workload(*rows[0]) if rows else None

    def count(self, kernel: str, target: str) -> int:
        """Measured candidates of a kernel (good and bad)."""
        return self._query("SELECT COUNT(*) FROM records WHERE kernel = ? AND target = ?",
                           (kernel, target))[0][0]

    def __repr__(self) -> str:
        return f"TuningDatabase({str(self.path)!r})"


def open_database(db: str | os.PathLike | TuningDatabase) -> TuningDatabase:
    """``db`` itself, or the existing tuning database file at path ``db``."""
    if isinstance(db, TuningDatabase):
        return db
    if isinstance(db, (str, os.PathLike)):
        return TuningDatabase(db, create=False)
    raise TuningDatabaseError(f"tuning_db must be a path or a TuningDatabase, got "
                              f"{type(db).__name__}")
