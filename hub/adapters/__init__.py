"""The term's ports (Protocols) and what implements them: etcd, hub API, agent streams."""
