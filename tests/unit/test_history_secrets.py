"""A PostgreSQL history's password never prints (issue 39): not in a log line, an error or
CLI output, wherever it sits in the URL (the user part, `?password=`, a misspelt or
percent-encoded key), percent-encoded or malformed (libpq quotes the bad token back), and
whatever the driver says. The scheduler's own warning, metrics and queries:
tests/cluster/test_scheduler_secrets.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from oomguard._cli import main
from oomguard._exceptions import StoreError
from oomguard._store import FailureStore
from oomguard._store.pg import PgReader, Shipper
from oomguard._urls import error_line, redact, scrub

#: Each form a password can take in a URL; TOKEN marks it, `S3cr%zz` is a malformed
#: percent-encoding (libpq: invalid percent-encoded token: "S3cr%zzTOKEN").
FORMS = {
    "user part, malformed": "postgresql://oomguard:S3cr%zzTOKEN@127.0.0.1:{port}/{db}",
    "query, malformed": "postgresql://oomguard@127.0.0.1:{port}/{db}?password=S3cr%zzTOKEN",
    "encoded key": "postgresql://oomguard@127.0.0.1:{port}/{db}?sslmode=disable&pass%77ord=S3cr%zzTOKEN",
    "misspelt key": "postgresql://oomguard@127.0.0.1:{port}/{db}?passwrd=S3cretTOKEN",
    "encoded value": "postgresql://oomguard:S3c%72etTOKEN@127.0.0.1:{port}/{db}",
    "bad host": "postgresql://oomguard:S3cretTOKEN@[::1/{db}",
    "wrong": "postgresql://oomguard:S3cretTOKEN@127.0.0.1:{port}/{db}",  # refused by the server
    "sslpassword": "postgresql://oomguard@127.0.0.1:{port}/{db}?sslpassword=S3cretTOKEN",
}

#: The forms libpq cannot read at all (the others reach the server, which refuses them).
MALFORMED = ("user part, malformed", "query, malformed", "encoded key", "misspelt key", "bad host")


def clean(text: str) -> bool:
    return "TOKEN" not in text and "S3cr" not in text


@pytest.fixture
def urls(postgres, pg_url):
    db = pg_url.rsplit("/", 1)[1]
    return {k: v.format(port=postgres.port, db=db) for k, v in FORMS.items()}


def cli(*argv: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PGCONNECT_TIMEOUT": "5"}
    return subprocess.run(
        [sys.executable, "-m", "oomguard._cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def test_the_cli_never_prints_the_password(urls, tmp_path, capsys, caplog):
    pwfile = tmp_path / "pw"
    pwfile.write_text("new-role-pw\n")
    for form, url in urls.items():
        for argv in (
            ("report", "--store", url, "--json"),
            ("doctor", "--store", url),
            ("history", "grant", "--store", url, "--role", "x", "--cluster", "c",
             "--password-file", str(pwfile)),
        ):  # fmt: skip
            caplog.clear()
            with caplog.at_level(logging.DEBUG):
                try:
                    main(list(argv))
                except SystemExit:
                    pass
            out, err = capsys.readouterr()
            said = out + err + "\n".join(r.getMessage() for r in caplog.records)
            assert clean(said), (form, argv[0], said)
            assert "***" in said, (form, argv[0], said)  # where the password was: said so
    # And as a user runs it, in a process of its own: the case the issue measured.
    proc = cli("report", "--store", urls["query, malformed"], cwd=tmp_path)
    assert proc.returncode == 1 and clean(proc.stdout + proc.stderr), proc.stderr
    assert 'invalid percent-encoded token: "***"' in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_shipper_and_the_reader_never_log_or_raise_the_password(urls, tmp_path, caplog):
    for form, url in urls.items():
        spool = FailureStore(str(tmp_path / f"{len(caplog.records)}.sqlite3"))
        spool.start()
        shipper = Shipper(spool, url, "a")
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            shipper.start()
            try:
                assert not shipper.sync(timeout=1)
            finally:
                shipper.close()
                spool.close()
            reader = PgReader(url, timeout=1)
            try:
                reader.start()
                reader.events(limit=1)
            except Exception as e:
                error = e
            finally:
                reader.close()
        away = [r for r in caplog.records if "is away" in r.getMessage()]
        assert len(away) == 1, form
        assert "***" in away[0].getMessage() or form == "misspelt key", away[0].getMessage()
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert clean(logged), (form, logged)
        assert clean(shipper.last_error) and clean(repr(shipper)), form
        chain = []  # the error, and what it holds as its cause or context
        while error is not None and error not in chain:
            chain.append(error)
            error = error.__cause__ or error.__context__
        assert all(clean(str(e)) for e in chain), (form, chain)
        if form in MALFORMED:  # libpq cannot read it: refused before the pool tries
            assert isinstance(chain[0], StoreError), (form, chain)


def test_scrub_hides_every_form_and_keeps_the_rest():
    url = "postgresql://u:pw%41B@db:5432/h?sslmode=require&password=S3cr%zz&options=-cx%3D1"
    assert (
        redact(url) == "postgresql://u:***@db:5432/h?sslmode=require&password=***&options=-cx%3D1"
    )
    said = scrub('bad: "pw%41B" "pwAB" "S3cr%zz" "%zz" "require" user "u" at "db" ' + url, url)
    assert "pw" not in said.replace("password", "") and "S3cr" not in said and "%zz" not in said
    assert '"require"' in said and '"u"' in said and '"db"' in said
    assert error_line(ValueError("x\n  y: S3cr%zz"), url) == "x y: ***"
