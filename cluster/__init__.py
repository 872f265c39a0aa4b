"""The one gateway to Kubernetes. Nothing else imports the kubernetes client.

Raw API objects are turned into plain dicts or our own dataclasses here, every call has an explicit
timeout, and failures surface as the few typed errors in cluster.errors, each naming namespace/name.
"""
