"""The one exception tree (gpufed.api.errors): every error class of the project has the root,
transient and permanent errors sit where the edges expect them, and every bad-input error of
the (field, message) shape is a FieldError that names its field."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any

import pytest

from gpufed.api.errors import (
    MAX_ERROR_CHARS,
    FieldError,
    GpufedError,
    PermanentError,
    TransientError,
)

PACKAGES = (
    "gpufed.api",
    "gpufed.placement",
    "gpufed.sync",
    "gpufed.hub",
    "gpufed.agent",
    "gpufed.sandbox",
    "gpufed.cli",
    "gpufed.console",
)
#: Private control flow that never leaves its module (api/errors.py says why they stay out).
OUTSIDE_THE_TREE = {
    "gpufed.api.fleetcheck._IssuesError",
    "gpufed.cli.output._GoneError",
    "gpufed.console.server._NeedsLogin",
}


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a gpufed module, by ``module.Name``."""
    found: dict[str, type[BaseException]] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == info.name
                ):
                    found[f"{info.name}.{name}"] = obj
    return found


def test_every_exception_class_of_the_project_has_the_one_root() -> None:
    classes = exception_classes()
    assert len(classes) >= 30  # the walk found the project, not an empty package
    unrooted = {name for name, cls in classes.items() if not issubclass(cls, GpufedError)}
    assert unrooted == OUTSIDE_THE_TREE


TRANSIENT = {
    "gpufed.agent.hub_stream.HubUnavailableError",
    "gpufed.hub.adapters.store.StoreUnavailableError",
    "gpufed.console.reader.HubReadError",
}
PERMANENT = {
    "gpufed.api.errors.FieldError",
    "gpufed.api.fleetcheck.FleetError",
    "gpufed.api.gpus.UnknownGPUError",
    "gpufed.api.kubeconfig.KubeconfigError",
    "gpufed.api.protocol.codec.ProtocolError",
    "gpufed.api.queue.QueueFileError",
    "gpufed.api.resources.QuantityError",
    "gpufed.placement.sim.trace.TraceError",
    "gpufed.placement.sim.simreport.IntervalFileError",
    "gpufed.sync.apply.ManifestRefusedError",
    "gpufed.agent.kube.KindNotServedError",
    "gpufed.hub.adapters.store.NotLeaderError",
    "gpufed.cli.output.SelectorError",
    "gpufed.cli.submit.SubmitError",
    "gpufed.console.callers.TokenRefused",
}


def test_transient_and_permanent_errors_are_exactly_these() -> None:
    classes = exception_classes()
    transient = {n for n, c in classes.items() if issubclass(c, TransientError)}
    permanent = {n for n, c in classes.items() if issubclass(c, PermanentError)}
    assert transient - {"gpufed.api.errors.TransientError"} == TRANSIENT
    assert permanent - {"gpufed.api.errors.PermanentError"} == PERMANENT
    assert not transient & permanent


def test_errors_keep_the_built_in_base_callers_catch_them_by() -> None:
    classes = exception_classes()
    for name in PERMANENT - {
        "gpufed.agent.kube.KindNotServedError",
        "gpufed.hub.adapters.store.NotLeaderError",
        "gpufed.console.callers.TokenRefused",  # a plain Exception before the root
    }:
        assert issubclass(classes[name], ValueError), name
    assert issubclass(classes["gpufed.agent.kube.KindNotServedError"], LookupError)
    assert issubclass(classes["gpufed.agent.hub_stream.HubUnavailableError"], ConnectionError)
    assert issubclass(classes["gpufed.hub.adapters.store.NotLeaderError"], RuntimeError)


def test_a_field_error_names_its_field_and_says_what_is_wrong() -> None:
    err = FieldError("spec.template.kind", "is required (for example Job)")
    assert (err.field, err.message) == ("spec.template.kind", "is required (for example Job)")
    assert str(err) == "spec.template.kind: is required (for example Job)"
    assert isinstance(err, ValueError)
    assert isinstance(err, PermanentError)


def test_a_field_error_clips_what_quotes_tenant_input() -> None:
    err = FieldError("x" * 10_000, "y" * 100_000)
    assert len(err.field) <= 256
    assert len(err.message) <= MAX_ERROR_CHARS
    assert err.message.endswith("(100000 characters)")


# --- every bad-input error of the (field, message) shape is a FieldError naming its field ---


def _job(template: dict[str, Any], **placement: Any) -> Any:
    from gpufed.api.gpujob import GPUJob

    spec: dict[str, Any] = {"template": template}
    if placement:
        spec["placement"] = placement
    return GPUJob.model_validate(
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "GPUJob",
            "metadata": {"name": "j", "namespace": "team-a", "uid": "u-1"},
            "spec": spec,
        }
    )


def _batch_job(**extra: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", **extra},
        "spec": {"template": {"spec": {"containers": [container]}}},
    }


def _too_deep() -> None:
    from gpufed.api.bounds import measure

    value: Any = 1
    for _ in range(100):
        value = [value]
    measure({"spec": value}, field="spec.template")


def _no_pods() -> None:
    from gpufed.hub.rules.podsets import derive_pod_sets

    job = _batch_job()
    job["spec"]["parallelism"] = 0
    derive_pod_sets(job)


def _foreign_namespace() -> None:
    from gpufed.sync.manifests import prepare_manifests

    prepare_manifests(
        _batch_job(namespace="kube-system"),
        job_uid="u-1",
        job_name="j",
        namespace="team-a",
        origin="hub",
    )


def _empty_list() -> None:
    from gpufed.sync.manifests import template_objects

    template_objects({"apiVersion": "v1", "kind": "List", "items": []})


def _unknown_gpu() -> None:
    from gpufed.hub.rules.podsets import placement_request

    placement_request(_job(_batch_job(), gpuProducts=["H999"]), submitted_at=0.0)


def _wrap_without_name() -> None:
    from gpufed.cli.jobs import wrap

    wrap({"apiVersion": "batch/v1", "kind": "Job", "metadata": {}, "spec": {}}, "team-a")


@pytest.mark.parametrize(
    ("raise_it", "field"),
    [
        (_too_deep, "spec.template.spec"),  # api/bounds.py (was BoundsError)
        (_no_pods, "spec.template"),  # hub/rules/podsets.py (was InvalidJobError)
        (_foreign_namespace, "spec.template.metadata.namespace"),  # sync (was ManifestError)
        (_empty_list, "spec.template.items"),  # sync/workloads.py (was ManifestError)
        (_unknown_gpu, "spec.placement.gpuProducts[0]"),  # hub/rules/podsets.py
        (_wrap_without_name, "metadata.name"),  # gpufed submit's wrap
    ],
)
def test_bad_input_is_a_field_error_naming_its_field(
    raise_it: Callable[[], None], field: str
) -> None:
    with pytest.raises(FieldError) as err:
        raise_it()
    assert err.value.field.startswith(field)
    assert str(err.value) == f"{err.value.field}: {err.value.message}"
    assert err.value.message
