"""Pipeline names for dask.dataframe with query planning (dask-expr), as docs/getting-started.md
"Name your pipelines" says: dask-expr warns that it ignores annotations ("Dask annotations
{'span': ...} detected. Annotations will be ignored when using query-planning"), yet a span
or an `oomguard_pipeline` annotation active when the dataframe is *computed* names its
pipeline: the client applies the annotations active at submission to every task of the
graph. Only one active while the dataframe was built, and no longer at compute, is lost.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import warnings

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from capabilities import require
from cluster_helpers import wait_for


def test_a_dataframe_computed_under_a_span_or_annotation_is_named_by_it(monkeypatch, tmp_path):
    require(
        importlib.util.find_spec("pandas") is not None
        and importlib.util.find_spec("pyarrow") is not None,
        "dask.dataframe needs pandas and pyarrow: pip install pandas pyarrow",
    )
    import dask.dataframe as dd
    import pandas as pd

    pdf = pd.DataFrame({"name": list("abcd") * 50, "x": range(200), "y": range(200)})
    # Where dask-expr keeps its warn-once flag: dask.dataframe.dask_expr._collection, or
    # dask_expr._collection before Dask 2025.1. Without dask-expr (Dask 2024.12 with only
    # pandas installed) the legacy dataframe runs: its graph layers keep their annotations,
    # so one active while the dataframe was built names it too, and nothing warns.
    collection = sys.modules[type(dd.from_pandas(pdf, npartitions=1)).__module__]
    planned = hasattr(collection, "_WARN_ANNOTATIONS")
    expected_warning = (
        pytest.warns(UserWarning, match=r"\{'span'.*Annotations will be ignored")
        if planned
        else contextlib.nullcontext()
    )
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "history.sqlite3"))
        failures = oomguard.Failures(client)

        # Built and computed in the span: dask-expr warns (once per process; made to warn
        # here whatever ran before), and the span names the pipeline all the same.
        if planned:
            monkeypatch.setattr(collection, "_WARN_ANNOTATIONS", True)
        with expected_warning:
            with distributed.span("block"):
                ts = dd.from_pandas(pdf, npartitions=4)
                assert len(ts.groupby("name").x.mean().compute()) == 4
        # Built before, computed in the span or under the annotation.
        ts = dd.from_pandas(pdf, npartitions=4)
        with distributed.span("computed-in-span"):
            assert ts.y.max().compute() == 199
        with dask.annotate(oomguard_pipeline="annotated-compute"):
            assert ts.x.sum().compute() == 19900
        with distributed.span("persisted-in-span"):
            held = ts.x.max().persist()  # its tasks are submitted here
        distributed.wait(held)
        del held
        # Annotated only while built: with dask-expr lost at compute, named for what it
        # computes; the legacy dataframe keeps it.
        with dask.annotate(oomguard_pipeline="annotated-build"):
            built = dd.from_pandas(pdf, npartitions=4).x.min()
        assert built.compute() == 0

        def names():
            return {p.name for p in failures.pipelines()}

        # The filter docs/getting-started.md gives silences the warning.
        if planned:
            monkeypatch.setattr(collection, "_WARN_ANNOTATIONS", True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message="Dask annotations", category=UserWarning)
            with distributed.span("silenced"):
                dd.from_pandas(pdf, npartitions=2)
        assert caught == []

        wait_for(lambda: len(names()) >= 5, lambda: f"five pipelines stored: {names()}")
        named = {"block", "computed-in-span", "annotated-compute", "persisted-in-span"}
        assert named <= names(), names()
        if planned:
            assert "annotated-build" not in names()
            (automatic,) = names() - named
            assert automatic.startswith("frompandas"), automatic
        else:
            assert names() == named | {"annotated-build"}, names()
