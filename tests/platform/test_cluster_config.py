"""The cluster files, checked with Ray's own code and without a cloud or a cluster.

- cluster.yaml against Ray's launcher schema and `validate_config` (what `ray up` runs first), with one NVIDIA and
  one AMD worker type (integer resources, vendor labels Ray's label parser accepts); every node type's own setup
  and start commands run with a stub `ray`, which sees MLFLOW_TRACKING_URI and token auth on every node;
- no credentials, and nothing bound to 0.0.0.0 (cluster.yaml, the Slurm script, `make mlflow-server`);
- cluster/slurm/ray_cluster.sbatch: `bash -n`, then a run with stub srun/scontrol/ray: the head on the first node,
  one worker per other node, the vendor's resources and labels on each, the job submitted, the token removed;
- .rayignore: Ray's working-dir packaging walk leaves data/, runs/, .venv, mlruns, *.zarr and .git out.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_YAML = ROOT / "cluster.yaml"
SBATCH = ROOT / "cluster" / "slurm" / "ray_cluster.sbatch"
RAYIGNORE = ROOT / ".rayignore"
VENDOR_LABEL = "wxray.io/vendor"
ACCEL_LABEL = "wxray.io/accelerator-type"
UPLOAD_LIMIT = 100 * 1024**2  # the dashboard rejects working_dir packages over 100 MiB


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


@pytest.fixture(scope="module")
def prepared(cluster) -> dict:
    """The config as `ray up` sees it after its first step (defaults filled in, setup commands merged)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(copy.deepcopy(cluster))
    validate_config(config)
    return config


# --- cluster.yaml ---------------------------------------------------------------------------------------------


def test_cluster_yaml_passes_rays_launcher_schema(cluster, prepared):
    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cluster, schema)  # the file as written, not only after Ray filled in defaults
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_one_nvidia_and_one_amd_worker_type(cluster):
    from ray._private.label_utils import validate_node_label_syntax, validate_node_labels

    types = cluster["available_node_types"]
    head = cluster["head_node_type"]
    assert "GPU" not in types[head]["resources"], "the head node type is the CPU one"
    by_vendor: dict[str, list[str]] = {}
    for name, node_type in types.items():
        labels = node_type.get("labels", {})
        validate_node_label_syntax(labels)  # what `ray start --labels` accepts
        validate_node_labels(labels)  # no custom keys under the reserved ray.io/ prefix
        if name == head:
            continue
        resources = node_type["resources"]
        assert all(type(v) is int for v in resources.values()), f"{name}: resources must be integers"
        vendor = labels[VENDOR_LABEL]
        by_vendor.setdefault(vendor, []).append(name)
        assert resources["GPU"] > 0 and resources[vendor] == resources["GPU"], name
        accel = labels[ACCEL_LABEL]
        assert resources[f"accelerator_type:{accel}"] == 1, f"{name}: the autoscaler must see the accelerator type"
    assert {v: len(names) for v, names in by_vendor.items()} == {"nvidia": 1, "amd": 1}
    assert types[by_vendor["amd"][0]]["labels"][ACCEL_LABEL].startswith("AMD-Instinct-")


def _node_commands(prepared: dict, name: str) -> tuple[list[str], list[str]]:
    """The setup and start commands Ray runs on a node of this type (a type's own worker_setup_commands replace
    the global lists: `StandardAutoscaler._get_node_type_specific_fields`)."""
    if name == prepared["head_node_type"]:
        return prepared["head_setup_commands"], prepared["head_start_ray_commands"]
    own = prepared["available_node_types"][name].get("worker_setup_commands")
    return (own if own is not None else prepared["worker_setup_commands"]), prepared["worker_start_ray_commands"]


def test_every_node_starts_ray_with_the_mlflow_server_and_token_auth(prepared, tmp_path):
    """Run each node type's environment step and start commands in a scratch HOME with a stub `ray` where the
    platform's virtualenv would be, and look at the environment `ray start` got."""
    for name in prepared["available_node_types"]:
        home = tmp_path / name
        venv_bin = home / "wxray" / ".venv" / "bin"
        venv_bin.mkdir(parents=True)
        log = home / "ray-calls.log"
        _stub(venv_bin / "ray",
              f'printf "%s\\t%s\\t%s\\n" "${{MLFLOW_TRACKING_URI:-}}" "${{RAY_AUTH_MODE:-}}" "$*" >> {log}')
        setup, start = _node_commands(prepared, name)
        env_steps = [c for c in setup if "MLFLOW_TRACKING_URI" in c]
        assert len(env_steps) == 1, f"{name}: one setup step writes the node environment"
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "RAY_HEAD_IP": "10.0.0.1"}
        for command in env_steps + start:
            subprocess.run(["bash", "--noprofile", "--norc", "-c", command], env=env, check=True, timeout=60)
        calls = [line.split("\t") for line in log.read_text().splitlines()]
        starts = [c for c in calls if c[2].startswith("start ")]
        assert len(starts) == 1, f"{name}: {calls}"
        uri, auth_mode, args = starts[0]
        assert re.fullmatch(r"https?://[^/@\s]+(/\S*)?", uri), f"{name}: MLFLOW_TRACKING_URI={uri!r}"
        assert auth_mode == "token", name
        if name == prepared["head_node_type"]:
            assert "--dashboard-host=127.0.0.1" in args.split()
        else:
            assert "--address=10.0.0.1:6379" in args.split()
        assert "source ~/.wxray/env.sh" in (home / ".bashrc").read_text()  # `ray exec` / `ray attach` shells too


def _strings(node, key: str = ""):
    """(nearest mapping key, string) for every string in a parsed YAML document, keys included."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k), str(k)
            yield from _strings(v, str(k))
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)
    elif isinstance(node, str):
        yield key, node


SECRET_KEY = re.compile(r"(?i)(password|passwd|token|secret|credential|(^|[_.\-])key)$")
SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b(\w*(?:password|passwd|secret|token|api_key|access_key)\w*)\s*[=:]\s*(\"[^\"]*\"|'[^']*'|\S+)")
SECRET_SHAPES = re.compile(r"AKIA[0-9A-Z]{16}|-----BEGIN|gh[pousr]_[A-Za-z0-9]{20,}|\b[0-9a-f]{40,}\b"
                           r"|://[^/\s:@]+:[^/\s@]+@")


def _placeholder(value: str) -> bool:
    """Empty, an obvious placeholder, a variable, or a file path (where a secret is kept, not the secret)."""
    v = value.strip().strip("'\"")
    return (not v or v.startswith(("$", "~", "/")) or "EDIT" in v
            or any(w in v.lower() for w in ("example", "placeholder", "<")))


def _secret_problems(doc_strings) -> list[str]:
    problems = []
    for key, value in doc_strings:
        if SECRET_KEY.search(key) and value != key and not _placeholder(value):
            problems.append(f"{key}: {value}")
        for name, assigned in SECRET_ASSIGNMENT.findall(value):
            if not _placeholder(assigned):
                problems.append(f"{name}={assigned}")
        if SECRET_SHAPES.search(value):
            problems.append(value)
    return problems


def test_secret_check_catches_planted_credentials():
    """The check below is not vacuous."""
    planted = [{"auth": {"ssh_private_key": "AAAAB3NzaC1yc2E"}}, {"provider": {"aws_secret_access_key": "abc123"}},
               {"setup_commands": ["export MLFLOW_TRACKING_PASSWORD=hunter2"]},
               {"setup_commands": ["export MLFLOW_TRACKING_URI=http://alice:s3cret@mlflow.internal:5000"]},
               {"head_start_ray_commands": ["RAY_AUTH_TOKEN=" + "ab" * 32 + " ray start --head"]}]
    for doc in planted:
        assert _secret_problems(_strings(doc)), doc
    assert _secret_problems(_strings({"auth": {"ssh_private_key": "~/.ssh/wxray.pem"},
                                      "file_mounts": {"~/.ray/auth_token": "~/.ray/auth_token"},
                                      "setup_commands": ["export RAY_AUTH_MODE=token"]})) == []


def test_no_credentials_in_the_cluster_files(cluster):
    assert _secret_problems(_strings(cluster)) == []
    shell = [("", line) for line in SBATCH.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert _secret_problems(shell) == []


def test_nothing_binds_all_interfaces(cluster):
    """Dashboard and MLflow on loopback; 0.0.0.0 appears only in comments (as the opt-in it would be)."""
    assert not [v for _, v in _strings(cluster) if "0.0.0.0" in v]
    sbatch_code = [line for line in SBATCH.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in sbatch_code if "0.0.0.0" in line]
    assert any("--dashboard-host=127.0.0.1" in line for line in sbatch_code)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^MLFLOW_HOST \?= 127\.0\.0\.1$", makefile, re.M)
    recipe = makefile[makefile.index("\nmlflow-server:"):makefile.index("\nmlflow-server-down:")]
    assert "mlflow server --app-name $(MLFLOW_APP) --host $(MLFLOW_HOST)" in recipe and "0.0.0.0" not in recipe
    assert "--backend-store-uri sqlite:///$(CURDIR)/runs/" in recipe and "--serve-artifacts" in recipe
    phony = re.search(r"^\.PHONY:((?:.*\\\n)*.*)$", makefile, re.M).group(1).replace("\\\n", " ").split()
    assert {"mlflow-server", "mlflow-server-down"} <= set(phony)


# --- Slurm -----------------------------------------------------------------------------------------------------


def test_sbatch_script_parses():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _fake_slurm(tmp_path: Path, nodes: list[str]) -> tuple[dict, Path, Path]:
    """A venv whose bin/ holds stub srun, scontrol, hostname, ray and python (ray's calls go to a log)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls.log"
    repo = tmp_path / "repo"
    repo.mkdir()
    # srun: drop its options, remember the node (-w), run the command there (here).
    _stub(bin_dir / "srun", 'node=batch\nwhile [ $# -gt 0 ]; do case "$1" in -w) node=$2; shift 2;; '
                            '-*) shift;; *) break;; esac; done\nexport STUB_NODE=$node\nexec "$@"')
    _stub(bin_dir / "scontrol", "printf '%s\\n' " + " ".join(nodes))
    _stub(bin_dir / "hostname", "echo 10.1.2.3 fd00::3")
    # ray: one log line per call (node, MLFLOW_TRACKING_URI, RAY_AUTH_MODE, HIP_VISIBLE_DEVICES, args; split by
    # \x1f); `start --block` blocks until the script stops it; `job list` answers once the head has started.
    _stub(bin_dir / "ray", r"""sep=$'\x1f'
line="${STUB_NODE:-batch}$sep${MLFLOW_TRACKING_URI:-}$sep${RAY_AUTH_MODE:-}$sep${HIP_VISIBLE_DEVICES:-}"
for a in "$@"; do line+="$sep$a"; done
echo "$line" >> LOG
case "$1 ${2:-}" in
  "start "*) exec sleep 60;;
  "job list") for i in $(seq 200); do grep -q "${sep}start$sep--head" LOG && exit 0; sleep 0.05; done; exit 1;;
esac""".replace("LOG", str(log)))
    # python: the script's count of alive Ray nodes is the number of nodes whose `ray start` ran.
    _stub(bin_dir / "python", r"""case "$*" in *ray.nodes*)
  for i in $(seq 200); do n=$(grep -c $'\x1fstart\x1f' LOG); [ "$n" -ge NODES ] && break; sleep 0.05; done
  echo "$n"; exit 0;;
esac
exec PYTHON "$@"
""".replace("LOG", str(log)).replace("NODES", str(len(nodes))).replace("PYTHON", sys.executable))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "123",
           "SLURM_JOB_NODELIST": "gpu[001-003]", "SLURM_SUBMIT_DIR": str(repo), "WXRAY_VENV": str(tmp_path / "venv"),
           "MLFLOW_TRACKING_URI": "http://10.0.0.5:5000"}
    return env, log, repo


@pytest.mark.parametrize("vendor,accel,rocr", [("amd", "AMD-Instinct-MI250X", "0,1,2,3,4,5,6,7"),
                                               ("nvidia", "", "")])
def test_sbatch_starts_one_vendor_cluster_and_submits_the_job(tmp_path, vendor, accel, rocr):
    from ray._private.label_utils import parse_node_labels_string

    nodes = ["gpu001", "gpu002", "gpu003"]
    env, log, repo = _fake_slurm(tmp_path, nodes)
    env.update(WXRAY_VENDOR=vendor, WXRAY_ACCELERATOR_TYPE=accel)
    if rocr:
        env["ROCR_VISIBLE_DEVICES"] = rocr  # what Slurm sets on AMD allocations
    job = ["python", "jobs/train_sparse.py", "scaling.use_gpu=true"]
    done = subprocess.run(["bash", str(SBATCH), *job], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [line.split("\x1f") for line in log.read_text().splitlines()]
    starts = {c[0]: c for c in calls if c[4] == "start"}
    assert sorted(starts) == nodes
    want_resources = {vendor: 8, **({f"accelerator_type:{accel}": 1} if accel else {})}
    want_labels = {VENDOR_LABEL: vendor, **({ACCEL_LABEL: accel} if accel else {})}
    for node, (_, uri, auth_mode, hip, *args) in starts.items():
        opts = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
        if node == nodes[0]:
            assert "--head" in args and opts["--node-ip-address"] == "10.1.2.3"
            assert opts["--dashboard-host"] == "127.0.0.1"
        else:
            assert opts["--address"] == "10.1.2.3:6379"
        assert opts["--num-gpus"] == "8"
        assert json.loads(opts["--resources"]) == want_resources
        assert parse_node_labels_string(opts["--labels"]) == want_labels  # Ray's own `--labels` parser
        assert "--block" in args
        assert (uri, auth_mode) == ("http://10.0.0.5:5000", "token")
        assert hip == ("0,1,2,3,4,5,6,7" if vendor == "amd" else "")
    submit = [c[4:] for c in calls if c[4:6] == ["job", "submit"]]
    assert len(submit) == 1 and submit[0][-len(job) - 1:] == ["--", *job]
    assert "--working-dir=." in submit[0]
    assert not (repo / "runs" / "slurm-123" / "ray_auth_token").exists(), "the job's token is removed at the end"


@pytest.mark.parametrize("change,message", [({"WXRAY_VENDOR": "intel"}, "WXRAY_VENDOR must be nvidia or amd"),
                                            ({"MLFLOW_TRACKING_URI": ""}, "set MLFLOW_TRACKING_URI")])
def test_sbatch_refuses_a_bad_setup_before_starting_anything(tmp_path, change, message):
    env, log, _ = _fake_slurm(tmp_path, ["gpu001"])
    env.update(change)
    done = subprocess.run(["bash", str(SBATCH), "python", "jobs/train_sparse.py"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr
    assert not log.exists()


# --- .rayignore -----------------------------------------------------------------------------------------------


def _uploaded(root: Path, include_gitignore: bool, excludes: list[str]) -> dict[str, int]:
    """{path: size} of the files Ray would pack for `--working-dir root` (the walk of `packaging._zip_files`)."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    files: dict[str, int] = {}

    def handler(path: Path) -> None:
        if path.is_file():
            files[path.relative_to(root).as_posix()] = path.stat().st_size

    _dir_travel(root, [_get_excludes(root, excludes)], handler, include_gitignore=include_gitignore)
    return files


LEFT_OUT = re.compile(r"^(data|runs|\.venv|venv|\.git|mlruns)(/|$)|(^|/)mlruns/|\.zarr(/|$)")


def test_rayignore_alone_keeps_data_runs_venv_and_stores_out(tmp_path):
    """Without .gitignore and Ray's default excludes (RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1,
    RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES=''), .rayignore alone decides; wxray/data/ is code and stays."""
    (tmp_path / ".rayignore").write_text(RAYIGNORE.read_text())
    kept = [".rayignore", "cluster.yaml", "jobs/train_sparse.py", "configs/train_sparse.yaml",
            "wxray/data/__init__.py", "wxray/data/stores.py", "tests/data/test_x.py"]
    dropped = ["data/sample_32x64.zarr/zarr.json", "data/sample_obs/obs.parquet", "runs/mlflow.db",
               "runs/train_sparse/demo/checkpoint/model.pt", ".venv/lib/python3.11/site.py", "venv/bin/python",
               ".git/HEAD", "mlruns/0/meta.yaml", "jobs/mlruns/0/meta.yaml", "out.zarr/temperature/c/0",
               "tests/fixtures/tiny.zarr/zarr.json", "wxray/__pycache__/io.cpython-311.pyc"]
    for rel in kept[1:] + dropped:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert sorted(_uploaded(tmp_path, include_gitignore=False, excludes=[])) == sorted(kept)


@pytest.mark.parametrize("include_gitignore,defaults", [(True, True), (False, False)])
def test_repository_upload_is_small_and_leaves_data_out(include_gitignore, defaults):
    """What `ray job submit --working-dir .` would pack from this checkout, with Ray's defaults and with
    .rayignore alone."""
    from ray._private.ray_constants import get_runtime_env_default_excludes

    files = _uploaded(ROOT, include_gitignore, get_runtime_env_default_excludes() if defaults else [])
    assert "jobs/train_sparse.py" in files and "wxray/data/__init__.py" in files
    assert not [f for f in files if LEFT_OUT.search(f)]
    assert sum(files.values()) < UPLOAD_LIMIT / 2, f"{sum(files.values()) / 2**20:.1f} MiB to upload"

