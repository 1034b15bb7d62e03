"""A real PostgreSQL server for the tests: Debian's server binaries (`./dev test` installs
them when root with apt-get), a cluster made by `initdb` in a private temporary directory,
started on a free loopback port (another one when a process takes it first: labs.py) as an
unprivileged user (`nobody` when the tests run as
root: the server refuses root), stopped and deleted after.

    with PostgresLab() as lab:
        url = lab.create_database()  # postgresql://oomguard:...@127.0.0.1:PORT/t1
        lab.stop(); lab.start()      # an outage, the same data after
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

from labs import Lab, PortTaken, on_free_ports, stop_process

#: Where Debian puts the server (postgresql-NN); the newest major first.
BIN_GLOB = "/usr/lib/postgresql/*/bin"
USER = "oomguard"
PASSWORD = "lab-secret"


def bindir() -> str | None:
    """The directory of `postgres` and `initdb`, or None when the server is not installed."""
    for d in sorted(glob.glob(BIN_GLOB), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.access(os.path.join(d, "postgres"), os.X_OK):
            return d
    found = shutil.which("postgres")
    return os.path.dirname(found) if found else None


class PostgresLab(Lab):
    """One PostgreSQL server on 127.0.0.1 (see the module docstring)."""

    def __init__(self, durable: bool = False) -> None:
        """`durable`: fsync and synchronous commits as a production server has them (the
        benchmark); the tests run without, faster."""
        self.durable = durable
        self.bin = bindir()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL server binaries (Debian's postgresql package)")
        self.root = tempfile.mkdtemp(prefix="oomguard-pg-")
        self.data = os.path.join(self.root, "data")
        self.port: int | None = None  # chosen at the first start, kept across restarts
        self.proc: subprocess.Popen | None = None
        self.uid = self.gid = None
        if os.geteuid() == 0:  # postgres refuses to run as root
            nobody = pwd.getpwnam("nobody")
            self.uid, self.gid = nobody.pw_uid, nobody.pw_gid
            os.chown(self.root, self.uid, self.gid)
        self._databases = 0
        pwfile = os.path.join(self.root, "pw")
        with open(pwfile, "w") as f:
            f.write(PASSWORD)
        if self.uid is not None:
            os.chown(pwfile, self.uid, self.gid)
        self._run(
            [f"{self.bin}/initdb", "-D", self.data, "-U", USER, "--pwfile", pwfile,
             "-A", "scram-sha-256", "-E", "UTF8", "--no-sync", "--no-instructions"]
        )  # fmt: skip
        os.unlink(pwfile)

    def _demote(self) -> None:
        if self.uid is not None:
            os.setgid(self.gid)
            os.setuid(self.uid)

    def _run(self, argv: list[str]) -> None:
        subprocess.run(
            argv, check=True, capture_output=True, preexec_fn=self._demote, cwd=self.root
        )

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (again, on the same port) and wait until it takes connections."""
        if self.port is None:
            on_free_ports(lambda port: self._start(port, timeout))
        else:
            self._start(self.port, timeout)

    def _start(self, port: int, timeout: float) -> None:
        import psycopg

        self.port = port
        log = os.path.join(self.root, "log")
        offset = os.path.getsize(log) if os.path.exists(log) else 0
        self.proc = subprocess.Popen(
            [f"{self.bin}/postgres", "-D", self.data, "-h", "127.0.0.1", "-p", str(port),
             "-k", self.root, "-c", "max_connections=60", "-c", "shared_buffers=64MB",
             *([] if self.durable else ["-c", "fsync=off", "-c", "synchronous_commit=off",
                                        "-c", "full_page_writes=off"])],
            stdout=subprocess.DEVNULL, stderr=open(log, "ab"),
            preexec_fn=self._demote, cwd=self.root,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as conn:
                    # The server's own answer: this connection reached our server, not
                    # another one that holds the port.
                    (data,) = conn.execute("SHOW data_directory").fetchone()
                assert os.path.realpath(data) == os.path.realpath(self.data), data
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None and "already in use" in self.log()[offset:]:
                    self.proc = None
                    raise PortTaken(f"PostgreSQL: 127.0.0.1:{port} was taken") from None
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {self.log()[-2000:]}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """A fast shutdown (SIGINT): clients are disconnected, the data stays."""
        stop_process(self.proc, signal.SIGINT)
        self.proc = None

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        self._databases += 1
        name = f"t{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def log(self) -> str:
        try:
            with open(os.path.join(self.root, "log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def store_on(request, tmp_path) -> object:
    """For a fixture parametrised over ``BACKENDS``: a FailureStore in tmp_path, or ("postgresql")
    the same store's API over a PostgreSQL history (`ShippedStore`); not started."""
    from oomguard._store import FailureStore

    s = FailureStore(str(tmp_path / "store.sqlite3"), batch_interval=0.01)
    if request.param == "postgresql":
        return ShippedStore(s, request.getfixturevalue("pg_url"))
    return s


#: The backends a store's tests run on.
BACKENDS = ["sqlite", "postgresql"]


class ShippedStore:
    """The FailureStore API over the PostgreSQL path: writes go to a spool (a real
    FailureStore) and its Shipper, reads come from the history (PgReader); `flush` waits
    until the history has them. What is not a read goes to the spool."""

    def __init__(self, spool, url: str, cluster: str = "lab", **shipper_options) -> None:
        from oomguard._store.pg import PgReader, Shipper

        self.spool = spool
        self.shipper = Shipper(spool, url, cluster, **shipper_options)
        self.reader = PgReader(url)

    def start(self) -> None:
        self.spool.start()
        self.shipper.start()
        self.reader.start()

    def flush(self, timeout: float = 30.0) -> bool:
        return bool(self.shipper.sync(timeout))

    def close(self) -> None:
        self.shipper.close()
        self.reader.close()
        self.spool.close()

    @property
    def member_cap(self) -> int:
        return self.reader.member_cap

    @member_cap.setter
    def member_cap(self, value: int) -> None:
        self.reader.member_cap = value

    def __getattr__(self, name: str):
        if name in ("events", "deaths", "shard", "signatures", "signature", "distinct_counts",
                    "totals", "pipeline", "pipeline_runs", "pipelines", "known",
                    "resolve", "incidents"):  # fmt: skip
            return getattr(self.reader, name)
        return getattr(self.spool, name)

    @property
    def regressions(self) -> int:
        """Regressions the history found for this shipper (its events, deaths, aliases)."""
        s = self.shipper
        return s.regressions + s.deaths.regressions + s.aliases.regressions
