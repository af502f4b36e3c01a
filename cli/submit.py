"""``gpufed submit -f FILE|DIR [--wait] [--dry-run] [-o json|yaml]``: files to GPUJobs on the hub.

What becomes a GPUJob (:func:`gpujobs_of`), file by file (a DIR: every ``*.yaml``, ``*.yml``
and ``*.json`` directly in it, by name; ``-`` reads stdin; ``-f`` may repeat):

- a ``GPUJob`` document is one GPUJob, as written;
- the workloads (batch/v1 Job, JobSet, PyTorchJob, RayJob, MPIJob) are wrapped
  (:func:`gpufed.cli.jobs.wrap`: same name, placement from the ``gpufed.io/*`` annotations);
- a file with ONE workload and other objects (its ConfigMaps, Secrets, Services) becomes ONE
  GPUJob whose template is a ``kind: List`` of every object in file order (the extra manifests
  of docs/design.md §4); a ``kind: List`` document counts as its items;
- several workloads without other objects: one GPUJob each. Anything else (other objects with
  no workload, or with several, or beside a GPUJob) is refused naming the file: which
  workload the others belong to would be a guess.

Every GPUJob is checked before anything is created, as the hub's intake checks it (the model,
the pod sets, GPU names, the manifests a member would get, :func:`dry_run_entry`), so a bad
file creates nothing. Creation is strict (a misspelt field is refused, not dropped).

``-o json|yaml`` prints a list, one entry per GPUJob: ``{"gpujob": {...}, "podSets": [{"name",
"count", "gpusPerPod"}], "gpus": <whole GPUs in all>}`` (``gpujob`` as the API server returned
it, or as it would be sent with ``--dry-run``). ``--dry-run`` touches no cluster (the
namespace is ``-n``, else the kubeconfig context's when one resolves, else ``default``).
``--wait``: :mod:`gpufed.cli.follow`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Final

import typer
import yaml

from gpufed.api.bounds import measure
from gpufed.api.errors import FieldError, PermanentError
from gpufed.api.gpujob import GPUJob
from gpufed.api.labels import API_VERSION, GROUP, VERSION
from gpufed.cli import follow, kube
from gpufed.cli.jobs import (
    WRAPPABLE,
    Context,
    Kubeconfig,
    Namespace,
    _api_message,
    _fail,
    _Kube,
    _reachable,
    wrap,
)
from gpufed.cli.output import Output, output_format
from gpufed.hub.rules.podsets import placement_request
from gpufed.sync.manifests import prepare_manifests

__all__ = ["SubmitError", "dry_run_entry", "gpujobs_of", "read_sources", "submit"]

#: Extensions read from a directory.
SUFFIXES: Final = (".yaml", ".yml", ".json")
#: Bounds on what is read: bytes per file and files per run.
MAX_FILE_BYTES: Final = 8 * 1024 * 1024
MAX_FILES: Final = 1000


class SubmitError(PermanentError, ValueError):
    """A file that cannot become GPUJobs; the message names the file (and document)."""


def read_sources(paths: list[Path]) -> list[tuple[str, list[Any]]]:
    """(name, YAML documents) per file of ``paths`` (a directory: its ``*.yaml|yml|json``).

    Raises :class:`SubmitError` for a missing path, a directory without such files, more than
    :data:`MAX_FILES` files, a file past :data:`MAX_FILE_BYTES`, and text that is not YAML.
    """
    files: list[Path] = []
    for path in paths:
        if str(path) == "-":
            files.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
            if not found:
                raise SubmitError(
                    f"cannot read {path}: a directory without *.yaml, *.yml or *.json files"
                )
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise SubmitError(f"cannot read {path}: no such file or directory")
    if len(files) > MAX_FILES:
        raise SubmitError(f"{len(files)} files: more than {MAX_FILES}; submit fewer at a time")
    out = []
    for file in files:
        try:
            if str(file) == "-":
                text = sys.stdin.read(MAX_FILE_BYTES + 1)
            else:
                if file.stat().st_size > MAX_FILE_BYTES:
                    raise SubmitError(f"{file}: larger than {MAX_FILE_BYTES // 2**20} MiB")
                text = file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SubmitError(
                f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}"
            ) from exc
        if len(text) > MAX_FILE_BYTES:
            raise SubmitError(f"{file}: larger than {MAX_FILE_BYTES // 2**20} MiB")
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise SubmitError(f"{file}: not YAML: {exc}") from exc
        for i, doc in enumerate(docs):
            # YAML aliases can make a small file an enormous object (a "billion laughs"): check
            # its size, in bounded steps, before anything walks or serialises it
            try:
                measure(doc, field=f"document {i + 1}")
            except FieldError as exc:
                raise SubmitError(f"{file}: {exc}") from exc
        out.append(("stdin" if str(file) == "-" else str(file), docs))
    return out


def _flatten(source: str, docs: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, object) for every object of a file, ``kind: List`` documents expanded."""
    out = []
    for i, doc in enumerate(docs):
        where = f"{source} document {i + 1}"
        if not isinstance(doc, dict):
            raise SubmitError(
                f"{where}: not a Kubernetes object (a mapping with apiVersion, kind, metadata), "
                f"got a {type(doc).__name__}"
            )
        if doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
            items = doc.get("items")
            if not isinstance(items, list):
                raise SubmitError(f"{where}: items: a List needs a list of objects")
            for j, item in enumerate(items):
                if not isinstance(item, dict):
                    raise SubmitError(f"{where} items[{j}]: not a Kubernetes object")
                out.append((f"{where} items[{j}]", item))
        else:
            out.append((where, doc))
    return out


def _kind(obj: dict[str, Any]) -> tuple[Any, Any]:
    return obj.get("apiVersion"), obj.get("kind")


def gpujobs_of(source: str, docs: list[Any], namespace: str) -> list[dict[str, Any]]:
    """The GPUJobs one file's documents make (module doc); ``namespace``: for objects without one.

    Raises :class:`SubmitError` naming the file and document.
    """
    objects = _flatten(source, docs)
    if not objects:
        raise SubmitError(f"{source}: no objects (expected a GPUJob or a workload)")
    gpujobs = [(w, o) for w, o in objects if _kind(o) == (API_VERSION, "GPUJob")]
    workloads = [(w, o) for w, o in objects if _kind(o) in WRAPPABLE]
    others = [(w, o) for w, o in objects if (w, o) not in gpujobs and (w, o) not in workloads]
    if others and (gpujobs or len(workloads) != 1):
        names = ", ".join(
            f"{o.get('kind')} {(o.get('metadata') or {}).get('name')}" for _, o in others
        )
        what = (
            "beside a GPUJob (put them in its spec.template as a List)"
            if gpujobs
            else f"with {len(workloads)} workloads (put each workload with its objects in a "
            "file of its own)"
        )
        raise SubmitError(
            f"{others[0][0]}: {names}: other objects go into the one workload's GPUJob, but "
            f"this file has them {what}; a workload is a Job, JobSet, PyTorchJob, RayJob or "
            "MPIJob"
        )
    out = []
    for where, obj in gpujobs + workloads:
        try:
            job = wrap(obj, namespace)
        except ValueError as exc:
            raise SubmitError(f"{where}: {exc}") from exc
        if others:
            job["spec"]["template"] = _list_template(job, objects)
        out.append(job)
    return out


def _list_template(
    job: dict[str, Any], objects: list[tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    """The ``kind: List`` template of a workload and its objects (namespace checked, dropped)."""
    ns = job["metadata"]["namespace"]
    items = []
    for where, obj in objects:
        item = json.loads(json.dumps(obj))
        meta = item.get("metadata")
        if isinstance(meta, dict):
            other = meta.pop("namespace", None)
            if other not in (None, "", ns):
                raise SubmitError(
                    f"{where}: metadata.namespace {other!r} is not the job's {ns!r}: a GPUJob's "
                    "objects all go to its own namespace (leave metadata.namespace out)"
                )
        items.append(item)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def dry_run_entry(job: dict[str, Any]) -> dict[str, Any]:
    """``{"gpujob", "podSets": [{"name", "count", "gpusPerPod"}], "gpus"}`` of one GPUJob,
    checked as the hub's intake checks it; raises ``ValueError`` (pydantic's, or
    :class:`~gpufed.api.errors.FieldError` naming the GPUJob field)."""
    model = GPUJob.model_validate(job)
    model.metadata.uid = model.metadata.uid or "dry-run"
    request = placement_request(model, submitted_at=0.0)
    meta = job["metadata"]
    prepare_manifests(
        model.spec.template,
        job_uid="dry-run",
        job_name=meta["name"],
        namespace=meta["namespace"],
        origin="dry-run",
    )
    pod_sets = [
        {"name": ps.name, "count": ps.count, "gpusPerPod": ps.gpus_per_pod}
        for ps in request.pod_sets
    ]
    return {"gpujob": job, "podSets": pod_sets, "gpus": sum(ps.gpus for ps in request.pod_sets)}


def _summary(entry: dict[str, Any]) -> str:
    sets = ", ".join(f"{p['name']} {p['count']}x{p['gpusPerPod']}" for p in entry["podSets"])
    return f"pod sets {sets}; {entry['gpus']} GPUs"


def _dry_namespace(namespace: str | None, kubeconfig: Path | None, context: str | None) -> str:
    if namespace:
        return namespace
    try:
        return kube.resolve(kubeconfig, context).namespace
    except Exception:  # no kubeconfig is fine for a dry run: nothing is sent anywhere
        return "default"


def submit(
    files: Annotated[
        list[Path],
        typer.Option("--filename", "-f", help="YAML/JSON file, directory, or '-' (stdin)"),
    ],
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    namespace: Namespace = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="follow the jobs until they end (exit 1 if any fails)")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="check and print what would be created; send nothing")
    ] = False,
    out: Output = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=0, help="with --wait: seconds (0: no limit)")
    ] = 0.0,
) -> None:
    """Submit GPUJobs, or plain Job/JobSet/PyTorchJob/RayJob/MPIJob files (wrapped), to the hub."""
    from kubernetes.client.exceptions import ApiException

    fmt = output_format(out, False)
    if fmt not in ("table", "json", "yaml"):
        raise typer.BadParameter("submit prints json or yaml", param_hint="'-o' / '--output'")
    if dry_run and wait:
        raise typer.BadParameter("--dry-run creates nothing to wait for", param_hint="--wait")
    ns = _dry_namespace(namespace, kubeconfig, context) if dry_run else None
    kube_client = None if dry_run else _Kube(kubeconfig, context)
    ns = ns or namespace or (kube_client.namespace if kube_client else "default")
    try:
        jobs = [j for source, docs in read_sources(files) for j in gpujobs_of(source, docs, ns)]
    except SubmitError as exc:
        _fail(str(exc))
    entries = []
    for job in jobs:  # every job is checked before any is created
        key = f"{job['metadata']['namespace']}/{job['metadata'].get('name')}"
        try:
            entries.append(dry_run_entry(job))
        except ValueError as exc:
            _fail(f"{key}: {_validation_text(exc)}")
    if kube_client is not None:
        for entry in entries:
            meta = entry["gpujob"]["metadata"]
            try:
                with _reachable(kube_client):
                    # Strict: a misspelt field (spec.placment) is refused, not silently dropped
                    # (the job would run without the constraint the user meant).
                    entry["gpujob"] = kube_client.custom.create_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        meta["namespace"],
                        "gpujobs",
                        entry["gpujob"],
                        field_validation="Strict",
                    )
            except ApiException as exc:
                hint = (
                    f" (create it on the hub cluster: `kubectl create namespace "
                    f"{meta['namespace']}`, or submit to another with -n)"
                    if exc.status == 404 and "namespaces" in _api_message(exc)
                    else ""
                )
                _fail(f"{meta['namespace']}/{meta['name']}: {_api_message(exc)}{hint}")
            if fmt == "table":
                typer.echo(
                    f"gpujob.{GROUP}/{meta['name']} created (namespace {meta['namespace']}): "
                    f"{_summary(entry)}"
                )
    elif fmt == "table":
        for entry in entries:
            meta = entry["gpujob"]["metadata"]
            typer.echo(
                f"gpujob.{GROUP}/{meta['name']} would be created (namespace "
                f"{meta['namespace']}, dry run): {_summary(entry)}"
            )
    if fmt == "json":
        typer.echo(json.dumps(entries))
    elif fmt == "yaml":
        typer.echo(yaml.safe_dump(entries, sort_keys=False).rstrip("\n"))
    if wait and kube_client is not None:
        keys = [
            (e["gpujob"]["metadata"]["namespace"], e["gpujob"]["metadata"]["name"]) for e in entries
        ]
        raise typer.Exit(follow.wait_for_jobs(kube_client, keys, timeout_s=timeout_s))


def _validation_text(exc: ValueError) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        return f"{loc}: {str(err['msg']).removeprefix('Value error, ')}"
    return str(exc)
