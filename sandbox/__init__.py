"""gpufed.sandbox: the local multi-cluster sandbox (building and running real control planes,
kwok GPU nodes from a fleet spec, kind provider). Imports only ``gpufed.api``.

Modules: :mod:`~gpufed.sandbox.binaries` (build/locate etcd, kube-*, kwok; ``ensure_binaries``),
:mod:`~gpufed.sandbox.supervisor` (named components as processes), :mod:`~gpufed.sandbox.runtime`
(``Sandbox``: up, status, down), :mod:`~gpufed.sandbox.components` (each process's command
line), :mod:`~gpufed.sandbox.scheduler` (the one kube-scheduler configuration),
:mod:`~gpufed.sandbox.nodes` (the fleet's Node objects), :mod:`~gpufed.sandbox.state`
(``SandboxInfo``, kubeconfigs, ``SandboxError``), :mod:`~gpufed.sandbox.controlplane` (hub and
agents), :mod:`~gpufed.sandbox.inventory` (GPU inventory read from Nodes),
:mod:`~gpufed.sandbox.kube` (clients per kubeconfig context), :mod:`~gpufed.sandbox.pki`,
:mod:`~gpufed.sandbox.kind`, :mod:`~gpufed.sandbox.bench`. See docs/sandbox.md.
"""
