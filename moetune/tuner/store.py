"""The results store: one SQLite row per measurement, committed the moment it is made.

Append-only, so a killed sweep loses nothing it measured and a rerun resumes by
skipping what is already there. WAL mode plus a busy timeout lets two sweeps (or
a sweep and an export) use one file at once. A file that is not a moetune store
is refused with a ValueError and never written to.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import json
import math
import os
import shutil
import socket
import sqlite3
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from moetune.problem import canonical_json

DEFAULT_PATH = Path("results/moetune.sqlite")
SCHEMA_NAME = "moetune-results"
SCHEMA_VERSION = "1"
STATUSES = ("ok", "inaccurate", "compile_error", "crash", "timeout", "invalid")

# (column, SQL type) in table order; `id` is the primary key and assigned by SQLite.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("sweep_id", "TEXT"), ("kernel", "TEXT"), ("device_name", "TEXT"), ("arch", "TEXT"),
    ("moetune_version", "TEXT"), ("triton_version", "TEXT"), ("torch_version", "TEXT"),
    ("cuda_version", "TEXT"), ("shape", "TEXT"), ("tokens", "INTEGER"), ("routes", "INTEGER"),
    ("active_fraction", "REAL"), ("routing", "TEXT"), ("density", "REAL"), ("config", "TEXT"),
    ("status", "TEXT"), ("reason", "TEXT"), ("error", "REAL"), ("time_ms", "REAL"), ("min_ms", "REAL"),
    ("spread", "REAL"), ("n_runs", "INTEGER"), ("bytes", "INTEGER"), ("flops", "INTEGER"),
    ("roofline_frac", "REAL"), ("strategy", "TEXT"), ("timestamp", "TEXT"), ("launch", "TEXT"),
)
# Columns added after stores were committed: absent in an older store, they read as empty (and a
# writable store gains them when opened).
ADDED_COLUMNS = ("launch",)
COLUMN_NAMES = ("id",) + tuple(c for c, _ in COLUMNS)
_JSON_COLUMNS = ("shape", "config")
# The columns that say which candidate at which point a row measured (resume key).
POINT_COLUMNS = ("kernel", "device_name", "shape", "tokens", "routes", "active_fraction", "routing")

_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE IF NOT EXISTS measurements (id INTEGER PRIMARY KEY, "
    + ", ".join(f"{c} {t}" for c, t in COLUMNS) + ")",
    # Point queries read its prefix; a claim's "is this candidate stored?" needs the config too (with the
    # point alone, a 14304-candidate sweep scanned its whole point per claim: 3 ms each, and growing).
    "DROP INDEX IF EXISTS measurements_point",
    "CREATE INDEX IF NOT EXISTS measurements_candidate ON measurements "
    "(kernel, device_name, shape, tokens, routes, routing, config)",
    # Candidates a live sweep is measuring right now, so a second sweep on the same file skips them.
    "CREATE TABLE IF NOT EXISTS claims (point TEXT, config TEXT, host TEXT, pid INTEGER, expires REAL, "
    "PRIMARY KEY (point, config))",
)
BUSY_TIMEOUT_S = 60.0


class StoreWriteError(OSError):
    """A write to the store failed (a full disk, a file-size limit, an I/O error); every row
    committed before it is intact."""


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _as_text(value: Any) -> Any:
    """Dict-valued shape/config -> canonical JSON, so equal configs have equal keys."""
    if isinstance(value, Mapping):
        return canonical_json(dict(value))
    if isinstance(value, str):
        return canonical_json(json.loads(value))  # re-canonicalise hand-written JSON
    return value


def _open_readonly(path: Path) -> sqlite3.Connection:
    """A connection that never writes. A WAL store on read-only media cannot get the -shm file even a
    read-only open needs, so that case reads the file as it is (immutable)."""
    uri = path.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute("SELECT name FROM sqlite_master LIMIT 1")
    except sqlite3.OperationalError:
        conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)
    return conn


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """A moetune results database at ``path`` (created with its schema when missing).

    ``create=False`` refuses a missing file (for readers such as ``moetune export``);
    ``readonly=True`` also never writes (no schema upgrade, no WAL switch), so listing a
    store on read-only media or someone else's file changes nothing.
    """

    def __init__(self, path: str | Path = DEFAULT_PATH, *, create: bool = True, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        if self.path.exists():
            if not self.path.is_file():
                raise ValueError(f"results database {self.path} is not a file")
            has_tables = self._check_existing()
            if readonly and not has_tables:
                raise ValueError(f"results database {self.path} is empty")
        elif not create or readonly:
            raise FileNotFoundError(f"no results database at {self.path}")
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"cannot create results database {self.path}: {e.strerror}") from e
        if readonly:
            self._conn = _open_readonly(self.path)
        else:
            self._conn = self._connect()
            self._init_schema()

    # ---- opening ---------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            # In WAL mode, NORMAL syncs at checkpoints, not at every commit: a committed row survives the
            # sweep being killed (the OS holds it), only a power loss can take the last few. One write per
            # measurement then costs no fsync.
            conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as e:  # e.g. a new file in a read-only directory, or read-only media
            raise ValueError(f"cannot open results database {self.path} for writing: {e} (is "
                             f"{self.path.parent} writable?)") from e
        return conn

    def _check_existing(self) -> bool:
        """ValueError (naming the path) unless the file is empty or a moetune store; read-only.
        Returns whether it has tables (False: a new, empty file)."""
        if self.path.stat().st_size == 0:
            return False
        try:
            with open(self.path, "rb") as f:
                header = f.read(16)
        except OSError as e:
            raise ValueError(f"cannot read results database {self.path}: {e}") from e
        if header != b"SQLite format 3\x00":
            raise ValueError(f"{self.path} is not a moetune results database (not SQLite)")
        try:
            conn = _open_readonly(self.path)
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                meta = dict(conn.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
                columns = {r[1] for r in conn.execute("PRAGMA table_info(measurements)")}
            finally:
                conn.close()
        except sqlite3.Error as e:
            raise ValueError(f"cannot read results database {self.path}: {e}") from e
        if not tables:
            return False  # an empty SQLite file (e.g. another sweep is creating it right now)
        if meta.get("schema") != SCHEMA_NAME:
            raise ValueError(f"{self.path} is not a moetune results database (no moetune meta table)")
        if meta.get("version") != SCHEMA_VERSION:
            raise ValueError(f"{self.path} has moetune results schema version {meta.get('version')!r}; "
                             f"this moetune reads version {SCHEMA_VERSION}")
        missing = [c for c in COLUMN_NAMES if c not in columns and c not in ADDED_COLUMNS] \
            if "measurements" in tables else []
        if missing:
            raise ValueError(f"{self.path} is a damaged moetune results database: its measurements table "
                             f"has no column {', '.join(missing)}")
        return True

    def _init_schema(self) -> None:
        try:
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _DDL:
                    self._conn.execute(stmt)
                have = {r[1] for r in self._conn.execute("PRAGMA table_info(measurements)")}
                for name, kind in COLUMNS:
                    if name not in have:
                        self._conn.execute(f"ALTER TABLE measurements ADD COLUMN {name} {kind}")
                self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?), ('version', ?)",
                                   (SCHEMA_NAME, SCHEMA_VERSION))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            self._conn.close()
            hint = " (read-only media? moetune results and export read it as it is)" \
                if "readonly" in str(e) else ""
            raise ValueError(f"cannot open results database {self.path} for writing: {e}{hint}") from e

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writing -----------------------------------------------------------------------------------
    def add(self, row: Mapping[str, Any]) -> int:
        """Insert one measurement and commit it; returns its id.

        ``shape``/``config`` may be dicts (stored as canonical JSON); ``timestamp``
        defaults to now. Unknown columns or statuses are a ValueError.
        """
        if self.readonly:
            raise ValueError(f"results database {self.path} was opened read-only")
        unknown = set(row) - set(COLUMN_NAMES[1:])
        if unknown:
            raise ValueError(f"unknown measurement column(s) {sorted(unknown)}")
        if row.get("status") not in STATUSES:
            raise ValueError(f"measurement status must be one of {STATUSES}, got {row.get('status')!r}")
        values = {k: _as_text(v) if k in _JSON_COLUMNS else v for k, v in row.items()}
        for k, v in values.items():  # NaN is not a number SQLite keeps; inf is
            if isinstance(v, float) and math.isnan(v):
                values[k] = None
        values.setdefault("timestamp", now_iso())
        cols = list(values)
        sql = f"INSERT INTO measurements ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        with self._writing():
            cur = self._conn.execute(sql, [values[c] for c in cols])  # autocommit: durable on return
        return int(cur.lastrowid)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write's failure (disk full, file too large, I/O error) as one :class:`StoreWriteError`
        naming the store."""
        try:
            yield
        except (sqlite3.OperationalError, OSError) as e:
            raise StoreWriteError(f"cannot write to results database {self.path}: {e}") from e

    # ---- reading -----------------------------------------------------------------------------------
    def _where(self, filters: Mapping[str, Any]) -> tuple[str, list[Any]]:
        clauses, params = [], []
        for key, value in filters.items():
            if key not in COLUMN_NAMES:
                raise ValueError(f"unknown measurement column {key!r}; known: {', '.join(COLUMN_NAMES)}")
            if value is None:
                clauses.append(f"{key} IS NULL")
                continue
            if key in _JSON_COLUMNS:
                value = _as_text(value)
            if isinstance(value, float):  # REAL columns: compare with a tolerance, not bit for bit
                clauses.append(f"ABS({key} - ?) < 1e-9")
            else:
                clauses.append(f"{key} = ?")
            params.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def frame(self, **equal_filters: Any):
        """All rows (oldest first) whose columns equal the given values, as a pandas DataFrame."""
        import pandas as pd

        where, params = self._where(equal_filters)
        cur = self._conn.execute(f"SELECT * FROM measurements{where} ORDER BY id", params)
        names = [d[0] for d in cur.description]
        return with_added_columns(pd.DataFrame(cur.fetchall(), columns=names))

    def count(self, **equal_filters: Any) -> int:
        where, params = self._where(equal_filters)
        return int(self._conn.execute(f"SELECT COUNT(*) FROM measurements{where}", params).fetchone()[0])

    # ---- claims: two sweeps on one file do not measure the same candidate twice -------------------------
    @staticmethod
    def _point(key: Mapping[str, Any]) -> str:
        return canonical_json({k: _as_text(v) if k in _JSON_COLUMNS else v for k, v in key.items()})

    def claim(self, point: Mapping[str, Any], config: Any, ttl: float, retry: Collection[str] = (),
              budget: int | None = None) -> bool:
        """Reserve ``config`` at ``point`` (the :data:`POINT_COLUMNS` values) for ``ttl`` seconds.

        False when it is already stored (rows whose status is in ``retry`` aside), or claimed by
        another live sweep. A claim of a process that died (same host) or that expired is taken over.
        ``budget``: also False when the configs stored at the point and those claimed there by live
        sweeps already number ``budget``; counted in the claim's transaction, so cooperating sweeps
        never measure more at a point between them.
        """
        if self.readonly:
            raise ValueError(f"results database {self.path} was opened read-only")
        pkey, ckey, host, now = self._point(point), _as_text(config), socket.gethostname(), time.time()
        with self._writing():
            return self._claim(point, pkey, ckey, host, now, ttl, retry, budget)

    def _claim(self, point: Mapping[str, Any], pkey: str, ckey: str, host: str, now: float, ttl: float,
               retry: Collection[str], budget: int | None) -> bool:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            where, params = self._where({**point, "config": ckey})
            if retry:
                where += f" AND status NOT IN ({', '.join('?' * len(retry))})"
                params += sorted(retry)
            if self._conn.execute(f"SELECT 1 FROM measurements{where} LIMIT 1", params).fetchone():
                return False
            held = self._conn.execute("SELECT host, pid, expires FROM claims WHERE point = ? AND config = ?",
                                      (pkey, ckey)).fetchone()
            if held and (held[0], held[1]) != (host, os.getpid()) and held[2] > now \
                    and (held[0] != host or _alive(held[1])):
                return False
            if budget is not None and self._spent(point, pkey, ckey, retry, host, now) >= budget:
                return False
            self._conn.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)",
                               (pkey, ckey, host, os.getpid(), now + ttl))
            return True
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        finally:
            if self._conn.in_transaction:
                self._conn.execute("COMMIT")

    def _spent(self, point: Mapping[str, Any], pkey: str, ckey: str, retry: Collection[str], host: str,
               now: float) -> int:
        """Distinct configs stored at the point (only rows in ``retry`` aside) plus live claims there of
        configs not stored, ``ckey``'s own claim aside."""
        where, params = self._where(dict(point))
        if retry:
            where += f" AND status NOT IN ({', '.join('?' * len(retry))})"
            params += sorted(retry)
        rows = self._conn.execute(f"SELECT DISTINCT config FROM measurements{where}", params)
        stored = {r[0] for r in rows}
        claimed = {c for c, h, pid, expires in self._conn.execute(
            "SELECT config, host, pid, expires FROM claims WHERE point = ? AND config != ?", (pkey, ckey))
            if expires > now and (h != host or _alive(pid))}
        return len(stored | claimed)

    def release(self, point: Mapping[str, Any], config: Any) -> None:
        with self._writing():
            self._conn.execute("DELETE FROM claims WHERE point = ? AND config = ?",
                               (self._point(point), _as_text(config)))

    def measured_configs(self, kernel: str, device_name: str, shape: Any, tokens: int, routes: int,
                         active_fraction: float, routing: str) -> set[str]:
        """Canonical JSON of every config already recorded (any status) at this point."""
        where, params = self._where({
            "kernel": kernel, "device_name": device_name, "shape": shape, "tokens": int(tokens),
            "routes": int(routes), "active_fraction": float(active_fraction), "routing": routing,
        })
        return {r[0] for r in self._conn.execute(f"SELECT config FROM measurements{where}", params)}

    def best_per_point(self, kernel: str, device_name: str, shape: Any) -> list[dict[str, Any]]:
        """The fastest ok row's (tokens, routes, active_fraction, routing, density, config, time_ms) at
        each point this store holds for one op, shape and device: warm starts for the other densities."""
        where, params = self._where({"kernel": kernel, "device_name": device_name, "shape": shape,
                                     "status": "ok"})
        cols = ("tokens", "routes", "active_fraction", "routing", "density", "config", "time_ms")
        # SQLite fills the bare columns of a MIN() aggregate from the row that holds the minimum
        rows = self._conn.execute(
            "SELECT tokens, routes, active_fraction, routing, density, config, MIN(time_ms) FROM "
            f"measurements{where} AND time_ms IS NOT NULL GROUP BY tokens, routes, active_fraction, routing",
            params)
        return [dict(zip(cols, r, strict=True)) for r in rows]


_STORE_SUFFIXES = (".sqlite", ".db", ".sqlite3")


def with_added_columns(frame):
    """``frame`` with every :data:`ADDED_COLUMNS` column an older store or export lacks, empty."""
    for name in ADDED_COLUMNS:
        if name not in frame.columns:
            frame[name] = None
    return frame


def read_frame(path: str | Path, option: str = "--data"):
    """Rows of a results store (.sqlite/.db, or gzipped: .sqlite.gz, as stores are committed) or of an
    export of one (``moetune results --csv/--parquet``: .csv, .csv.gz, .parquet), as a pandas DataFrame;
    errors name the command-line ``option``."""
    import pandas as pd

    path = Path(path)
    name = path.name.lower()
    if name.endswith(_STORE_SUFFIXES):  # the store says itself what is wrong with it
        with Store(path, readonly=True) as store:
            return store.frame()
    if not path.exists():
        raise FileNotFoundError(f"{option}: no such file {path}")
    if name.endswith(tuple(s + ".gz" for s in _STORE_SUFFIXES)):
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / path.name[:-3]
            try:
                with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            except (OSError, EOFError) as e:
                raise ValueError(f"{option}: cannot read {path} as a gzipped store: {e}") from e
            try:
                with Store(plain, readonly=True) as store:
                    return store.frame()
            except ValueError as e:  # name the user's file, not the decompressed copy
                raise ValueError(str(e).replace(str(plain), str(path))) from e
    if name.endswith((".csv", ".csv.gz")):  # text stays text ("13.0" is a CUDA version, not a float)
        return with_added_columns(pd.read_csv(path, dtype={c: str for c, kind in COLUMNS if kind == "TEXT"}))
    if name.endswith(".parquet"):
        return with_added_columns(pd.read_parquet(path))
    raise ValueError(f"{option}: unknown format {path.name!r} "
                     "(use .sqlite, .sqlite.gz, .csv, .csv.gz or .parquet)")
