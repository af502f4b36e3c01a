"""gpufed.sandbox: the local multi-cluster sandbox (building and running real control planes,
kwok GPU nodes from a fleet spec, kind provider). Imports only ``gpufed.api``.

Modules: :mod:`~gpufed.sandbox.binaries` (build/locate etcd, kube-*, kwok; ``ensure_binaries``),
:mod:`~gpufed.sandbox.supervisor` (named components as processes), :mod:`~gpufed.sandbox.runtime`
(``Sandbox``, ``SandboxInfo``), :mod:`~gpufed.sandbox.inventory` (GPU inventory read from Nodes),
:mod:`~gpufed.sandbox.kube` (clients per kubeconfig context), :mod:`~gpufed.sandbox.pki`,
:mod:`~gpufed.sandbox.kind`, :mod:`~gpufed.sandbox.bench`. See docs/sandbox.md.
"""
