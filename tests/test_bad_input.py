"""The bad-input contract, by family and for every job: one `error:` line on stderr, exit 2, no traceback,
and the file system exactly as it was (an existing run directory included).

Property-based over each job's config: random out-of-domain numbers, unknown keys, wrong types and bad
output locations. All of these fail before any work starts, so the jobs run in-process without Ray.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wxray.cli import JOBS, _load
from wxray.config import Range
from wxray.job import run_job

CONFIGS = {cmd: _load(spec[1]) for cmd, spec in JOBS.items()}


def numeric_keys(cls, prefix=""):
    """(dotted key, base type, Range or None, scalar|list|dict|either) of every int/float key, nested sections
    too; `either`: a scalar or a list (scaling.num_workers: n or [min, max])."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += numeric_keys(tp, f"{prefix}{f.name}.")
            continue
        bare = get_args(tp)[0] if get_origin(tp) is Annotated else tp
        outer = get_origin(bare)
        arms = {get_origin(get_args(a)[0] if get_origin(a) is Annotated else a) for a in get_args(bare)}
        shape = ("dict" if outer is dict else "list" if outer in (list, tuple)
                 else "either" if outer in (typing.Union, types.UnionType) and arms & {list, tuple} else "scalar")
        out += [(f"{prefix}{f.name}", base, rng, shape) for base, rng in _numbers(tp)]
    return out


def _numbers(tp):
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extras = get_args(tp)
        rng = next((e for e in extras if isinstance(e, Range)), None)
        return [(base, rng)] if base in (int, float) else _numbers(base)
    if tp in (int, float):
        return [(tp, None)]
    return [x for a in get_args(tp) if a is not type(None) and a is not Ellipsis for x in _numbers(a)]


@pytest.mark.parametrize("cmd", sorted(CONFIGS))
def test_every_numeric_key_declares_its_domain(cmd):
    missing = [key for key, _, rng, _ in numeric_keys(CONFIGS[cmd]) if rng is None]
    assert not missing, f"{cmd}: numeric keys without a Range domain: {missing}"


def listing(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _outside(base, rng: Range, draw) -> object:
    below = [rng.lo - draw(st.integers(1, 10**6)) if base is int else rng.lo - draw(st.floats(1e-6, 1e6)),
             rng.lo] if rng.lo is not None else []
    above = [rng.hi + draw(st.integers(1, 10**6)) if base is int else rng.hi + draw(st.floats(1e-6, 1e6)),
             rng.hi] if rng.hi is not None else []
    # The bound itself is outside only when the interval is open there.
    candidates = ([below[0]] + ([below[1]] if rng.lo_open else []) + ([above[0]] if above else [])
                  + ([above[1]] if above and rng.hi_open else []))
    if base is float:
        candidates += ["nan", "inf", "-inf"]
    return draw(st.sampled_from(candidates))


@st.composite
def bad_override(draw, cmd: str, unwritable: Path | None, a_file: Path):
    cls = CONFIGS[cmd]
    keys = numeric_keys(cls)
    family = draw(st.sampled_from(["domain", "unknown", "type", "output", "run_name", "foreign"]))
    if family == "run_name":
        name = draw(st.sampled_from(["../../x", "..", "a/b", "/etc", "a\\b", "tab\there"]))
        return [f"run_name={name}"], "run_name"
    if family == "foreign":  # a folder with files that is no run directory (here: the sandbox's own root)
        return [f"out_dir={a_file.parent}"], "out_dir"
    if family == "domain":
        bounded = [k for k in keys if k[2] is not None and (k[2].lo is not None or k[2].hi is not None)]
        key, base, rng, _ = draw(st.sampled_from(bounded))
        return [f"{key}={_outside(base, rng, draw)}"], key
    if family == "unknown":
        name = draw(st.from_regex(r"[a-z]{3,10}", fullmatch=True))
        hints = typing.get_type_hints(cls)
        section = draw(st.sampled_from(["", *[f"{f.name}." for f in dataclasses.fields(cls)
                                               if dataclasses.is_dataclass(hints[f.name])]]))
        return [f"{section}{name}_x=1"], f"{section}{name}_x"
    if family == "type":
        key, base, _, shape = draw(st.sampled_from(keys))
        wrong = {"dict": ["abc", "[1, 2]", "{a: abc}"], "list": ["abc", "{a: 1}", "[abc]"],
                 "either": ["abc", "{a: 1}", "[abc]", "[1, 2, 3]"] + (["1.5"] if base is int else []),
                 "scalar": ["abc", "{a: 1}", "[1, 2]"] + (["1.5"] if base is int else [])}[shape]
        value = draw(st.sampled_from(wrong))
        return [f"{key}={value}"], key
    where = draw(st.sampled_from(["under_file", "unwritable"] if unwritable else ["under_file"]))
    target = (a_file / "run") if where == "under_file" else (unwritable / "run")
    return [f"out_dir={target}"], "out_dir"


def _unwritable(tmp: Path) -> Path | None:
    d = tmp / "locked"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        return d
    ok = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
    return d if ok else None


def _unlock(d: Path | None) -> None:
    if d is not None and os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)


# a valid-looking rest of the command for the jobs that have required keys
REQUIRED = {"evaluate": ["forecast=fc.zarr", "truth=truth.zarr"], "forecast": ["checkpoint=run"],
            "prepare-data": ["source=src.nc", "out=out.zarr"],
            "prepare-obs": ["source=st.csv", "out=obs", "stream=st"]}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    run_dir = root / "existing_run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("kept: as it was\n")
    (run_dir / ".mlflow_run_id").write_text("0123abc\n")
    a_file = root / "a_file"
    a_file.write_text("not a folder")
    locked = _unwritable(root)
    yield root, run_dir, a_file, locked
    _unlock(locked)


@pytest.mark.parametrize("cmd", sorted(CONFIGS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bad_config_is_one_line_and_changes_nothing(cmd, data, sandbox, capsys, monkeypatch):
    root, run_dir, a_file, locked = sandbox
    monkeypatch.chdir(root)
    monkeypatch.setenv("WXRAY_HOME", str(root))
    argv, key = data.draw(bad_override(cmd, locked, a_file))
    job, cfg_cls, _, _ = JOBS[cmd]
    # A valid-looking rest of the command, so the bad key is the only thing wrong.
    required = REQUIRED.get(cmd, [])
    before = listing(root)

    def must_not_run(cfg, ctx):
        raise AssertionError("the job started despite bad input")

    capsys.readouterr()
    rc = run_job(job, _load(cfg_cls), must_not_run, [f"out_dir={run_dir}", *required, *argv,
                                                     f"tracking.uri=sqlite:///{root}/db/mlflow.db"])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert rc == 2, (argv, err)
    assert len(errors) == 1 and "Traceback" not in err, (argv, err)
    assert key.split(".")[-1] in errors[0], (argv, errors[0])
    assert listing(root) == before, argv


@pytest.mark.parametrize("cmd, argv, key", [
    ("make-sample-obs", ["store=d/s.zarr", "out=d/s.zarr", "overwrite=true"], "out"),
    ("make-sample-obs", ["store=d/s.zarr", "out=d/s.zarr/obs", "overwrite=true"], "out"),
    ("make-sample-obs", ["store=d/s.zarr", "out=d", "overwrite=true"], "out"),
    ("prepare-data", ["source=d/src.zarr", "out=d/src.zarr", "overwrite=true"], "out"),
    ("prepare-obs", ["source=d/st.csv", "out=d", "stream=st"], "out"),
    ("forecast", ["checkpoint=d/run", "out_dir=d/run"], "out_dir"),
    ("evaluate", ["forecast=d/fc.zarr", "truth=d/t.zarr", "out_dir=d/t.zarr/x"], "out_dir"),
])
def test_an_output_apart_from_every_input(cmd, argv, key, tmp_path, capsys, monkeypatch):
    """Whatever `overwrite` says: an output that is an input, lies inside one or holds one is refused."""
    monkeypatch.setenv("WXRAY_HOME", str(tmp_path))
    (tmp_path / "d" / "s.zarr").mkdir(parents=True)
    (tmp_path / "d" / "st.csv").write_text("id,time,lat,lon,t\n")
    before = listing(tmp_path)
    rc = run_job(JOBS[cmd][0], CONFIGS[cmd], None, [*argv, "tracking.enabled=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"error: config key '{key}'") and "input" in err, err
    assert listing(tmp_path) == before


def test_an_output_inside_a_stages_directory_is_the_design(tmp_path, capsys, monkeypatch):
    """A stage's run directory lies inside the stages directory it reads: that input holds runs."""
    monkeypatch.setenv("WXRAY_HOME", str(tmp_path))
    seen = {}
    rc = run_job("train_e2e", CONFIGS["train-e2e"], lambda cfg, ctx: seen.setdefault("ok", {}),
                 ["stage=decoder", "run_name=exp", "tracking.enabled=false"])
    assert rc == 0 and "ok" in seen, capsys.readouterr().err


def test_yaml_with_a_duplicated_key_is_refused(tmp_path, capsys):
    y = tmp_path / "c.yaml"
    y.write_text("model:\n  depth: 4\n  embed_dim: 32\n  depth: 6\n")
    rc = run_job("train_sparse", CONFIGS["train"], None, ["--config", str(y), f"out_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"error: config file {y}: key 'depth' is given twice (lines 2 and 4)"


def test_union_keys_name_their_alternatives(tmp_path, capsys):
    rc = run_job("prepare_data", CONFIGS["prepare-data"], None,
                 ["source=x.nc", "out=o.zarr", "member=first", f"out_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "expects int or 'mean' or null, got 'first'" in err and "Union" not in err


@pytest.mark.parametrize("cmd", sorted(CONFIGS))
def test_help_lists_every_key_with_type_default_and_doc(cmd, capsys):
    from wxray.config_help import describe

    assert run_job(JOBS[cmd][0], CONFIGS[cmd], None, ["--help"]) == 0
    out = capsys.readouterr().out
    keys = out.split("Keys:\n", 1)[1].splitlines()
    assert keys == describe(CONFIGS[cmd]) and len(keys) == len(numeric_keys_and_others(CONFIGS[cmd]))
    assert all("(" in k and ", default " in k and "): " in k for k in keys), [k for k in keys if "): " not in k]
    if cmd == "train":
        assert "  model.keep_ratio (float in (0, 1], default 0.25): fraction r of tokens the middle blocks see" in keys
        assert "  data.store (str, default 'data/sample_32x64.zarr'): the zarr store to train on " \
               "(jobs/prepare_data.py writes one)" in keys
        assert "  train.seed (int in [0, 4294967295], default 0): initial weights, token selections and dropout " \
               "masks" in keys


def numeric_keys_and_others(cls, prefix=""):
    """Every leaf key of a config class (dotted)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += numeric_keys_and_others(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def test_relative_paths_resolve_against_the_wxray_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WXRAY_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    seen = {}

    def main(cfg, ctx):
        seen["cfg"] = cfg
        return {}

    assert run_job("make_sample_data", CONFIGS["make-sample-data"], main,
                   ["out=data/s.zarr", "tracking.enabled=false"]) == 0
    cfg = seen["cfg"]
    assert cfg.out == str(tmp_path / "home" / "data" / "s.zarr")
    assert Path(cfg.out_dir).parent == tmp_path / "home" / "runs" / "make_sample_data"
    assert "out_dir: " + cfg.out_dir in (Path(cfg.out_dir) / "config.yaml").read_text()


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_leaves_nothing(small_disk, tmp_path):
    """The real script on a real 256 KiB file system: the sample store does not fit."""
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "jobs" / "make_sample_data.py"), f"out={small_disk / 's.zarr'}",
                        f"out_dir={small_disk / 'run'}", "tracking.enabled=false"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: no space left on the device writing {small_disk / 'run'} or {small_disk / 's.zarr'} (256.0 KiB "
        "free): nothing was kept; free space or write elsewhere"], r.stderr[-3000:]
    assert list(small_disk.iterdir()) == []


def test_a_directory_where_a_file_is_expected_says_directory(tmp_path, capsys):
    rc = run_job("train_sparse", CONFIGS["train"], None, ["--config", str(tmp_path), f"out_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"error: config file {tmp_path} is a directory, not a YAML file"
    (tmp_path / "tables").mkdir()
    rc = run_job("prepare_obs", CONFIGS["prepare-obs"], _load(JOBS["prepare-obs"][2]),
                 [f"source={tmp_path / 'tables'}", f"out={tmp_path / 'obs'}", "stream=st", f"out_dir={tmp_path / 'r'}",
                  "tracking.enabled=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"error: source {tmp_path / 'tables'} is a directory; expected a .csv or .parquet file"


@pytest.mark.parametrize("job,cmd,extra", [("make_sample_obs", "make-sample-obs", []),
                                             ("prepare_obs", "prepare-obs", ["source=st.csv", "stream=st"])])
def test_an_obs_dir_is_not_written_to_a_url(job, cmd, extra, tmp_path, capsys, monkeypatch):
    """Obs dirs are read from object storage, never written there: refused before anything is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "st.csv").write_text("id,time,lat,lon,t2m\n1,2000-01-01T00,1,2,280\n")
    rc = run_job(job, CONFIGS[cmd], _load(JOBS[cmd][2]),
                 ["out=s3://bucket/obs", *extra, f"out_dir={tmp_path / 'r'}", "tracking.enabled=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: config key 'out' = s3://bucket/obs: obs dirs are written to a folder")
    assert len(err.splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["st.csv"]


@pytest.mark.slow
def test_an_unparseable_time_is_the_only_line_on_stderr(tmp_path):
    """As users run it: no pandas warning before the error line."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "st.csv").write_text("id,time,lat,lon,t2m\n1,noon on tuesday,1,2,280\n2,2000-01-01T00,1,2,281\n")
    r = subprocess.run([sys.executable, str(root / "jobs" / "prepare_obs.py"), f"source={tmp_path / 'st.csv'}",
                        f"out={tmp_path / 'obs'}", "stream=st", f"out_dir={tmp_path / 'run'}",
                        "tracking.enabled=false"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'noon on tuesday' (data row 1) is not parseable" in r.stderr
