"""Results files become runs: grouped by domain and model, with tool schemas from the file, the
domain registry, or nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.analysis.channels import ErrorChannel
from evalkit.analysis.load import default_tool_source, load_runs, recorded_tools
from evalkit.errors import ResultsFileError
from evalkit.formats import read_results
from tests.evalkit.analysis.builders import SCHEMA, UNKNOWN, Call, episode, results, write

CUSTOMER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_customer_by_phone",
        "parameters": {
            "type": "object",
            "properties": {"phone_number": {"type": "string"}},
            "required": ["phone_number"],
        },
    },
}


def test_files_group_into_runs_by_domain_and_model_in_order(tmp_path: Path) -> None:
    paths = [
        write(tmp_path / "r1.json", results([episode("1")], model="m")),
        write(tmp_path / "t1.json", results([episode("1")], domain="telecom", model="m")),
        write(tmp_path / "r2.json", results([episode("2"), episode("3")], model="m")),
        write(tmp_path / "r3.json", results([episode("1")], model="other")),
    ]
    runs = load_runs(paths, resamples=200)
    assert [(r.domain, r.model, len(r.episodes), r.label) for r in runs] == [
        ("retail", "m", 3, "r1 (+1 more)"),
        ("telecom", "m", 1, "t1"),
        ("retail", "other", 1, "r3"),
    ]
    assert runs[0].sources == (str(paths[0]), str(paths[2]))


def test_a_file_that_names_no_domain_or_model_is_an_unknown_run(tmp_path: Path) -> None:
    data = results([episode("1")])
    data["info"] = {}
    (run,) = load_runs([write(tmp_path / "bare.json", data)], resamples=200)
    assert (run.domain, run.model, run.max_errors, run.schema_source) == (
        "unknown",
        "unknown",
        10,
        None,
    )


def test_recorded_tool_defs_classify_a_domain_that_is_not_built_in(tmp_path: Path) -> None:
    sims = [episode("1", [Call(UNKNOWN, "get_customer")])]
    sims[0]["messages"][3]["content"] = "Error: no such function"  # a text that names nothing
    # "airline" is a τ²-bench domain evalkit does not ship: only recorded tool_defs can describe it.
    plain = write(tmp_path / "plain.json", results(sims, domain="airline"))
    recorded = write(
        tmp_path / "recorded.json",
        results(sims, domain="airline", tool_defs={"get_customer_by_phone": CUSTOMER_TOOL}),
    )
    (without,) = load_runs([plain], resamples=200)
    (with_defs,) = load_runs([recorded], resamples=200)
    assert without.schema_source is None
    assert without.channels()[ErrorChannel.ENVIRONMENT_ERROR] == 1
    assert with_defs.schema_source == "tool_defs recorded in the results file"
    assert with_defs.channels()[ErrorChannel.UNKNOWN_TOOL] == 1
    assert with_defs.wrong_tool_names() == {"get_customer": 1}


def test_invalid_recorded_tool_defs_are_ignored(tmp_path: Path) -> None:
    path = write(tmp_path / "r.json", results([episode("1")], tool_defs=[{"type": "function"}]))
    assert recorded_tools("retail", read_results(path)) is None


def test_retail_schemas_come_from_the_registry_shipped_or_from_a_data_dir(
    tmp_path: Path, tau2_dir: Path
) -> None:
    path = write(tmp_path / "r.json", results([episode("1", [Call(SCHEMA)])]))
    (shipped,) = load_runs([path], resamples=200)
    assert shipped.schema_source == "retail tools (shipped)"
    assert shipped.channels()[ErrorChannel.SCHEMA_VIOLATION] == 1
    for data_dir in (tau2_dir, tau2_dir / "domains", tau2_dir / "domains" / "retail"):
        (run,) = load_runs([path], tools=default_tool_source(data_dir), resamples=200)
        assert run.schema_source == f"retail tools ({tau2_dir / 'domains' / 'retail'})"


def test_an_unreadable_file_raises_the_results_file_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"info": {}, "simulations": [')
    with pytest.raises(ResultsFileError, match=r"broken\.json"):
        load_runs([broken])
